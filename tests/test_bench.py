"""
bench.py --report on the CPU (issue 25 item 4): a quick report at the tiniest shapes runs every
section in its own process and merges them into one JSON; the rows a CPU cannot run (Triton,
FlashAttention-2, cuDNN, CUDA graphs, gpu_check) are rows saying why; a section that hangs is
stopped at its limit and recorded as timed out while the next section still runs; a second run
runs only what is missing; results/render.py renders SPEED.md's GPU tables from the JSON (and
bench.py prints them at the end of the run).
Ratios read the way they are worded (issue 26).

    python -m pytest -q tests/test_bench.py          # ~20 s on two cores
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import background  # noqa: E402
import bench  # noqa: E402
from nanotost import atomic, cli  # noqa: E402
from results import render  # noqa: E402
from results import speed_tables  # noqa: E402
from results.benchkit import headline, main_job, meta as bench_meta, part as bench_part, report, suites, timing  # noqa: E402
from test_errors import refused  # noqa: E402

SCRIPT_RENDER = "results/render.py"

TINIEST = ["--report=1", "--device=cpu", "--quick=1", "--T=32", "--model_T=16", "--decode_T=8", "--main_iters=2"]


def run_report(argv, env=None):
    """bench.main(argv) in this process as the command line runs it (cli.run_cli): (exit code or
    message, what the parent printed). The sections' processes print to the real stdout."""
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()) as out:
        mp.setattr(sys, "argv", ["bench.py"])
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        try:
            cli.run_cli(bench.main, list(argv))
            code = 0
        except SystemExit as e:
            code = e.code
    return code, out.getvalue()


HUNG = os.path.join(background.SCRATCH, "hung_report", "report.json")
USES_HUNG = {"test_every_section_is_recorded_and_a_hung_one_times_out_while_the_next_runs",
             "test_the_rows_a_cpu_cannot_run_say_why", "test_a_named_section_runs_again_and_the_rest_is_kept",
             "test_the_tables_render_from_the_report"}


def start_hung_report():
    """bench.py as the command line runs it, in the background (its sections start an
    interpreter each, and decode waits out its limit: ~20 s the foreground need not wait)."""
    os.makedirs(os.path.dirname(HUNG), exist_ok=True)
    background.start("hung report", [sys.executable, os.path.join(REPO, "bench.py"), *TINIEST, f"--out={HUNG}",
                                     "--section_s=decode:2"], env=dict(os.environ, NANOTOST_BENCH_HANG="decode"),
                     cwd=REPO)


start_in_background = background.when_chosen(USES_HUNG, start_hung_report)  # (with the session, beside the other tests)


@pytest.fixture(scope="module")
def hung_report():
    """One quick report of every section in which `decode` hangs (stopped at its 2 s limit)."""
    start_hung_report()  # a no-op where the session started it already
    proc = background.succeeded("hung report", timeout=600)
    with open(HUNG) as f:
        return dict(data=json.load(f), stdout=proc.stdout, out=HUNG)


def test_every_section_is_recorded_and_a_hung_one_times_out_while_the_next_runs(hung_report):
    data = hung_report["data"]
    assert data["schema"] == report.REPORT_SCHEMA
    assert list(data["sections"]) == list(report.SECTIONS)
    meta = data["meta"]
    for key in ("name", "date", "torch", "triton", "cudnn", "cuda", "driver", "commit", "source_sha256", "slug"):
        assert key in meta, key
    assert meta["name"] == "cpu" and meta["quick"] is True and meta["source_sha256"] == bench_meta.source_digest()
    s = data["sections"]
    # decode hung: stopped at its limit, recorded; train_tost, after it, still ran
    assert s["decode"]["status"] == "timed_out" and s["decode"]["limit_s"] == 2
    assert "time limit of 2 s" in s["decode"]["reason"]
    assert s["train_tost"]["status"] == "ok" and all(r["status"] == "ok" for r in s["train_tost"]["rows"])
    jobs = s["main_job"]["rows"]  # ToST's job (tssa_impl="auto": the reference here, said) and GPT-2's beside it
    assert [(r["arch"], r.get("impl"), r["config"], r["status"]) for r in jobs] == [
        ("tost", "auto", "config/tost_owt.py", "ok"), ("gpt2", None, "config/gpt2_owt.py", "ok")]
    for job in jobs:
        assert job["tokens_per_s"] > 0 and job["iters_logged"] == 2 and job["tokens_per_iter"] == 64
        assert "profile" not in job  # a GPU's rows only
    assert "--tssa_impl=auto" in jobs[0]["command"] and "tssa_impl" not in jobs[1]["command"]
    assert "run on CUDA, this is a cpu device" in jobs[0]["tssa_fallback"] and jobs[1]["tssa_fallback"] is None
    assert "synthetic" in s["main_job"]["data"]
    for name, part in s.items():
        assert part["status"] in ("ok", "skipped", "timed_out"), (name, part)
        for r in part["rows"]:
            assert r["status"] in ("ok", "skipped"), (name, r)
            if r["status"] == "ok" and name != "main_job":
                assert r["ms"] > 0 and len(r["ms_all"]) == 3
    assert "[decode] timed_out" in hung_report["stdout"] and "timed out or failed: decode" in hung_report["stdout"]


