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
