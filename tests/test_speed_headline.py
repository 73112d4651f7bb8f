"""
bench.py --headline (issue 37 item 3): its rehearsal on the CPU, `--headline --device=cpu
--quick`, runs every section's code path at the tiniest shapes, the Triton rows interpreted;
the headline is a fresh report (what its JSON held goes to history); every row is in the JSON
the moment it is measured (the JSON is read while the command runs, and the command is then
killed as a device kills one at its limit: the rows are there, and no section is left running);
the next command runs the sections left undone, keeping the rest, and names the commit given
even where git does not hold it. results/render.py renders the headline's JSON, the per-kernel
table included. The launches are matched to kernels.triton_tssa.launch_plan() by name.

The rehearsal runs as a subprocess that starts with the session (tests/background.py).

    python -m pytest -q tests/test_speed_headline.py          # ~1-2 min on two busy cores
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "results"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import background  # noqa: E402
import speed_tables  # noqa: E402
from benchkit import headline, kernel_times  # noqa: E402
from benchkit.meta import source_digest  # noqa: E402

TINY = ["--T=32", "--model_T=16", "--decode_T=8", "--main_iters=2", "--repeats=1", "--train_tokens=16",
        "--decode_steps=2"]
FAKE_COMMIT = "0123456789" * 4  # well formed, and no commit of this repository: a stale .git's case
WORK = os.path.join(background.SCRATCH, "headline")
# The job: (A) a fresh headline rehearsal into a folder holding an earlier headline, its main_job
# hung after one row (NANOTOST_BENCH_HANG=main_job:1); the JSON read every 0.2 s while it runs, and
# the command killed (SIGKILL) once main_job's first row is in the JSON; (B) the next command, for
# decode (hung: cut at the end of its slot, 6-11 s) and main_job, with NANOTOST_COMMIT set.
SCRIPT = r"""
import ctypes, json, os, shutil, signal, subprocess, sys, time
repo, work, tiny, fake = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
sys.path.insert(0, repo)
from benchkit.meta import source_digest
from benchkit.keeper import is_running
from benchkit.report import REPORT_SCHEMA
out = os.path.join(work, "out")
os.makedirs(out)
path = os.path.join(out, "cpu-headline.json")
earlier = dict(section="op", status="ok", source_sha256=source_digest(), device="cpu", marker="earlier",
               rows=[dict(impl="torch", B=1, T=32, status="ok", ms=1.0)])
with open(path, "w") as f:  # a headline measured before, by this very code: a fresh one takes none of it
    json.dump(dict(schema=REPORT_SCHEMA, meta=dict(slug="cpu", quick=True, name="cpu", plan="headline"),
                   runs=[dict(argv=["earlier"])], sections=dict(op=earlier)), f)


def start(argv, env, log):
    return subprocess.Popen([sys.executable, "bench.py", "--headline", "--device=cpu", "--quick", f"--out={out}/"]
                            + tiny + argv, cwd=repo, env=dict(os.environ, PYTHONUNBUFFERED="1", **env),
                            stdout=open(os.path.join(work, log), "w"), stderr=subprocess.STDOUT,
                            preexec_fn=lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL))  # dies with this job


watch = dict(in_flight=[])
p = start([], dict(NANOTOST_BENCH_HANG="main_job:1"), "a.log")
deadline, part = time.time() + 500, {}
while time.time() < deadline and p.poll() is None:
    with open(path) as f:
        data = json.load(f)  # valid at every moment
    watch["in_flight"].append([[n, len(s["rows"])] for n, s in data["sections"].items() if s["status"] == "running"])
    part = data["sections"].get("main_job", {})
    if part.get("status") == "running" and part["rows"]:
        break
    time.sleep(0.2)
watch["ended_by_itself"] = p.poll() is not None
p.kill()  # as a device ends a command at its limit: nothing written after
p.wait()
t0 = time.time()
while part.get("pid") and is_running(part["pid"]) and time.time() - t0 < 60:
    time.sleep(0.2)
watch["section_gone_s"] = None if part.get("pid") and is_running(part["pid"]) else round(time.time() - t0, 1)
watch["files"] = sorted(os.listdir(out))
shutil.copy(path, os.path.join(work, "a.json"))
p = start(["--sections=decode,main_job", "--budget_s=150", "--section_s=decode:6,main_job:60"],
          dict(NANOTOST_BENCH_HANG="decode", NANOTOST_COMMIT=fake), "b.log")
