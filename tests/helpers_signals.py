"""
Issue 33, class 10: a test that signals a child it started must not depend on the disposition
the test run inherited. A shell starts a background job (`./run-tests.sh &`) with SIGINT
ignored, an ignored signal stays ignored across exec, and Python then installs no
KeyboardInterrupt handler: the SIGINT the test sends does nothing and the child runs on.

    subprocess.Popen(cmd, preexec_fn=default_signals)   # the child starts as from a terminal
"""

import signal


def default_signals():
    """In the child, before exec: SIGINT and SIGTERM at their defaults (Python then turns SIGINT
    into KeyboardInterrupt, and run_cli SIGTERM too), whatever the parent inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interrupt_at_rename(monkeypatch, name, nth, before):
    """SIGTERM raised (signal.raise_signal, as the OS delivers it; run_cli makes it Ctrl-C's
    interrupt, and unlike SIGINT a shell's background job does not ignore it) at the nth rename
    onto a file called `name`, just before the rename (before=True) or just after it: the two
    moments at which what an interrupt names and what the file holds may part (a checkpoint)."""
    import os
    replace, seen = os.replace, []

    def replacing(src, dst, *a, **k):
        seen.append(os.path.basename(dst) == name)
        at = seen[-1] and seen.count(True) == nth
        if at and before:
            signal.raise_signal(signal.SIGTERM)
        replace(src, dst, *a, **k)
        if at and not before:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(os, "replace", replacing)
