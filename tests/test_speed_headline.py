"""
bench.py --headline (issue 37 item 3, issue 44 item 2, issue 47 class 6): its rehearsal on the
CPU, `--headline --device=cpu --quick`, runs every section's code path at the tiniest shapes, the
Triton rows interpreted, in order of value (the target rows of every section, then the rest);
the headline is a fresh report (what its JSON held goes to history); every row is in the JSON
the moment it is measured (the JSON is read while the command runs, and the command is then
killed as a device kills one at its limit: the rows are there, and no section is left running);
the next command runs what is missing, keeping the rest, and names the commit given even where
git does not hold it; after Ctrl-C or SIGTERM the message prints the command that measures only
what is missing, and that command does. results/render.py renders the headline's JSON, the
per-kernel table included. The launches are matched to kernels.triton_tssa.launch_plan() by
name. The plan (--plan_from) from the committed H200 report fits every target row in 540 s.

The rehearsal runs as a subprocess that starts with the session (tests/background.py).

    python -m pytest -q tests/test_speed_headline.py          # ~2-3 min on two busy cores
"""

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import background  # noqa: E402
import bench  # noqa: E402
from nanotost import cli  # noqa: E402
from results import speed_tables  # noqa: E402
from results.benchkit import headline, kernel_times, order, plan  # noqa: E402
from results.benchkit.part import row_key  # noqa: E402
from results.benchkit.meta import source_digest  # noqa: E402

TINY = ["--T=32", "--model_T=16", "--decode_T=8", "--main_iters=2", "--repeats=1", "--train_tokens=16",
        "--decode_steps=2"]
