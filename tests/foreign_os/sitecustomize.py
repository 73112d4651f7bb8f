"""
Windows and macOS, as far as the project's own calls go, on the Linux that runs the tests
(issue 45): with this folder first on PYTHONPATH, Python imports this file at start-up, and
the process then lacks what those systems lack:

  fcntl                  unimportable (Windows): locks go through msvcrt.locking, which this
                         file provides, made of the real flock, as Windows' own behaves for
                         the project's use: the first byte of an open file, held by that open
                         file, refused at once (OSError EACCES) to any other
  renameat2              hidden from ctypes (macOS, Windows): folders swap by two renames
  os.fchmod, os.fchown, os.setsid, os.killpg, os.getloadavg   absent (Windows)

(os.register_at_fork, fork and the POSIX signals stay: torch itself needs them on Linux; the
project's uses of those are guarded or in portable.py, which tests/test_portable.py checks.)

    PYTHONPATH=tests/foreign_os python train.py ...
"""

import ctypes
import errno
import getpass  # noqa: F401  (as subprocess: imported before msvcrt exists, which they take for Windows)
import os
import subprocess  # noqa: F401
import sys
import types

import fcntl as _fcntl  # (this file's own: the emulated msvcrt is made of it)

sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows

_find = ctypes.CDLL.__getitem__


def _without_renameat2(library, name):
    if name == "renameat2":
        raise AttributeError(name)
    return _find(library, name)


ctypes.CDLL.__getitem__ = _without_renameat2  # (getattr(libc, "renameat2") goes through it)

for _name in ("fchmod", "fchown", "setsid", "killpg", "getloadavg"):
    if hasattr(os, _name):
        delattr(os, _name)


def _locking(fd, mode, nbytes):
    """msvcrt.locking: LK_NBLCK locks (LK_UNLCK unlocks) nbytes from the file's position; a
    range another open file holds is refused at once."""
    if mode == msvcrt.LK_UNLCK:
        _fcntl.flock(fd, _fcntl.LOCK_UN)
        return
    try:
        _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
    except BlockingIOError:
        raise PermissionError(errno.EACCES, "Permission denied") from None


msvcrt = types.ModuleType("msvcrt", "Windows' C runtime, as far as locking goes (tests/foreign_os)")
msvcrt.LK_UNLCK, msvcrt.LK_LOCK, msvcrt.LK_NBLCK, msvcrt.LK_RLCK, msvcrt.LK_NBRLCK = 0, 1, 2, 3, 4
msvcrt.locking = _locking
sys.modules["msvcrt"] = msvcrt
