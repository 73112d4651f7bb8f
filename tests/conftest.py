"""
pytest's hook for tests/background.py: once the tests of the session are chosen, each test
module's start_in_background(names) starts the long subprocesses its selected tests will
wait for (tests/test_kernels.py: the Triton interpreter run and the GPU compile), so that on
two cores they run beside the other tests; those modules then run last.
"""


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