def test_the_rows_a_cpu_cannot_run_say_why(hung_report):
    s = hung_report["data"]["sections"]
    op = {(r["impl"], r["B"], r["T"]): r for r in s["op"]["rows"]}
    assert {impl for impl, _, _ in op} == {"cpu", "torch", "sdpa", "triton", "triton_retiled", "compiled", "sdpa_flash",
                                           "sdpa_cudnn"}
    assert {(B, T) for _, B, T in op} == {(1, 32), (4, 32)}
    for impl, word in (("triton", "CUDA"), ("triton_retiled", "CUDA"), ("compiled", "CUDA"),
                       ("sdpa_flash", "FlashAttention-2"),
                       ("sdpa_cudnn", "cuDNN")):
        assert op[(impl, 1, 32)]["status"] == "skipped" and word in op[(impl, 1, 32)]["reason"]
    for impl in ("cpu", "torch", "sdpa"):
        assert op[(impl, 1, 32)]["status"] == "ok" and op[(impl, 1, 32)].get("gpu_ms") is None
    for name, word in (("gpu_check_accuracy", "CUDA GPU"), ("gpu_check_determinism", "CUDA GPU"),
                       ("train_gpt2_cudnn", "cuDNN"), ("train_tost_triton", "Triton")):
        assert s[name]["status"] == "skipped" and word in s[name]["reason"], name
    flash = s["train_gpt2_flash"]["rows"]
    assert [(r["backend"], r["status"]) for r in flash] == [("flash", "skipped"), ("default", "ok")]


def test_a_named_section_runs_again_and_the_rest_is_kept(hung_report):
    before = hung_report["data"]
    code, out = run_report(TINIEST + [f"--out={hung_report['out']}", "--sections=decode"])
    assert code == 0, out
    with open(hung_report["out"]) as f:
        after = json.load(f)
    assert after["sections"]["decode"]["status"] == "ok"  # the section that hung, run again
    rows = {(r["arch"], r.get("impl"), r["mode"]): r for r in after["sections"]["decode"]["rows"]}
    assert len(rows) == 9 and {r["T"] for r in rows.values()} == {8}  # ToST torch, triton; GPT-2: 3 modes each
    assert {k for k, r in rows.items() if r["status"] == "ok"} == {("tost", "torch", "eager"), ("gpt2", None, "eager")}
    for (arch, impl, mode), r in rows.items():  # what a CPU cannot run says why
        if r["status"] != "ok":
            assert r["status"] == "skipped" and ("CUDA" in r["reason"]), r
    for name in ("op", "train_tost", "main_job"):  # kept as they were
        assert after["sections"][name] == before["sections"][name], name
    assert len(after["runs"]) == 2 and after["runs"][1]["sections"] == ["decode"]
    # sections=all runs only what is not done: here nothing (but the meta section, every time)
    code, out = run_report(TINIEST + [f"--out={hung_report['out']}"])
    assert code == 0 and "[op] kept from" in out and "not complete" not in out, out
    with open(hung_report["out"]) as f:
        assert json.load(f)["runs"][2]["sections"] == []