FAKE_COMMIT = "0123456789" * 4  # well formed, and no commit of this repository: a stale .git's case
WORK = os.path.join(background.SCRATCH, "headline")
SIGNALS = ("SIGINT", "SIGTERM")  # Ctrl-C, and how a scheduler or `kill` ends a command
# The job: (A) a fresh headline rehearsal into a folder holding an earlier headline, its main_job
# hung after one row (NANOTOST_BENCH_HANG=main_job:1); the JSON read every 0.2 s while it runs, and
# the command killed (SIGKILL) once main_job's first row is in the JSON; (B) a next command, for
# main_job, train and decode (which hangs: cut at its --section_s limit of 6 s), NANOTOST_COMMIT set;
# (C) for each of SIGNALS: a headline of decode hung after its eleventh row (one measured), the
# signal sent, then the command its message prints, run as printed.
SCRIPT = r"""
import ctypes, json, os, shlex, shutil, signal, subprocess, sys, time
repo, work, tiny, fake, signals = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], sys.argv[5:]
sys.path.insert(0, repo)
from results.benchkit.meta import source_digest
from results.benchkit.keeper import is_running
from results.benchkit.report import REPORT_SCHEMA
out = os.path.join(work, "out")
os.makedirs(out)
path = os.path.join(out, "cpu-headline.json")
earlier = dict(section="op", status="ok", source_sha256=source_digest(), device="cpu", marker="earlier",
               rows=[dict(impl="torch", B=1, T=32, status="ok", ms=1.0)])
with open(path, "w") as f:  # a headline measured before, by this very code: a fresh one takes none of it
    json.dump(dict(schema=REPORT_SCHEMA, meta=dict(slug="cpu", quick=True, name="cpu", plan="headline"),
                   runs=[dict(argv=["earlier"])], sections=dict(op=earlier)), f)


sys.path.insert(0, os.path.join(repo, "tests"))
from helpers_signals import default_signals as signals_at_default


def default_signals():  # the child dies with this job, and starts with the signals' defaults, as from a terminal
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    signals_at_default()


def start(argv, env, log, where=out, command=None):
    command = command or [sys.executable, "bench.py", "--headline", "--device=cpu", "--quick", f"--out={where}/"] + \
        tiny + argv
    logs = os.path.join(work, log)
    return subprocess.Popen(command, cwd=repo, env=dict(os.environ, PYTHONUNBUFFERED="1", **env),
                            preexec_fn=default_signals,
                            stdout=open(logs, "w"), stderr=open(logs + ".err", "w"))


def read(where):
    with open(where) as f:
        return json.load(f)  # valid at every moment


watch = dict(in_flight=[])
p = start([], dict(NANOTOST_BENCH_HANG="main_job:1"), "a.log")
deadline, part = time.time() + 500, {}
while time.time() < deadline and p.poll() is None:
    data = read(path)
    watch["in_flight"].append([[n, len(s["rows"])] for n, s in data["sections"].items() if s["status"] == "running"])
    part = data["sections"].get("main_job", {})
    if part.get("status") == "running" and part["rows"]:
        break
    time.sleep(0.2)
watch["ended_by_itself"] = p.poll() is not None
p.kill()  # as a device ends a command at its limit: nothing written after
p.wait()
t0 = time.time()
while part.get("pid") and is_running(part["pid"]) and time.time() - t0 < 240:  # (a loaded machine's time)
    time.sleep(0.2)
watch["section_gone_s"] = None if part.get("pid") and is_running(part["pid"]) else round(time.time() - t0, 1)
watch["files"] = sorted(os.listdir(out))
shutil.copy(path, os.path.join(work, "a.json"))
p = start(["--sections=decode,main_job,train", "--budget_s=300", "--section_s=decode:6"],
          dict(NANOTOST_BENCH_HANG="decode", NANOTOST_COMMIT=fake), "b.log")
watch["b_code"] = p.wait(timeout=400)
shutil.copy(path, os.path.join(work, "b.json"))
for sig in signals:
    where = os.path.join(work, "cut-" + sig)
    os.makedirs(where)
    cut = os.path.join(where, "cpu-headline.json")
    p = start(["--sections=decode"], dict(NANOTOST_BENCH_HANG="decode:11"), sig + ".log", where)
    deadline = time.time() + 200
    while time.time() < deadline and p.poll() is None:
        if os.path.isfile(cut) and len(read(cut)["sections"].get("decode", {}).get("rows", [])) >= 11:
            break
        time.sleep(0.2)
    p.send_signal(getattr(signal, sig))
    watch[sig] = dict(code=p.wait(timeout=60))
    shutil.copy(cut, os.path.join(work, sig + "-cut.json"))
    with open(os.path.join(work, sig + ".log.err")) as f:
        said = f.read()
    watch[sig]["said"] = said
    printed = said.partition("this command measures what is missing: ")[2].strip()
    watch[sig]["printed"] = printed
    if printed.startswith("python bench.py "):
        p = start([], {}, sig + "-next.log", command=[sys.executable] + shlex.split(printed)[1:])
        watch[sig]["next_code"] = p.wait(timeout=200)
        shutil.copy(cut, os.path.join(work, sig + "-next.json"))
with open(os.path.join(work, "watch.json"), "w") as f:
    json.dump(watch, f)
"""
USES_JOB = {"test_the_rehearsal_runs_every_section_fresh_and_the_triton_rows_interpreted",
            "test_each_triton_launch_is_set_beside_the_plan",
            "test_every_row_is_in_the_json_as_it_is_measured_and_a_killed_command_leaves_none_running",
            "test_the_next_command_runs_what_is_undone_keeps_the_rest_and_names_the_given_commit",
            "test_after_a_signal_the_printed_command_measures_only_what_is_missing",
            "test_the_tables_render_from_a_headline"}


