"""
What differs between Linux, macOS and Windows, one call each, so that every script starts and
works on the three (outputs.py's claims and swaps, ranks.py's signals, benchkit's process groups, the tools'
load averages). Nothing else in the project calls the OS's own ways for these. Standard
library only (results/benchkit/keeper.py imports it in a process that must start in milliseconds).

  lock(fd)              an exclusive lock on an open file, taken without waiting (False: another
                        process holds it); the OS frees it when the process ends, however it ends:
                        fcntl.flock (Linux, macOS), msvcrt.locking (Windows)
  LOCKS_FOLDERS         whether a folder itself can be locked (flock on its descriptor); else a
                        file in it is
  exchange(a, b)        two paths swapped in one step where the OS has one (Linux's renameat2):
                        False elsewhere, and the caller renames twice
  pid_alive(pid)        whether a process runs (os.kill(pid, 0) would send Ctrl-C on Windows)
  is_mount_point(path)  a folder no rename can move: a mount point (a bind mount too, on Linux)
  name_max(folder)      the longest name, in bytes, a folder's file system takes
  sync_folder(path)     a folder's entries on disk, where the OS syncs folders (not Windows)
  INTERRUPTS            the signals that interrupt a run here: SIGINT, SIGTERM (SIGBREAK: Windows)
  lead_group(), signal_group(pid), end_own_group(leader)
                        a process and all it starts, ended as one: a POSIX process group
                        (setsid, killpg), a process tree on Windows (taskkill /T)
  load_average()        the 1, 5 and 15 minute load of the machine (NaN where the OS keeps none)

Tested on Linux, and with fcntl, renameat2 and more hidden as on Windows and macOS
(tests/foreign_os/sitecustomize.py).
"""

import ctypes
import errno
import functools
import math
import os
import re
import signal
import subprocess
import sys

try:
    import fcntl  # Linux, macOS
except ImportError:  # Windows
    fcntl = None

LOCKS_FOLDERS = fcntl is not None
INTERRUPTS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGBREAK") if hasattr(signal, name))
NAME_MAX = 255  # the longest file name of the usual file systems (ext4, APFS, NTFS), where the OS does not say


def lock(fd):
    """Lock the open file fd for this process without waiting: True when taken, False when
    another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            import msvcrt
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # its first byte (Windows locks ranges of bytes)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EDEADLK):  # (msvcrt's words for a range another process holds)
            return False
        raise
    return True


@functools.lru_cache(maxsize=None)
def _renameat2():
    """Linux's renameat2 from the C library, or None (another OS, an old C library)."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def exchange(a, b):
    """Swap the paths a and b in one step (RENAME_EXCHANGE): True when done, False where this OS
    or file system has no such step. Any other failure is an OSError naming b."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS):  # a file system (or kernel) that cannot exchange
        return False
    raise OSError(err, os.strerror(err), b)


def pid_alive(pid):
    """Whether process `pid` runs (on POSIX signal 0 sends nothing: it only asks)."""
    if os.name == "nt":
        return _windows_pid_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _windows_pid_alive(pid):
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = ctypes.c_void_p
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: it runs, as another user
    try:
        code = ctypes.c_ulong()
        return not kernel32.GetExitCodeProcess(ctypes.c_void_p(handle), ctypes.byref(code)) or code.value == 259
    finally:  # (259: STILL_ACTIVE)
        kernel32.CloseHandle(ctypes.c_void_p(handle))


def is_mount_point(path):
    """Whether the folder `path` is where a file system is mounted (os.path.ismount: another
    device than its parent, a volume's root), or, on Linux, a bind mount of a folder of the same
    file system (listed in /proc/self/mountinfo). A folder swap or rename cannot move it."""
    return os.path.ismount(path) or os.path.realpath(path) in _mount_points()


def _mount_points():
    """The mount points /proc/self/mountinfo lists (field 5, spaces written \\040), or none."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:  # (not Linux)
        return set()
    points = [line.split()[4] for line in lines if len(line.split()) > 4]
    return {os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), p)) for p in points}


def name_max(folder):
    """The longest file name, in bytes, that the file system of `folder` (an existing folder) takes."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, ValueError, OSError):  # (Windows has no pathconf; a file system that does not say)
        return NAME_MAX


def sync_folder(path):
    """The entries of the folder `path` on disk (a rename in it survives a power cut), where the
    OS syncs folders: POSIX. (Windows cannot open a folder as a file; NTFS journals its entries.)"""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lead_group():
    """Make this process the leader of a group of its own, which end_group ends with all it
    started (POSIX: setsid). On Windows a process's tree is the group: nothing to do."""
    if hasattr(os, "setsid"):
        os.setsid()


def signal_group(pid, force=False):
    """Ask the group `pid` leads (its tree on Windows) to end, every process of it: SIGTERM, or
    SIGKILL with force. ProcessLookupError or PermissionError where `pid` leads no group (it had
    not made one yet): the caller ends the process alone. Windows can only force (taskkill /T /F)."""
    if os.name == "nt":
        if subprocess.run(["taskkill", "/T", "/F", "/PID", str(pid)], capture_output=True).returncode != 0:
            raise ProcessLookupError(errno.ESRCH, "no such process", str(pid))
        return
    os.killpg(pid, signal.SIGKILL if force else signal.SIGTERM)


def end_own_group(leader):
    """End, at once, the group (or on Windows the tree of `leader`) this process belongs to,
    this process with it."""
    if os.name == "nt":
        subprocess.run(["taskkill", "/T", "/F", "/PID", str(leader)], capture_output=True)
        os._exit(1)
    os.killpg(0, signal.SIGKILL)


def load_average():
    """(1, 5, 15 minute load) of the machine; NaNs where the OS keeps none (Windows): a figure
    not measured, printed as nan, and refused as such by a report's reader (atomic.read_json)."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return (math.nan,) * 3
