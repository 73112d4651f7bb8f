"""
bench.py's report (issue 40 item 5), one test per class over its members:

  1. settings under which a section would run and record nothing are refused before any work,
     one line saying what to set: a main job all warm-up (--main_iters, quick or not, report or
     headline), a section's limit all start and reserve (--section_s, for every section or one,
     report or headline), a headline with no deadline to measure in (--budget_s=0 or below
     meta and the writes), a command of meta alone (issue 47, class 6)
  2. a section outlives nothing: whichever process dies with -9, the report (as a device ends a
     command at its limit) or the section (as the OOM killer ends one), the section, its keeper
     and the train.py it runs are gone within seconds; a report whose section was killed goes on

Class 2 is real processes (kill -9 is the point): two quick reports of main_job on the CPU, run
beside the rest of the suite (tests/background.py).

    python -m pytest -q tests/test_bench_faults.py
"""

import json
import os
import sys
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import background  # noqa: E402
import bench  # noqa: E402
from nanotost import cli  # noqa: E402
from results.benchkit import report, settings  # noqa: E402
from test_errors import refused  # noqa: E402

# -----------------------------------------------------------------------------
# 1. settings that cannot measure

UNMEASURABLE = {  # name -> (arguments, what the refusal says)
    "a quick report's main job of 1 iteration": (["--report", "--quick", "--main_iters=1"],
                                                  "give --main_iters=2 or more"),
    "the same, main_job named": (["--report", "--quick", "--main_iters=1", "--sections=op,main_job"],
                                 "give --main_iters=2 or more"),
    "a quick headline's main job of 1 iteration": (["--headline", "--quick", "--main_iters=1"],
                                                    "give --main_iters=2 or more"),
    "every section's limit all reserve": (["--report", "--section_s=15"], "give it more than 16 s"),
    "one section's limit all reserve": (["--report", "--sections=op,decode", "--section_s=decode:9"],
                                        "section_s gives decode 9 s"),
    "a quick section's limit shorter than its start": (["--report", "--quick", "--section_s=op:0.5"],
                                                       "give it more than 1 s"),
    # issue 47, class 6: the headline measures under a deadline
    "a headline with no deadline left (--budget_s=0)": (["--headline", "--budget_s=0"], "give --budget_s=90 or more"),
    "a headline's deadline shorter than meta and the writes": (["--headline", "--budget_s=60"], "give at least 90"),
    "a quick headline with no deadline": (["--headline", "--quick", "--budget_s=0"], "leaves the headline no time"),
    "a headline of meta alone": (["--headline", "--sections=meta"], "measures nothing"),
    "a report of meta alone": (["--report", "--sections=meta"], "measures nothing"),
    "a headline section's limit all start and reserve": (["--headline", "--section_s=op:3"],
                                                          "section_s gives op 3 s"),
}


@pytest.mark.parametrize("case", sorted(UNMEASURABLE))
def test_settings_under_which_a_section_measures_nothing_are_refused_before_any_work(case, tmp_path, monkeypatch):
    argv, words = UNMEASURABLE[case]
    monkeypatch.chdir(tmp_path)
    refused("bench.py", "--device=cpu", *argv, root=tmp_path, contains=[words])


@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize("iters", [1, 2, 3, 4, 8, 60, 200])
def test_only_a_main_job_left_nothing_after_its_warm_up_is_refused(iters, quick):
    """A quick run's main job leaves out iteration 0 (train.py logs 0..main_iters-1): 1 iteration
    is refused, 2 measure one (tests/test_bench.py's report runs 2); a full run leaves out a
    quarter, at most 20, and always keeps one. A report without the main job is not asked."""
    cfg = SimpleNamespace(**{**bench.DEFAULTS, "report": True, "quick": quick, "main_iters": iters, "out": "r.json"})
    if quick and iters == 1:
        with pytest.raises(cli.UserError, match="leaves the main job no iteration to measure"):
            settings.check_measurable(cfg, report.SECTIONS)
    else:
        settings.check_measurable(cfg, report.SECTIONS)
    cfg.sections = "op,decode"
    settings.check_measurable(cfg, report.SECTIONS)


# -----------------------------------------------------------------------------
# 2. a process of the report killed with -9