def start_job():
    os.makedirs(WORK, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env.pop("NANOTOST_BENCH_HANG", None)
    env.pop("NANOTOST_COMMIT", None)
    background.start("headline rehearsal", [sys.executable, "-c", SCRIPT, REPO, WORK, json.dumps(TINY), FAKE_COMMIT,
                                            *SIGNALS],
                     env=env, cwd=REPO, nice=13)  # behind the interpreter run (test_kernels.py waits for it earlier)


start_in_background = background.when_chosen(USES_JOB, start_job)  # (with the session, beside the other tests)


@pytest.fixture(scope="module")
def job():
    start_job()  # a no-op where the session started it already
    proc = background.wait("headline rehearsal", timeout=900)
    logs = {}
    for name in sorted(os.listdir(WORK)) if os.path.isdir(WORK) else ():
        if name.endswith((".log", ".err")):
            with open(os.path.join(WORK, name)) as f:
                logs[name] = f.read()
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(text[-2000:] for text in logs.values())
    got = dict(logs)
    for name in os.listdir(WORK):
        if name.endswith(".json"):
            with open(os.path.join(WORK, name)) as f:
                got[name] = json.load(f)
    return got


def by_tier(section, rows):
    """{tier: [statuses]} of a section's rows."""
    got = {}
    for r in rows:
        got.setdefault(order.tier(section, r), []).append(r["status"])
    return got


def test_the_rehearsal_runs_every_section_fresh_and_the_triton_rows_interpreted(job):
    """(A), killed in main_job's target stage (the fourth, after the operator's rows and its
    launches): the sections before it measured their target rows, in order of value, the rest
    waiting for their stage, said so; train and decode not yet begun."""
    a = job["a.json"]
    digest = source_digest()
    assert list(a["sections"]) == ["meta", "gpu_check_accuracy", "op", "kernel_times", "main_job"]
    meta = a["meta"]
    assert (meta["plan"], meta["quick"], meta["triton_interpret"], meta["source_sha256"]) == ("headline", True, True,
                                                                                             digest)
    assert meta["commit_check"]  # how the commit was found, said
    # fresh: the earlier headline's op (this very code's) went to history, and op was measured anew
    assert [h["marker"] for h in a["history"]] == ["earlier"] and "marker" not in a["sections"]["op"]
    for name, s in a["sections"].items():
        assert (s["source_sha256"], s["device"]) == (digest, "cpu"), name
    status = {n: s["status"] for n, s in a["sections"].items()}
    assert status == dict(meta="ok", gpu_check_accuracy="skipped", op="partial", kernel_times="ok",
                          main_job="running")  # (main_job: hung after its first row, then killed)
    assert a["runs"][-1]["sections"] == ["gpu_check_accuracy", "op", "kernel_times", "main_job"]
    rows = a["sections"]["op"]["rows"]  # the rest waits for its stage, after every section's targets
    assert "ok" not in by_tier("op", rows)[order.EXTRA] and "not_run" in by_tier("op", rows)[order.EXTRA]
    assert all(r["reason"] == order.LATER for r in rows if r["status"] == "not_run"), rows
    assert "not_run" not in by_tier("op", rows)[order.TARGET]
    op = {(r["impl"], r["B"], r["T"]): r for r in a["sections"]["op"]["rows"]}
    assert {(B, T) for _, B, T in op} == {(1, 32), (4, 32)}
    for (impl, B, T), r in op.items():  # (both Triton implementations interpreted)
        want = "skipped" if impl in ("compiled", "sdpa_flash", "sdpa_cudnn") else "not_run" if impl == "torch" else "ok"
        assert r["status"] == want, r
        assert r["status"] != "ok" or r["row_s"] >= 0  # (what it cost: the next plan's estimate)
    assert {impl for impl, _, _ in op} >= {"triton", "triton_retiled"}
    first = a["sections"]["main_job"]["rows"][0]
    assert (first["arch"], first["impl"]) == ("tost", "triton") and first["tokens_per_s"] > 0
    assert "--tssa_impl=triton" in first["command"] and first["first_iter_s"] > 0


def test_each_triton_launch_is_set_beside_the_plan(job):
    """kernel_times: every launch of launch_plan(), in its order, matched to a launch that ran
    (interpreted: the code path, not a speed), with its bytes, TB/s and modelled time."""
    from kernels.triton_tssa import launch_plan
    rows = job["a.json"]["sections"]["kernel_times"]["rows"]
    assert [(r["B"], r["T"], r["status"]) for r in rows] == [(1, 32, "ok"), (4, 32, "ok")]
    for r in rows:
        plan = launch_plan(r["B"], 2, r["T"], 16, causal=True)
        launches = r["launches"]
        assert [launch["kernel"] for launch in launches] == [launch["kernel"] for launch in plan]
        for launch in launches:
            assert "unmatched" not in launch and launch["gpu_us"] > 0 and launch["modelled_us"] > 0, launch
            assert launch["tbps"] == pytest.approx((launch["read"] + launch["write"]) / launch["gpu_us"] / 1e6)
        assert r["gpu_ms"] == pytest.approx(sum(launch["gpu_us"] for launch in launches) / 1e3)


def test_every_row_is_in_the_json_as_it_is_measured_and_a_killed_command_leaves_none_running(job):
    watch = job["watch.json"]
    assert not watch["ended_by_itself"]
    assert ["main_job", 1] in [x for seen in watch["in_flight"] for x in seen]  # a row of the section in flight
    assert watch["section_gone_s"] is not None  # the hung section ended itself, after the kill (unfixed: never)
    assert watch["files"] == [".cpu-headline.json.lock", "cpu-headline.json"]  # (a device returns at most 8)


def test_the_next_command_runs_what_is_undone_keeps_the_rest_and_names_the_given_commit(job):
    a, b, printed = job["a.json"], job["b.json"], job["b.log"]
    assert job["watch.json"]["b_code"] == 0, printed[-3000:] + job["b.log.err"][-2000:]
    meta = b["meta"]
    assert (meta["commit"], meta["commit_from"]) == (FAKE_COMMIT, "NANOTOST_COMMIT")
    assert meta["commit_check"].startswith("UNVERIFIED")  # a .git that does not hold it stops nothing
    for name in ("gpu_check_accuracy", "op", "kernel_times"):  # not named: kept as measured
        assert b["sections"][name] == a["sections"][name], name
    decode = b["sections"]["decode"]  # hung before its first row: cut at its limit
    assert decode["status"] == "timed_out" and decode["rows"] == []
    jobs = b["sections"]["main_job"]["rows"]
    assert b["sections"]["main_job"]["status"] == "ok"
    assert [(r["arch"], r.get("impl"), r.get("mode")) for r in jobs] == [
        ("tost", "triton", None), ("tost", "triton", "cuda_graphs"), ("gpt2", None, None), ("tost", "auto", None)]
    assert jobs[0]["kept_from"] == a["sections"]["main_job"]["started"]
    assert jobs[1]["status"] == "skipped" and "CUDA graph needs CUDA" in jobs[1]["reason"]
    assert all("kept_from" not in r for r in jobs[1:])
    assert "run on CUDA, this is a cpu device" in jobs[3]["tssa_fallback"]  # auto on a CPU: the reference, said
    train = b["sections"]["train"]  # measured now, in the order of value: the pair, then auto, with what auto said
    assert train["status"] == "ok" and not any(r.get("kept_from") for r in train["rows"])
    assert [(r["arch"], r.get("impl"), r["status"]) for r in train["rows"]] == [
        ("gpt2", None, "skipped"), ("gpt2", None, "ok"), ("tost", "triton", "ok"), ("tost", "auto", "ok")]
    auto = train["rows"][3]
    assert "tssa_impl='auto'" in auto["auto_said"]
    assert len(b["runs"]) == 3 and b["runs"][-1]["sections"] == ["main_job", "train", "decode"]
    assert "[decode: target rows]" in printed and "[decode] timed_out in" in printed
    assert "not done: decode." in printed
    lines = [line for line in printed.splitlines() if line.startswith(f"NANOTOST_COMMIT={FAKE_COMMIT} python bench.py")]
    assert len(lines) == 1 and lines[0].split()[2:5] == ["bench.py", "--headline", "--sections=decode"], lines


@pytest.mark.parametrize("sig", SIGNALS)
def test_after_a_signal_the_printed_command_measures_only_what_is_missing(job, sig):
    """Issue 47, class 6: a headline stopped by a signal says which command measures what is
    missing (not 'the same command', which would start a fresh headline), and that command, run
    as printed, keeps every row measured and measures the rest."""
    watch = job["watch.json"][sig]
    assert watch["code"] == 130, watch
    assert watch["said"].startswith("bench.py: interrupted; "), watch["said"]
    printed = shlex.split(watch["printed"])
    assert printed[:4] == ["python", "bench.py", "--headline", "--sections=decode"], printed
    assert not any(a.startswith(("--remeasure", "--budget_s=0")) for a in printed)
    cut, after = job[sig + "-cut.json"]["sections"]["decode"], job[sig + "-next.json"]["sections"]["decode"]
    assert cut["status"] == "interrupted" and "the command printed measures the rest" in cut["reason"]
    measured = [r for r in cut["rows"] if r["status"] == "ok"]
    assert len(measured) == 1 and measured[0]["impl"] == "triton"  # (the eleventh row: the first measured)
    assert watch["next_code"] == 0 and after["status"] == "ok"
    again = {row_key(r): r for r in after["rows"]}
    kept = again[row_key(measured[0])]
    assert kept["kept_from"] == cut["started"] and kept["ms"] == measured[0]["ms"]  # kept, not measured again
    fresh = [r for r in after["rows"] if r["status"] == "ok" and r is not kept]
    assert {(r["arch"], r.get("impl")) for r in fresh} == {("gpt2", None), ("tost", "torch")}
    assert not any("kept_from" in r for r in fresh)
    assert job[sig + "-next.json"]["runs"][-1]["sections"] == ["decode"]


def test_the_tables_render_from_a_headline(job, tmp_path):
    path = tmp_path / "headline.json"
    path.write_text(json.dumps(job["b.json"]))
    shown = subprocess.run([sys.executable, os.path.join(REPO, "results", "render.py"), "--show=gpu_*",
                            f"--json_path={path}"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "| B=1, T=32 |" in text and "ToST-Base `auto`" in text and "ToST-Base `triton`" in text and "`_k_" in text
    assert "Section `gpu_check_determinism`" not in text  # (a section of --report only: not named)
    # committed as results/nvidia-h200.json: every table of that file renders from it
    data = dict(job["b.json"], meta=dict(job["b.json"]["meta"], gpu="NVIDIA H200", name="NVIDIA H200", quick=False))
    from results import efficiency
    tables = dict(speed_tables.TABLES, **efficiency.TABLES)
    for name, (json_path, fn) in tables.items():
        if json_path == speed_tables.REPORT:
            assert fn(data).strip(), name
    assert efficiency.efficiency_points(data)
    assert "- a training step of 16 tokens" in speed_tables.table_gpu_summary(data)


def test_launches_are_matched_to_the_plan_by_name_and_order():
    plan = [dict(kernel="a", read=100, write=100), dict(kernel="b", read=10, write=0), dict(kernel="a", read=50, write=50),
            dict(kernel="c", read=1, write=1)]
    # two calls: a, b, a each, plus a kernel the plan does not name; "c" never ran
    events = [("a", 0, 2e-6), ("b", 1, 1e-6), ("a", 2, 4e-6), ("zero", 3, 5e-6),
              ("a", 10, 2e-6), ("b", 11, 3e-6), ("a", 12, 4e-6), ("zero", 13, 5e-6)]
    launches, others = kernel_times.per_launch(plan, events, calls=2, modelled_time_s=lambda launch: 1e-6)
    assert [launch["launch"] for launch in launches] == [0, 1, 2, 3]
    assert [launch["gpu_us"] for launch in launches][:3] == pytest.approx([2.0, 2.0, 4.0])  # medians over the calls
    assert launches[0]["tbps"] == pytest.approx(200 / 2e-6 / 1e12) and launches[2]["x_model"] == pytest.approx(4.0)
    assert launches[3]["gpu_us"] is None and "seen 0 times in 2 calls" in launches[3]["unmatched"]
    assert others == [["zero", 1.0, pytest.approx(5e-3)]]
    # seen more often than the plan says: no time is made up
    launches, _ = kernel_times.per_launch(plan[:2], events + [("b", 20, 1e-6)], calls=2, modelled_time_s=lambda x: 1e-6)
    assert launches[1]["gpu_us"] is None and "seen 3 times" in launches[1]["unmatched"]


H200 = os.path.join(REPO, "results", "nvidia-h200.json")
TARGETS = ([("gpu_check_accuracy", "mode=accuracy")]  # the order of value (issue 52, item 4)
           + [("op", f"impl={impl} B={B} T={T}") for B, T in ((1, 16384), (16, 1024), (1, 65536))
              for impl in ("triton", "triton_retiled", "sdpa_flash", "sdpa_cudnn")]
           + [("kernel_times", f"impl=triton B={B} T={T}") for B, T in ((1, 16384), (16, 1024), (1, 65536))]
           + [("main_job", "arch=tost impl=triton"), ("main_job", "arch=tost impl=triton mode=cuda_graphs"),
              ("main_job", "arch=gpt2")]
           + [("train", what) for T, B in ((4096, 16), (16384, 4), (65536, 1))
              for what in (f"arch=gpt2 backend=cudnn B={B} T={T}", f"arch=tost impl=triton B={B} T={T}")]
           + [("decode", f"{what} mode={mode} B=1 T={T}") for mode in ("captured", "compiled") for T in (1024, 65536)
              for what in ("arch=tost impl=triton", "arch=gpt2")])
NEVER_MEASURED = {("op", f"impl=triton_retiled B={B} T={T}") for B, T in ((1, 16384), (16, 1024), (1, 65536))} | {
    ("main_job", "arch=tost impl=triton mode=cuda_graphs")}  # (issue 52's new rows: from their nearest, said how)


def plan_of(argv, tmp_path, monkeypatch):
    """bench.py --headline --plan_from=... as the command line runs it, in this process, from an
    empty folder: (what it returned, what it printed); it writes nothing."""
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        got = cli.run_cli(bench.main, ["--headline", f"--plan_from={H200}"] + argv)
    assert os.listdir(tmp_path) == []  # nothing measured, nothing written
    return got, out.getvalue()


def test_the_plan_from_the_h200_report_fits_every_target_row_in_the_window(tmp_path, monkeypatch):
    """The committed H200 report's recorded costs (its rows' first calls, compiles and ms; a row
    it never measured derived from the nearest one, said how): every target row, in the order of
    value, fits in the default 540 s; the rest follows."""
    got, printed = plan_of([], tmp_path, monkeypatch)
    rows = got["rows"]
    assert printed.rstrip().splitlines()[-1] == f"fits: {len(TARGETS)} of {len(TARGETS)} target rows"
    target = [r for r in rows if r[1] == order.TARGET]
    assert [(name, plan.describe(key)) for name, _, key, *_ in target] == TARGETS
    assert rows[:len(target)] == target  # targets first, then the rest
    for name, stage, key, seconds, how, fits, left in target:
        assert seconds is not None and seconds > 0 and fits and left >= 0, (name, key, how)
    how = {(name, plan.describe(key)): how for name, _, key, _, how, *_ in rows}
    # the report of 88ecccebc71c measured every target row it had (its own cost, row_s); the rows
    # added since, and auto's training rows past 4K, come from the nearest row that ran, and say so
    assert all(how[key].startswith("measured") for key in TARGETS[1:] if key not in NEVER_MEASURED), how
    assert all(how[key].startswith("from ") and "never measured itself" in how[key] or "from the main job" in how[key]
               for key in NEVER_MEASURED), [how[key] for key in NEVER_MEASURED]
    assert how[("main_job", "arch=tost impl=triton")].startswith("measured: train.py")
    assert how[("train", "arch=tost impl=auto B=4 T=16384")].startswith("from T=4096's row")
    assert how[("train", "arch=tost impl=auto B=1 T=65536")].startswith("from T=4096's row")
    extra = [r for r in rows if r[1] == order.EXTRA]
    assert {r[0] for r in extra} == {"op", "train", "decode", "main_job"}
    assert any(r[2].get("impl") == "auto" for r in extra) and any(r[2].get("impl") == "compiled" for r in extra)
    assert sum(r[3] for r in target) < headline.BUDGET_S - plan.MARGIN_S


def without_rows(tmp_path, prefixes):
    """The committed H200 report with no rows (now or in its history) in the sections whose names
    begin with one of `prefixes` ("" for every section): what a run knows nothing of."""
    with open(H200, encoding="utf-8") as f:
        data = json.load(f)
    for name, part in data["sections"].items():
        if name.startswith(prefixes):
            part["rows"] = []
    data["history"] = [h for h in data.get("history") or [] if not str(h.get("section")).startswith(prefixes)]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("prefixes", [("",), ("op",), ("train", "decode"), ("main_job",)])
def test_a_row_of_unknown_cost_is_named_and_never_counted_as_fitting(prefixes, tmp_path, monkeypatch):
    """A report that lacks rows (no report of this GPU yet, a section never measured): the rows
    nothing prices are marked '?', never counted in `fits: N of M target rows`, and named on that
    line (it said "fits: 29 of 29" with 28 unknown)."""
    report = without_rows(tmp_path, prefixes)
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        got = cli.run_cli(bench.main, ["--headline", f"--plan_from={report}"])
    target = [r for r in got["rows"] if r[1] == order.TARGET]
    unknown = [r for r in target if r[3] is None]
    assert unknown and all(r[0].startswith(prefixes) for r in unknown), [r[0] for r in unknown]
    assert got["fit"] == sum(1 for r in target if r[3] is not None and r[5]) <= len(target) - len(unknown)
    last = out.getvalue().rstrip().splitlines()[-1]
    assert last.startswith(f"fits: {got['fit']} of {len(target)} target rows; {len(unknown)} of unknown cost, not "
                           "counted: "), last
    assert f"{unknown[0][0]} {plan.describe(unknown[0][2])}" in last and len(last) < 400, last


def test_each_row_is_judged_by_its_own_cost_not_by_the_longest_before_it(tmp_path, monkeypatch):
    """A shorter deadline: a row that does not fit is passed over, and a cheaper row after it
    still runs (no rule tied to the longest row of a section); the last line counts them."""
    def passed_over_then_fits(fits):
        return any(not a and b for i, a in enumerate(fits) for b in fits[i + 1:])

    for budget in range(150, headline.BUDGET_S, 5):  # the shorter deadlines, until one passes a row over
        got, printed = plan_of([f"--budget_s={budget}"], tmp_path, monkeypatch)
        target = [r for r in got["rows"] if r[1] == order.TARGET]
        fits = [r[5] for r in target]
        assert 0 < sum(fits) <= len(target)
        if passed_over_then_fits(fits):
            break
    assert passed_over_then_fits(fits), "no deadline passes a row over and fits a cheaper one after it"
    assert printed.rstrip().splitlines()[-1] == f"fits: {sum(fits)} of {len(target)} target rows"
    for r in target:  # a row fits when its estimate (and the process start, and 3 s) fit in what was left
        assert r[6] >= 0



def test_the_model_is_asked_for_this_gpu_where_it_has_its_figures():
    module = SimpleNamespace(COPY_RATE={"h200": 4e12, "h100": 3e12})
    assert kernel_times.model_gpu(module, "NVIDIA H200") == "h200"
    assert kernel_times.model_gpu(module, "NVIDIA H100 80GB HBM3") == "h100"
    assert kernel_times.model_gpu(module, "NVIDIA A100-SXM4-80GB") is None  # the model's default
    assert kernel_times.model_gpu(SimpleNamespace(), "NVIDIA H200") is None  # a model without per-GPU figures