def test_the_tables_render_from_the_report(hung_report):
    shown = subprocess.run([sys.executable, os.path.join(REPO, "results", "render.py"), "--show=gpu_*",
                            f"--json_path={hung_report['out']}"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert re.findall(r"^## (\S+)$", text, re.M) == [n for n in render.registry()[0] if n.startswith("gpu_")]
    assert "| B=1, T=32 |" in text and "FlashAttention-2 is a CUDA kernel" in text
    assert "Section `gpu_check_accuracy` was skipped" in text and "n/a (a quick report)" in text
    # bench.py --report printed the same tables at the end of its run
    assert "## gpu_op" in hung_report["stdout"] and "| B=1, T=32 |" in hung_report["stdout"]
    assert "results/render.py failed" not in hung_report["stdout"]


def test_settings_are_checked_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for argv, words in ((["--sections=op,nope"], "sections: unknown 'nope'"),
                        (["--section_s=op:x"], "section_s must be seconds"),
                        (["--section_s=nope:3"], "section_s: unknown 'nope'"),
                        (["--budget_s=-1"], "budget_s must not be negative")):
        code, _ = run_report(["--report=1", "--device=cpu"] + argv)
        assert isinstance(code, str) and code.startswith("bench.py: ") and words in code, (argv, code)
    assert os.listdir(tmp_path) == []


def test_another_devices_report_is_not_overwritten(tmp_path):
    path = tmp_path / "r.json"
    h100 = dict(slug="nvidia-h100-80gb-hbm3", quick=False, name="NVIDIA H100 80GB HBM3")
    path.write_text(json.dumps(dict(schema=report.REPORT_SCHEMA, meta=h100, runs=[], sections={})))
    with pytest.raises(cli.UserError, match="NVIDIA H100.*choose another --out"):
        report.load_report(str(path), dict(slug="cpu", quick=True, name="cpu"))
    assert report.load_report(str(path), h100)["meta"] == h100  # the same device continues it
    assert report.report_out(SimpleNamespace(out="results/", quick=False), dict(h100, gpu="x")) == \
        os.path.join("results", "nvidia-h100-80gb-hbm3.json")  # the committed report: only when named
    for quick, gpu, where in ((False, "x", "nvidia-h100-80gb-hbm3.json"),  # never results/ (committed) unless named
                              (True, "x", "nvidia-h100-80gb-hbm3-quick.json"), (False, None, "cpu-report.json")):
        assert report.report_out(SimpleNamespace(out="auto", quick=quick), dict(h100, gpu=gpu)) == \
            os.path.join("out-bench", where)


def test_ratios_read_the_way_they_are_worded():
    for words in (suites.ratio_words, speed_tables.ratio_words):
        assert words(1.0, 3.3, "SDPA") == "3.3x faster than SDPA"
        assert words(3.3, 1.0, "SDPA") == "3.3x slower than SDPA"
        assert words(1.0, 1.02, "SDPA") == "as fast as SDPA"


def test_device_activity_sums_kernels_from_profiler_events():
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def ev(i, name, us, dev=DeviceType.CUDA):
        return FunctionEvent(id=i, name=name, thread=0, start_us=10 * i, end_us=10 * i + us, device_type=dev)
    events = [ev(0, "aten::mm", 5, DeviceType.CPU), ev(1, "gemm", 4), ev(2, "gemm", 4), ev(3, "flash_fwd", 2),
              ev(4, "Memset (Device)", 1)]
    got = timing.device_activity(events, calls=2)
    assert got["gpu_ms"] == pytest.approx(11 / 1e3 / 2) and got["kernels"] == 1.5 and got["memops"] == 0.5
    assert got["top_kernels"][0] == ["gemm", 1.0, pytest.approx(4 / 1e3)]
    assert timing.attention_ran(got["top_kernels"]) == "flash"
    assert timing.attention_ran([["cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 1, 1]]) == "cudnn"
    assert bench_meta.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_kernel_shares_tell_the_kinds_of_kernels_by_name():
    us = [("triton_red_fused_cumsum_mul_0", 30.0), ("_k_pi", 10.0), ("sm90_xmma_gemm_bf16bf16", 40.0),
          ("triton_per_fused__log_softmax_nll_loss_1", 12.0), ("flash_fwd_kernel", 5.0), ("triton_poi_fused_add_2", 3.0)]
    got = main_job.kernel_shares(us, calls=2)
    assert got["gpu_ms"] == pytest.approx(100 / 1e3 / 2)
    assert got["shares"] == dict(tssa=0.4, attention=0.05, loss=0.12, matmuls=0.4, rest=0.03)
    assert got["top_kernels"][0] == ["sm90_xmma_gemm_bf16bf16", pytest.approx(40 / 1e3 / 2)]


def test_a_section_run_again_keeps_the_rows_of_the_same_code_unless_remeasured():
    meta = dict(source_sha256="abc", slug="cpu")
    old = dict(status="timed_out", source_sha256="abc", rows=[dict(impl="torch", B=1, T=8, status="ok", ms=1.0)])
    keep = SimpleNamespace(remeasure=False)
    assert report.rows_to_keep(keep, old, meta) is old  # named or cut: its measured rows are kept
    assert report.rows_to_keep(keep, dict(old, source_sha256="other"), meta) is None  # other code: all again
    assert report.rows_to_keep(keep, dict(old, device="nvidia-h200"), meta) is None  # another device: all again
    assert report.rows_to_keep(SimpleNamespace(remeasure=True), old, meta) is None
    assert report.rows_to_keep(keep, None, meta) is None


def test_the_commit_named_by_the_environment_wins_over_a_copys_git(monkeypatch):
    C = SimpleNamespace(device="cpu", dtype="float32", quick=True, headline=False)
    earlier = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert len(earlier) == 40  # a commit of this repository other than the checkout's
    monkeypatch.setenv("NANOTOST_COMMIT", earlier)
    meta = bench_meta.collect_meta(C)
    same = bench_meta.source_digest(earlier) == meta["source_sha256"]  # checked against the code, git holding it
    assert meta["commit_check"].startswith("its code is the code here" if same else "DIFFERS"), meta["commit_check"]
    if same:
        assert (meta["commit"], meta["commit_from"]) == (earlier, "NANOTOST_COMMIT")
    else:  # other code: never recorded as the commit measured (issue 47, class 7)
        assert (meta["commit"], meta["commit_given"]) == (None, earlier)
    monkeypatch.delenv("NANOTOST_COMMIT")
    meta = bench_meta.collect_meta(C)
    assert meta["commit_from"] in ("git", "source_sha256") and meta["commit"] != earlier


def test_a_section_cut_by_budget_keeps_its_measured_rows(tmp_path):
    C = SimpleNamespace(device="cpu", quick=True)
    old = [dict(arch="tost", impl="torch", T=16, B=8, status="ok", ms=1.0), dict(arch="tost", impl="torch", T=32, B=4,
                                                                                 status="not_run", reason="time")]
    S = bench_part.Part("train_tost", str(tmp_path / "part.json"), C, 60, old)
    S.previous_started = "earlier"
    kept = S.attempt(dict(arch="tost", impl="torch", T=16, B=8), lambda: pytest.fail("measured again"))
    assert kept["ms"] == 1.0 and kept["kept_from"] == "earlier"
    assert S.attempt(dict(arch="tost", impl="torch", T=32, B=4), lambda: dict(ms=2.0))["ms"] == 2.0
    late = bench_part.Part("op", str(tmp_path / "late.json"), C, -1)  # no time left: a row that says so
    assert late.attempt(dict(impl="torch", B=1, T=8), lambda: pytest.fail("ran"))["status"] == "not_run"
    with open(tmp_path / "part.json") as f:
        assert [r["ms"] for r in json.load(f)["rows"]] == [1.0, 2.0]  # written as it goes


def test_a_section_measured_by_other_code_or_elsewhere_is_measured_again_and_kept_as_history(tmp_path):
    """Issue 37 item 4: --report (sections=all) takes a section as done only when this code
    (source_sha256) measured it on this device; anything else is measured again, and what it
    held is moved to the JSON's history, never shown as current."""
    digest = bench_meta.source_digest()
    now = dict(status="ok", source_sha256=digest, device="cpu", rows=[dict(impl="torch", B=1, T=8, status="ok",
                                                                           ms=1.0)])
    sections = {name: dict(now, section=name) for name in report.SECTIONS if name != "meta"}
    sections["gpu_check_accuracy"] = dict(now, section="gpu_check_accuracy", source_sha256="0123456789abcdef")
    sections["gpu_check_determinism"] = dict(now, section="gpu_check_determinism", device="nvidia-h200")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(schema=report.REPORT_SCHEMA, meta=dict(slug="cpu", quick=True, name="cpu"),
                                    runs=[], sections=sections)))
    code, out = run_report(TINIEST + [f"--out={path}"])
    assert code == 0, out
    after = json.loads(path.read_text())
    for name in ("gpu_check_accuracy", "gpu_check_determinism"):  # measured again: skipped on a CPU, by this code
        part = after["sections"][name]
        assert (part["status"], part["source_sha256"], part["device"]) == ("skipped", digest, "cpu"), part
        assert f"[{name}] kept from" not in out
    assert [(h["section"], h["rows"]) for h in after["history"]] == [
        ("gpu_check_accuracy", now["rows"]), ("gpu_check_determinism", now["rows"])]
    for name in ("op", "decode", "train_tost", "main_job"):  # this code, this device: done, kept
        assert after["sections"][name]["rows"] == now["rows"] and f"[{name}] kept from" in out, name
    assert after["runs"][-1]["sections"] == ["gpu_check_accuracy", "gpu_check_determinism"]


def git(where, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=where, check=True,
                          capture_output=True, text=True).stdout.strip()


def committed(where, names):
    """A repository at `where` of one commit holding the files `names` (each "# <name>"): its hash."""
    for name in names:
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(f"# {name}\n")
    git(where, "init", "-q")
    git(where, "add", "-A")
    git(where, "commit", "-qm", "one")
    return git(where, "rev-parse", "HEAD")


def test_the_digest_names_the_code_at_a_commit_and_a_stale_git_names_no_commit(tmp_path, monkeypatch):
    """source_digest(commit) reads the code from git: the same hex as the tree's where the code
    is the same. A .git whose HEAD holds other code (a stale copy) names no commit; NANOTOST_COMMIT
    that git does not hold is recorded, said to be unverified, and stops nothing."""
    head = committed(tmp_path, ("model.py", "results/benchkit/a.py", "kernels/k.py", "kernels/k.c", "kernels/notes.md"))
    tree = bench_meta.source_digest(root=str(tmp_path))
    assert bench_meta.source_digest(head, root=str(tmp_path)) == tree
    assert bench_meta.name_commit(str(tmp_path), tree)["commit"] == head
    (tmp_path / "kernels" / "notes.md").write_text("not code the figures depend on\n")
    assert bench_meta.source_digest(root=str(tmp_path)) == tree
    (tmp_path / "results" / "benchkit" / "a.py").write_text("# the benchmark's own code counts\n")
    assert bench_meta.source_digest(root=str(tmp_path)) != tree
    (tmp_path / "results" / "benchkit" / "a.py").write_text("# results/benchkit/a.py\n")
    (tmp_path / "kernels" / "k.py").write_text("# changed\n")  # the tree is not HEAD's code any more
    changed = bench_meta.source_digest(root=str(tmp_path))
    assert changed != tree
    got = bench_meta.name_commit(str(tmp_path), changed)
    assert (got["commit"], got["commit_from"], got["git_head"]) == (None, "source_sha256", head)
    monkeypatch.setenv("NANOTOST_COMMIT", "0123456789" * 4)  # no commit git holds here
    got = bench_meta.name_commit(str(tmp_path), changed)
    assert (got["commit"], got["commit_from"]) == ("0123456789" * 4, "NANOTOST_COMMIT")
    assert got["commit_check"].startswith("UNVERIFIED")
    monkeypatch.setenv("NANOTOST_COMMIT", head)  # git holds it, and its code is not this
    got = bench_meta.name_commit(str(tmp_path), changed)
    assert got["commit_check"].startswith("DIFFERS") and got["commit"] is None
    monkeypatch.delenv("NANOTOST_COMMIT")
    gitless = tmp_path / "copy"
    gitless.mkdir()
    assert bench_meta.name_commit(str(gitless), changed)["commit_from"] == "source_sha256"


# -----------------------------------------------------------------------------
# issue 47, class 7: a commit found to be other code is never recorded as the commit measured


def two_commits(where):
    """A repository of two commits whose code differs (first, second), its tree at the second."""
    first = committed(where, ("model.py", "results/benchkit/a.py", "kernels/k.py", "notes.md"))
    (where / "kernels" / "k.py").write_text("# the second commit's kernels\n")
    git(where, "commit", "-qam", "two")
    return first, git(where, "rev-parse", "HEAD")


# member: (NANOTOST_COMMIT: "first", "FIRST" (upper case), "second", "unknown" or None; the file changed in
# the tree after the second commit, or None; the commit recorded: "first", "second", "unknown" or None)
COMMITS = {
    "NANOTOST_COMMIT names an older commit (other code)": ("first", None, None),
    "the same, in upper case": ("FIRST", None, None),
    "NANOTOST_COMMIT names HEAD, and the tree's code changed since": ("second", "kernels/k.py", None),
    "no NANOTOST_COMMIT, HEAD's code is not the tree's (a stale .git)": (None, "results/benchkit/a.py", None),
    "NANOTOST_COMMIT names HEAD, the tree changed outside the code": ("second", "notes.md", "second"),
    "NANOTOST_COMMIT names HEAD, the same code": ("second", None, "second"),
    "NANOTOST_COMMIT that this .git does not hold (unverified)": ("unknown", None, "unknown"),
    "no NANOTOST_COMMIT, HEAD is the code": (None, None, "second"),
}


@pytest.mark.parametrize("case", sorted(COMMITS))
def test_a_commit_found_to_be_other_code_is_never_recorded_as_the_commit_measured(case, tmp_path, monkeypatch):
    given, changed, recorded = COMMITS[case]
    first, second = two_commits(tmp_path)
    commits = dict(first=first, FIRST=first.upper(), second=second, unknown="0123456789" * 4)
    if changed:
        (tmp_path / changed).write_text("# changed after the commit\n")
    monkeypatch.delenv("NANOTOST_COMMIT", raising=False)
    if given:
        monkeypatch.setenv("NANOTOST_COMMIT", commits[given])
    got = bench_meta.name_commit(str(tmp_path), bench_meta.source_digest(root=str(tmp_path)))
    assert got["commit"] == (commits[recorded].lower() if recorded else None), got
    if recorded is None:  # said, and what was given (or git's HEAD) kept beside it, not as the commit
        assert got["commit_check"].startswith("DIFFERS") or "holds other code" in got["commit_check"], got
        assert got.get("commit_given", got.get("git_head")) in (first, second)


def test_a_report_under_a_commit_of_other_code_stamps_no_row_with_it(tmp_path):
    """Through bench.py itself: NANOTOST_COMMIT naming this repository's first commit (other code),
    every part and the run record no commit; the headline's next command does not repeat it."""
    root = git(REPO, "rev-list", "--max-parents=0", "HEAD").split()[0]
    if bench_meta.source_digest(root) == bench_meta.source_digest():
        pytest.skip("a clone without history: its first commit is this code")
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "bench.py", "--report", "--device=cpu", "--quick", f"--out={out}",
                           "--sections=gpu_check_accuracy"], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, NANOTOST_COMMIT=root))  # (a process of its own: the sections'
    assert done.returncode == 0, done.stderr[-3000:]                     # server starts with this environment)
    printed = done.stdout
    data = json.loads(out.read_text())
    assert (data["meta"]["commit"], data["meta"]["commit_given"]) == (None, root)
    assert data["meta"]["commit_check"].startswith("DIFFERS")
    assert [p["commit"] for p in data["sections"].values() if "commit" in p] == [None, None]  # meta, gpu_check
    assert data["runs"][-1]["commit"] is None and root not in printed.split("DIFFERS")[0]
    C = SimpleNamespace(argv=["--headline=1", "--out=x/"])
    assert not headline.next_command(C, data["meta"], ["op"]).startswith("NANOTOST_COMMIT")
    assert headline.next_command(C, dict(commit=root, commit_from="NANOTOST_COMMIT"), ["op"]).startswith(
        f"NANOTOST_COMMIT={root} python bench.py --headline --sections=op")


