"""
results/benchkit/keeper.py: a report's section ends, with everything it started, once the report is
gone. Each section runs in a process group of its own (results/benchkit/report.py) and starts, first,
this small process in that group: it watches the report and the section, and when either has
gone (the report killed with -9 or at a device's limit, the section killed by the OOM killer)
it kills the whole group, itself included: no section, train.py, gpu_check or compile worker
goes on measuring beside the next command.

Why a process of its own: the section's parent is multiprocessing's server, not the report, so
a parent-death signal (prctl) would wait on the server, and it would end the section alone,
leaving the section's children running; a thread of the section cannot run while the section
holds the GIL in a long call, and dies with it. Standard library only: it starts in
milliseconds.

    start(report_pid)   # in the section, once it leads its own process group (portable.lead_group)
"""

import os
import subprocess
import sys
import time

from nanotost import REPO, portable

POLL_S = 0.2  # how often the keeper looks at the report and the section
_kept = []  # this section's keeper (its Popen), held for the section's life


def is_running(pid):
    """Whether process pid runs (a zombie, ended but not yet waited for, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # (no /proc: macOS, Windows)
        return portable.pid_alive(pid)


def start(report_pid):
    """Start the keeper of this section's process group (this process leads it), watching
    report_pid and this process."""
    code = f"from results.benchkit.keeper import keep; keep({int(report_pid)}, {os.getpid()})"
    _kept.append(subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def keep(report_pid, section_pid):
    """The keeper: once the report has ended or the section has (this process then has another
    parent), the section's whole process group is killed, this process with it."""
    while is_running(report_pid) and os.getppid() == section_pid:
        time.sleep(POLL_S)
    portable.end_own_group(section_pid)