watch["b_code"] = p.wait(timeout=400)
shutil.copy(path, os.path.join(work, "b.json"))
with open(os.path.join(work, "watch.json"), "w") as f:
    json.dump(watch, f)
"""
USES_JOB = {"test_the_rehearsal_runs_every_section_fresh_and_the_triton_rows_interpreted",
            "test_each_triton_launch_is_set_beside_the_plan",
            "test_every_row_is_in_the_json_as_it_is_measured_and_a_killed_command_leaves_none_running",
            "test_the_next_command_runs_what_is_undone_keeps_the_rest_and_names_the_given_commit",
            "test_the_tables_render_from_a_headline"}


def start_job():
    os.makedirs(WORK, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env.pop("NANOTOST_BENCH_HANG", None)
    env.pop("NANOTOST_COMMIT", None)
    background.start("headline rehearsal", [sys.executable, "-c", SCRIPT, REPO, WORK, json.dumps(TINY), FAKE_COMMIT],
                     env=env, cwd=REPO, nice=13)  # behind the interpreter run (test_kernels.py waits for it earlier)


start_in_background = background.when_chosen(USES_JOB, start_job)  # (with the session, beside the other tests)


@pytest.fixture(scope="module")
def job():
    start_job()  # a no-op where the session started it already
    proc = background.wait("headline rehearsal", timeout=900)
    logs = {}
    for name in ("a.log", "b.log"):
        if os.path.isfile(os.path.join(WORK, name)):
            with open(os.path.join(WORK, name)) as f:
                logs[name] = f.read()
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(text[-3000:] for text in logs.values())
    got = dict(logs)
    for name in ("a.json", "b.json", "watch.json"):
        with open(os.path.join(WORK, name)) as f:
            got[name] = json.load(f)
    return got


def test_the_rehearsal_runs_every_section_fresh_and_the_triton_rows_interpreted(job):
    a = job["a.json"]
    digest = source_digest()
    assert list(a["sections"]) == list(headline.HEADLINE)
    meta = a["meta"]
    assert (meta["plan"], meta["quick"], meta["triton_interpret"], meta["source_sha256"]) == ("headline", True, True,
                                                                                             digest)
    assert meta["commit_check"]  # how the commit was found, said
    # fresh: the earlier headline's op (this very code's) went to history, and op was measured anew
    assert [h["marker"] for h in a["history"]] == ["earlier"] and "marker" not in a["sections"]["op"]
    for name, s in a["sections"].items():
        assert (s["source_sha256"], s["device"]) == (digest, "cpu"), name
    status = {n: s["status"] for n, s in a["sections"].items()}
    assert status == dict(meta="ok", gpu_check_accuracy="skipped", op="ok", kernel_times="ok", train="ok", decode="ok",
                          main_job="running")  # (main_job: hung after its first row, then killed)
    op = {(r["impl"], r["B"], r["T"]): r for r in a["sections"]["op"]["rows"]}
    assert {(B, T) for _, B, T in op} == {(1, 32), (4, 32)}
    for (impl, B, T), r in op.items():
        assert r["status"] == ("skipped" if impl in ("compiled", "sdpa_flash", "sdpa_cudnn") else "ok"), r
    train = {(r["arch"], r.get("impl"), r.get("backend")): r for r in a["sections"]["train"]["rows"]}
    assert {k: r["status"] for k, r in train.items()} == {("tost", "auto", None): "ok", ("gpt2", None, "cudnn"): "skipped",
                                                          ("gpt2", None, "default"): "ok", ("tost", "triton", None): "ok"}
    assert "tssa_impl='auto'" in train[("tost", "auto", None)]["auto_said"]  # what auto said of its pick
    decode = {(r["arch"], r.get("impl"), r["mode"]): r["status"] for r in a["sections"]["decode"]["rows"]}
    assert decode[("tost", "triton", "eager")] == "ok" and decode[("tost", "triton", "captured")] == "skipped"
    assert {mode for (_, _, mode), st in decode.items() if st == "ok"} == {"eager"}
    assert a["sections"]["main_job"]["rows"][0]["arch"] == "tost" and a["sections"]["main_job"]["rows"][0][
        "tokens_per_s"] > 0


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
    assert watch["section_gone_s"] is not None and watch["section_gone_s"] < 30  # the hung section ended itself
    assert watch["files"] == [".cpu-headline.json.lock", "cpu-headline.json"]  # (a device returns at most 8)


def test_the_next_command_runs_what_is_undone_keeps_the_rest_and_names_the_given_commit(job):
    a, b, printed = job["a.json"], job["b.json"], job["b.log"]
    assert job["watch.json"]["b_code"] == 0, printed[-3000:]
    meta = b["meta"]
    assert (meta["commit"], meta["commit_from"]) == (FAKE_COMMIT, "NANOTOST_COMMIT")
    assert meta["commit_check"].startswith("UNVERIFIED")  # a .git that does not hold it stops nothing
    for name in ("gpu_check_accuracy", "op", "kernel_times", "train"):  # not named: kept as measured
        assert b["sections"][name] == a["sections"][name], name
    decode = b["sections"]["decode"]  # hung before its first row: cut at the end of its slot, its rows kept
    assert decode["status"] == "timed_out" and [r["T"] for r in decode["rows"]] == [
        r["T"] for r in a["sections"]["decode"]["rows"]]
    assert {r["kept_from"] for r in decode["rows"]} == {a["sections"]["decode"]["started"]}
    jobs = b["sections"]["main_job"]["rows"]
    assert b["sections"]["main_job"]["status"] == "ok" and [r["arch"] for r in jobs] == ["tost", "gpt2"]
    assert jobs[0]["kept_from"] == a["sections"]["main_job"]["started"] and "kept_from" not in jobs[1]
    assert len(b["runs"]) == 3 and b["runs"][-1]["sections"] == ["decode", "main_job"]
    assert "not done: decode." in printed
    lines = [line for line in printed.splitlines() if line.startswith(f"NANOTOST_COMMIT={FAKE_COMMIT} python bench.py")]
    assert len(lines) == 1 and lines[0].split()[2:5] == ["bench.py", "--headline", "--sections=decode"], lines


def test_the_tables_render_from_a_headline(job, tmp_path):
    path = tmp_path / "headline.json"
    path.write_text(json.dumps(job["b.json"]))
    shown = subprocess.run([sys.executable, os.path.join(REPO, "results", "render.py"), "--show=gpu_*",
                            f"--json_path={path}"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "| B=1, T=32 |" in text and "ToST-Base `auto`" in text and "`_k_" in text
    assert "Section `gpu_check_determinism`" not in text  # (a section of --report only: not named)
    # committed as results/nvidia-h200.json: every table of that file renders from it
    data = dict(job["b.json"], meta=dict(job["b.json"]["meta"], gpu="NVIDIA H200", name="NVIDIA H200", quick=False))
    import efficiency
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


def test_the_slots_fill_the_deadline_in_the_order_of_value():
    limits = {n: s.limit_s for n, s in headline.HEADLINE.items()}
    assert sum(limits.values()) + headline.MARGIN_S <= headline.BUDGET_S
    spent = limits["meta"]  # meta took all of its limit: the others get their shares exactly
    ends = headline.slots(headline.BUDGET_S - headline.MARGIN_S - spent, list(headline.HEADLINE), limits)
    assert list(ends) == [n for n in headline.HEADLINE if n != "meta"]
    assert ends["main_job"] == pytest.approx(headline.BUDGET_S - headline.MARGIN_S - spent)
    assert ends["op"] - ends["gpu_check_accuracy"] >= limits["op"]
    short = headline.slots(100, ["meta", "op", "train"], limits)  # the sections named, in the plan's order
    assert list(short) == ["op", "train"] and short["train"] == pytest.approx(100)
    assert short["op"] == pytest.approx(100 * limits["op"] / (limits["op"] + limits["train"]))


def test_the_model_is_asked_for_this_gpu_where_it_has_its_figures():
    module = SimpleNamespace(COPY_RATE={"h200": 4e12, "h100": 3e12})
    assert kernel_times.model_gpu(module, "NVIDIA H200") == "h200"
    assert kernel_times.model_gpu(module, "NVIDIA H100 80GB HBM3") == "h100"
    assert kernel_times.model_gpu(module, "NVIDIA A100-SXM4-80GB") is None  # the model's default
    assert kernel_times.model_gpu(SimpleNamespace(), "NVIDIA H200") is None  # a model without per-GPU figures