# -----------------------------------------------------------------------------
# issue 47, class 8: a NaN or infinite figure is refused wherever a report is read, and measured again

# member: (the row's identifying fields, its field made not finite, as written in the JSON; None: the
# row of the part in the JSON's history)
NON_FINITE = {
    "ms NaN": (dict(impl="cpu", B=1, T=32), "ms", "NaN"),
    "first_call_s Infinity": (dict(impl="torch", B=1, T=32), "first_call_s", "Infinity"),
    "peak_mb -Infinity": (dict(impl="sdpa", B=1, T=32), "peak_mb", "-Infinity"),
    "a repeat's ms 1e999 (in a list)": (dict(impl="cpu", B=4, T=32), "ms_all", "1e999"),
    "a row of the history": (dict(impl="torch", B=1, T=32), "ms", "NaN"),
}
FINITE_ROW = dict(impl="sdpa", B=4, T=32)  # measured by this code here: kept as it is


def report_with(members):
    """JSON text of a quick CPU report whose op part (this code, this device) holds a row with a
    non-finite figure for each member, one finite row, and a part in its history."""
    digest = bench_meta.source_digest()
    rows, history = [dict(FINITE_ROW, status="ok", ms=1.0, ms_all=[1.0], first_call_s=0.1, peak_mb=1.0)], []
    for name in members:
        key, field, _ = NON_FINITE[name]
        row = dict(key, status="ok", ms=1.0, ms_all=[1.0, 1.0], first_call_s=0.1, peak_mb=1.0)
        row[field] = [1.0, f"@{name}@"] if field == "ms_all" else f"@{name}@"
        (history if name == "a row of the history" else rows).append(row)
    part = dict(section="op", status="ok", source_sha256=digest, device="cpu", started="earlier", rows=rows)
    data = dict(schema=report.REPORT_SCHEMA, meta=dict(slug="cpu", quick=True, name="cpu", plan="report"), runs=[],
                sections=dict(op=part), history=[dict(part, rows=history, retired="before")] if history else [])
    text = json.dumps(data)
    for name in members:
        text = text.replace(f'"@{name}@"', NON_FINITE[name][2])
    return text