WORK = os.path.join(background.SCRATCH, "bench-kill")
SCRIPT = r"""
import ctypes, json, os, signal, subprocess, sys, threading, time
repo, work, GONE_S = sys.argv[1], sys.argv[2], float(sys.argv[3])
sys.path.insert(0, repo)
from results.benchkit.keeper import is_running


def ours(mark):
    # the running processes this member started (its mark in their environment): [(pid, command)]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"NANOTOST_TEST_MARK={mark}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if is_running(int(pid)):
            found.append((int(pid), command))
    return found


def part(out, name):
    # section `name` of the report at out as far as it is written (valid at every moment), or {}
    if not os.path.isfile(out):
        return {}
    with open(out) as f:
        return json.load(f)["sections"].get(name, {})


def wait(until, seconds):
    t0 = time.time()
    while not until() and time.time() - t0 < seconds:
        time.sleep(0.05)
    return round(time.time() - t0, 2) if until() else None


def member(dies, results):
    # a report of main_job (train.py running) then train_tost_triton (hung): `dies` killed in main_job
    out, log = os.path.join(work, dies + ".json"), open(os.path.join(work, dies + ".log"), "w")
    p = subprocess.Popen([sys.executable, "bench.py", "--report", "--device=cpu", "--quick",
                          "--sections=main_job,train_tost_triton", "--main_iters=1000000", f"--out={out}"], cwd=repo,
                         stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: ctypes.CDLL(None).prctl(1, 9),
                         env=dict(os.environ, NANOTOST_TEST_MARK=dies, NANOTOST_BENCH_HANG="train_tost_triton"))
    wait(lambda: p.poll() is not None or (part(out, "main_job").get("pid") and any(
        "train.py" in c for _, c in ours(dies))), 300)
    section, seen = part(out, "main_job")["pid"], [c for _, c in ours(dies)]
    os.kill(p.pid if dies == "report" else section, signal.SIGKILL)
    left = lambda: [c for pid, c in ours(dies) if pid == section or "train.py" in c]  # noqa: E731
    gone_s = wait(lambda: not left(), GONE_S)
    got = dict(seen=seen, gone_s=gone_s, left=left(), main_job=part(out, "main_job"))
    if dies == "section":  # the report goes on to the next section (hung), then is killed too
        got["next"] = wait(lambda: part(out, "train_tost_triton").get("pid"), GONE_S) is not None
        got["main_job"] = part(out, "main_job")
        os.kill(p.pid, signal.SIGKILL)
    got["code"] = p.wait(timeout=60)
    got["all_gone_s"] = wait(lambda: not ours(dies), GONE_S)  # the report and all it started
    got["after"] = [c for _, c in ours(dies)]
    results[dies] = got


results = {}
threads = [threading.Thread(target=member, args=(dies, results)) for dies in ("report", "section")]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(os.path.join(work, "results.json"), "w") as f:
    json.dump(results, f)
"""
USES_JOB = {"test_a_section_and_its_children_end_whichever_process_is_killed"}
GONE_S = 240  # what the job waits, from the kill, for every process to be gone (a loaded machine's time, not a bound)


def start_job():
    os.makedirs(WORK, exist_ok=True)
    env = dict(os.environ)
    env.pop("NANOTOST_BENCH_HANG", None)
    background.start("bench kill -9", [sys.executable, "-c", SCRIPT, REPO, WORK, str(GONE_S)], env=env, cwd=REPO)


start_in_background = background.when_chosen(USES_JOB, start_job)  # (with the session, beside the other tests)


@pytest.fixture(scope="module")
def killed():
    start_job()  # a no-op where the session started it already
    background.succeeded("bench kill -9", timeout=900)  # (two waits of GONE_S at most, beyond the runs)
    with open(os.path.join(WORK, "results.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("dies", ["report", "section"])
def test_a_section_and_its_children_end_whichever_process_is_killed(dies, killed):
    got = killed[dies]
    for what in ("train.py", "from results.benchkit.keeper import keep", "multiprocessing.forkserver"):
        assert any(what in c for c in got["seen"]), (what, got["seen"])  # (all there when it was killed)
    # gone, counted from the kill (0.2 s seen alone; much longer at load 10 on two cores, which starves this nice-10
    # job, whose /proc scans take the time: GONE_S allows that); unfixed, never: train.py runs for ever
    assert got["gone_s"] is not None, (got["gone_s"], got["left"])  # section, train.py
    if dies == "section":  # the report went on: the section recorded as failed, the next one started
        assert got["main_job"]["status"] == "failed" and "exit code -9" in got["main_job"]["reason"], got
        assert got["next"], got
    else:
        assert got["main_job"]["status"] == "running", got  # (nothing written after the kill)
    assert got["code"] == -9 and got["all_gone_s"] is not None, got["after"]
