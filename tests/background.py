"""
Long subprocesses that a test only waits for, started when the session has chosen its tests
(tests/conftest.py), so that on two cores they run beside the rest of the suite instead of
after it. A job runs at a lower priority (nice 10, or lower where it asks) with one thread, so
the tests that time something in the foreground keep their core; its output goes to files,
never to a full pipe; it starts with the signals' defaults (helpers_signals), as from a terminal.

    job = background.start("name", [sys.executable, "-c", SCRIPT, path], env=env)
    proc = background.wait("name", timeout=300)   # a CompletedProcess, as subprocess.run gives
    background.succeeded("name", timeout=300)     # the same, failing the test with the job's stderr

Jobs write their results under SCRATCH, and their temporary files too (TMPDIR inside it). A
test calls start before wait: a no-op where the session started the job already.

The jobs end with the suite however it ends: each leads a process group of its own (all it
starts, ended as one: portable.signal_group), ended when the session ends (atexit, which
SIGTERM reaches too: tests/conftest.py), and, where pytest dies without running it (kill -9, a
crash), by tests/reaper.py, which outlives pytest and ends every group and removes SCRATCH
once pytest's end closes its pipe. Nothing of the suite's is left running or on disk.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

from helpers_signals import default_signals

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nanotost import cli, portable  # noqa: E402

_JOBS = {}  # name -> (Popen, stdout file, stderr file)
SCRATCH = tempfile.mkdtemp(prefix="nanotost-jobs-")  # where jobs write their results; removed at exit
JOB_TMP = os.path.join(SCRATCH, "tmp")  # the session's temporary files (TMPDIR): removed with SCRATCH
os.makedirs(JOB_TMP)
# the packages' caches that live in the temp dir stay where they are (a warm compile cache, the BPE files): only the
# session's own temporary files move into SCRATCH
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{cli._user()}"))
os.environ.setdefault("DATA_GYM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "data-gym-cache"))
_REAPER = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")],
                           stdin=subprocess.PIPE, text=True, preexec_fn=portable.lead_group)


def use_session_temp():
    """From now on, every temporary file or folder of this session's processes (pytest's own
    tmp_path folders aside, made before) in JOB_TMP: what a test, a library or a child leaves
    there (torchrun's rendezvous folders, a killed run's) goes with SCRATCH, however the session ends."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        os.environ[name] = JOB_TMP
    tempfile.tempdir = JOB_TMP


def tell_reaper(line):
    """A line for tests/reaper.py (group, ended, path), sent at once."""
    if _REAPER.poll() is None:
        _REAPER.stdin.write(line + "\n")
        _REAPER.stdin.flush()


tell_reaper(f"path {SCRATCH}")


def start(name, argv, env=None, cwd=None, nice=10):
    """Start job `name` unless it runs already, at priority `nice` (a job that the tests wait
    for later can run at a lower one: 15 leaves most of the core to the jobs at 10)."""
    if name in _JOBS:
        return
    env = dict(env or os.environ, OMP_NUM_THREADS="1", TMPDIR=JOB_TMP, TEMP=JOB_TMP, TMP=JOB_TMP)
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err, text=True,
                            preexec_fn=lambda: (portable.lead_group(), default_signals(), os.nice(nice)))
    _JOBS[name] = (proc, out, err)
    tell_reaper(f"group {proc.pid}")


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
        end_group(proc)
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def succeeded(name, timeout):
    """wait(name), asserting that the job ended well (the end of its stderr where it did not)."""
    proc = wait(name, timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def end_group(proc):
    """A job ended with all it started (its process group: a child it left behind too), then
    reaped; the reaper forgets it."""
    try:
        portable.signal_group(proc.pid, force=True)
    except (ProcessLookupError, PermissionError):  # (the group had ended with the job)
        pass
    proc.wait()
    tell_reaper(f"ended {proc.pid}")


@atexit.register
def _stop_all():  # a session that ends (or is interrupted) leaves no job and no scratch behind
    for proc, _, _ in _JOBS.values():
        end_group(proc)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    _REAPER.stdin.close()  # (the reaper's signal: what is left, it ends and removes)
    _REAPER.wait()
