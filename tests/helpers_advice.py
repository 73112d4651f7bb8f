"""
Issue 17's "advice that is right", as one check every error test can call:
assert_advice_exists(message) fails when a one-line error names a script that is not in the
repository, or an option --key that the script it is given to does not have.

A message reads "<script>: <text>"; an option belongs to the last script named before it in
the text (`python prepare_char.py --force`), else to the script that printed the message.
A script's options are its settings (module-level `name = value` lines, read by
cli.configure) and its argparse options (`add_argument("--name"`).
"""

import functools
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("train.py", "sample.py", "evaluate.py", "export.py", "prepare_char.py", "prepare_openwebtext.py",
           "vit_train.py", "vit_inspect.py", "lm_inspect.py", "bench.py", "lra/train.py", "lra/generate.py",
           "lra/summary.py", "lm_harness.py", "results/render.py", "results/compare/pydocs.py", "results/recall/suite.py",
           "results/recall/decode_bench.py", "lra/listops_runs.py")
TOKEN = re.compile(r"(python\s+)?((?:[\w.-]+/)*[\w.-]+\.py)\b|(?<![\w-])--([a-z_][a-z0-9_]*)")


def _known(name):
    """The repository script a name refers to (lra/train.py as well as train.py), or None."""
    return next((s for s in SCRIPTS if name == s), None) or next((s for s in SCRIPTS if name.endswith("/" + s)), None)


@functools.lru_cache(maxsize=None)
def options_of(script):
    """The options a script accepts (its settings and argparse options; lm_harness.py's are
    lm-eval's own command line's)."""
    path = os.path.join(REPO, script)
    if script == "lm_harness.py":
        import lm_eval._cli.run

        path = lm_eval._cli.run.__file__
    with open(path, encoding="utf-8") as f:
        src = f.read()
    settings = set(re.findall(r"^([a-z_][a-z0-9_]*) = ", src, re.M))
    return settings | set(re.findall(r'add_argument\(\s*"--([\w-]+)"', src)) | {"help"}


def assert_advice_exists(message, script=None):
    """Every command the message gives runs a script that exists; every --key is an option
    of the script it goes with. Returns the number of options checked."""
    head, sep, text = message.strip().partition(": ")
    text = re.sub(r"'[^']*'", "''", text)  # quoted text echoes the user's input, not advice
    current = script or _known(head)
    checked = 0
    for command, name, key in TOKEN.findall(text):
        if name:
            if command:  # "python X.py": advice, so X must exist
                assert os.path.isfile(os.path.join(REPO, name)), f"no such script {name!r}\n{message}"
            current = _known(name) or current  # any other .py is data (a config file, say)
        elif key != "key":  # --key=value: the syntax, not an option
            assert current is not None, f"--{key} without a script to belong to\n{message}"
            assert key in options_of(current), f"{current} has no option --{key}\n{message}"
            checked += 1
    return checked