@pytest.fixture(scope="module")
def measured_again(tmp_path_factory):
    """The report holding every member, continued by bench.py --report --sections=op."""
    path = tmp_path_factory.mktemp("nan") / "r.json"
    path.write_text(report_with(sorted(NON_FINITE)))
    code, printed = run_report(["--report=1", "--device=cpu", "--quick=1", "--T=32", "--sections=op",
                                f"--out={path}"])
    assert code == 0, printed
    return json.loads(path.read_text()), printed, path


@pytest.mark.parametrize("member", sorted(NON_FINITE))
def test_a_non_finite_figure_is_refused_by_the_renderer_and_measured_again_by_the_runner(member, measured_again,
                                                                                         tmp_path):
    key, field, form = NON_FINITE[member]
    history = member == "a row of the history"
    alone = tmp_path / "alone.json"  # the renderer: the file refused, one line naming the field
    alone.write_text(report_with([member]))
    message = refused(SCRIPT_RENDER, "--show=gpu_op", f"--json_path={alone}", root=tmp_path)
    where = "history[0].rows[0]" if history else "sections.op.rows[1]"
    assert f"{where}.{field}" in message and "not a finite number" in message
    data, printed, path = measured_again  # the runner: refused in one line, that row measured again
    rows = [m for m in sorted(NON_FINITE) if m != "a row of the history"]
    where = "history[0].rows[0]" if history else f"sections.op.rows[{1 + rows.index(member)}]"
    assert f"{where}.{field}" in printed and "refused, and that row is measured again" in printed
    if member == "a row of the history":
        row = data["history"][0]["rows"][0]
        assert row["status"] == "not_run" and "refused on reading" in row["reason"]
    else:
        row = next(r for r in data["sections"]["op"]["rows"] if all(r.get(k) == v for k, v in key.items()))
        assert row["status"] == "ok" and "kept_from" not in row and atomic.non_finite(row) is None, row
    assert data["sections"]["op"]["status"] == "ok"
    kept = next(r for r in data["sections"]["op"]["rows"] if all(r.get(k) == v for k, v in FINITE_ROW.items()))
    assert (kept["ms"], kept["kept_from"]) == (1.0, "earlier")  # a finite row of this code: kept as it was
    shown = subprocess.run([sys.executable, os.path.join(REPO, "results", "render.py"), "--show=gpu_op",
                            f"--json_path={path}"], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr  # what the runner wrote, the renderer reads
