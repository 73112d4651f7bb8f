"""
Issue 54, class 10: the suite's background jobs end with the suite however it ends, and leave
nothing behind. A session of pytest of its own (tests/conftest.py's hooks, tests/background.py)
starts a job that starts a child of its own, then is ended: by SIGTERM (a CI job's time limit),
by SIGINT (Ctrl-C), or killed outright (-9, as a crash). After pytest's end, every process of the
job is gone and so is the session's scratch folder (the jobs' results and temporary files), and
the reaper itself has ended. Checked as an order of events (each gone after pytest ended, waited
for as long as a loaded machine takes), never as seconds.

    python -m pytest -q tests/test_suite_ends.py
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TESTS))

from helpers_signals import default_signals  # noqa: E402
from nanotost import portable  # noqa: E402

MEMBER = '''
import json, os, subprocess, sys, time
import background

CHILD = ("import sys, time; from subprocess import Popen; p = Popen([sys.executable, '-c', 'import time; "
         "time.sleep(900)']); open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(900)")  # (ended with its group)


def test_a_session_that_is_ended_while_a_job_runs():
    grandchild = os.path.join(background.SCRATCH, "grandchild.pid")
    background.start("sleeper", [sys.executable, "-c", CHILD, grandchild])
    while not os.path.exists(grandchild) or not open(grandchild).read():
        time.sleep(0.05)
    job = background._JOBS["sleeper"][0]
    info = dict(job=job.pid, grandchild=int(open(grandchild).read()), scratch=background.SCRATCH,
                reaper=background._REAPER.pid)
    with open(os.environ["MEMBER_INFO"] + ".tmp", "w") as f:
        json.dump(info, f)
    os.rename(os.environ["MEMBER_INFO"] + ".tmp", os.environ["MEMBER_INFO"])
    time.sleep(900)
'''
WAIT_S = 240  # what a loaded machine may take for each step (the order is what is checked)


def wait_until(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_the_jobs_end_and_the_scratch_goes_however_the_session_ends(how, tmp_path):
    member = tmp_path / "test_member.py"
    member.write_text(MEMBER)
    info = tmp_path / "info.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]), MEMBER_INFO=str(info))
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                                str(member)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, preexec_fn=default_signals)
    try:
        wait_until(lambda: info.exists() or session.poll() is not None, "the session's job never started")
        assert session.poll() is None, "the session ended before its job ran"
        started = json.loads(info.read_text())
        assert all(portable.pid_alive(started[k]) for k in ("job", "grandchild", "reaper"))
        assert os.path.isdir(started["scratch"])
        session.send_signal(getattr(signal, how))
        session.wait(timeout=WAIT_S)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    # then, in that order: the job and the child it started, the scratch, the reaper: gone
    wait_until(lambda: not portable.pid_alive(started["job"]) and not portable.pid_alive(started["grandchild"]),
               f"a process of the job outlived the session ({how})")
    wait_until(lambda: not os.path.exists(started["scratch"]), f"the scratch outlived the session ({how})")
    wait_until(lambda: not portable.pid_alive(started["reaper"]), f"the reaper outlived its work ({how})")
