"""
pytest's hooks for the session:

  * tests/background.py: once the tests of the session are chosen, each test module's
    start_in_background(names) starts the long subprocesses its selected tests will wait for
    (tests/test_kernels.py: the Triton interpreter run and the GPU compile), so that on two
    cores they run beside the other tests; those modules then run last;
  * the session's temporary files in its scratch (pytest's own tmp_path folders and the packages'
    caches aside): nothing of its own is left in the temp dir, however it ends;
  * SIGTERM (a CI job's time limit, kill) ends the session as Ctrl-C does: pytest's interrupt,
    its teardown and the interpreter's exit run, and with them background.py's end of the jobs
    (a process forked from pytest keeps the signal's default). SIGINT is left as the session
    got it (ignored in a shell's background job: then only SIGTERM or the end ends it).
"""

import os
import signal

import pytest

import background

SESSION_PID = os.getpid()


def _interrupted(number, frame):
    """SIGTERM in pytest: raised as KeyboardInterrupt; in a process forked from it: the default."""
    if os.getpid() != SESSION_PID:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise KeyboardInterrupt(f"signal {number}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupted)


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_the_sessions_scratch(tmp_path_factory):
    """pytest's own folder where pytest keeps it; every other temporary file of the session in
    its scratch, which goes however the session ends (background.use_session_temp)."""
    tmp_path_factory.getbasetemp()
    background.use_session_temp()


def pytest_collection_modifyitems(session, config, items):
    chosen = {}
    for item in items:
        chosen.setdefault(item.module, set()).add(item.originalname)
    for module, names in chosen.items():
        start = getattr(module, "start_in_background", None)
        if start is not None:
            start(names)
    # the modules that wait for a job run last (each whole, in its order): the jobs then have the
    # rest of the session to end, and the foreground rarely waits with a core idle
    items.sort(key=lambda item: hasattr(item.module, "start_in_background"))
