"""
Long subprocesses that a test only waits for, started when the session has chosen its tests
(tests/conftest.py), so that on two cores they run beside the rest of the suite instead of
after it. A job runs at a lower priority (nice 10, or lower where it asks) with one thread, so
the tests that time something in the foreground keep their core; its output goes to files,
never to a full pipe; it starts with the signals' defaults (helpers_signals), as from a terminal.

    job = background.start("name", [sys.executable, "-c", SCRIPT, path], env=env)
    proc = background.wait("name", timeout=300)   # a CompletedProcess, as subprocess.run gives
    background.succeeded("name", timeout=300)     # the same, failing the test with the job's stderr

Jobs write their results under SCRATCH. A test calls start before wait: a no-op where the
session started the job already.
"""

import atexit
import os
import shutil
import subprocess
import tempfile

from helpers_signals import default_signals

_JOBS = {}  # name -> (Popen, stdout file, stderr file)
SCRATCH = tempfile.mkdtemp(prefix="nanotost-jobs-")  # where jobs write their results; removed at exit


def start(name, argv, env=None, cwd=None, nice=10):
    """Start job `name` unless it runs already, at priority `nice` (a job that the tests wait
    for later can run at a lower one: 15 leaves most of the core to the jobs at 10)."""
    if name in _JOBS:
        return
    env = dict(env or os.environ, OMP_NUM_THREADS="1")
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err, text=True,
                            preexec_fn=lambda: (default_signals(), os.nice(nice)))
    _JOBS[name] = (proc, out, err)


def when_chosen(uses, start):
    """A test module's start_in_background(names) (tests/conftest.py calls it once the session's
    tests are chosen): start() where one of the test names in `uses` is among them (uses=None:
    where any test of the module is)."""
    def start_in_background(names):
        if uses is None or names & set(uses):
            start()
    return start_in_background


def wait(name, timeout):
    """The job's CompletedProcess (returncode, stdout, stderr), once it has ended."""
    proc, out, err = _JOBS[name]
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def succeeded(name, timeout):
    """wait(name), asserting that the job ended well (the end of its stderr where it did not)."""
    proc = wait(name, timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@atexit.register
def _stop_all():  # a session that ends (or is interrupted) leaves no job and no scratch behind
    for proc, _, _ in _JOBS.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shutil.rmtree(SCRATCH, ignore_errors=True)
