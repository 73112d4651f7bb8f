"""
The suite's reaper (tests/background.py starts one per session): a small process that outlives
pytest however pytest ends (its tests done, Ctrl-C, SIGTERM, a crash or kill -9), then ends what
the suite left running and removes what it left on disk. pytest tells it, one line at a time on
a pipe to its stdin:

    group <pid>     a background job that leads a process group: all of it is ended (SIGKILL)
    ended <pid>     that job ended and its group was ended: forget it
    path <folder>   a folder of the session's (the jobs' scratch and temp files): removed

The end of the pipe (pytest is gone, whichever way) is the reaper's signal. It runs in a
session of its own with Ctrl-C ignored (an interrupt at the terminal is pytest's to take), and
it holds nothing open but the pipe.

    python tests/reaper.py          # started by tests/background.py, never by hand
"""

import os
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nanotost import portable  # noqa: E402


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups, paths = [], []
    for line in sys.stdin:  # (until pytest's end closes the pipe)
        what, _, value = line.rstrip("\n").partition(" ")
        if what == "group":
            groups.append(int(value))
        elif what == "ended" and int(value) in groups:
            groups.remove(int(value))
        elif what == "path":
            paths.append(value)
    for pid in groups:
        try:
            portable.signal_group(pid, force=True)
        except (ProcessLookupError, PermissionError):  # (the group had ended)
            pass
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
