"""
bench.py's settings and its three modes (the suites; --report; --headline): a setting given
must do something. Each mode reads some settings the others never read
(results/benchkit/settings.py's SUITES_ONLY and REPORTS_ONLY); given to a mode that does not read it,
a setting is one line before any work, never ignored (`bench.py --sections=op` without
--report ran the suites for ten minutes). The two lists are checked against the code that reads
each setting, so a new setting of one mode joins its list or fails here.

    python -m pytest -q tests/test_bench_settings.py          # seconds
"""

import ast
import contextlib
import io
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import bench  # noqa: E402
from nanotost import cli  # noqa: E402
from results.benchkit.settings import REPORTS_ONLY, SUITES_ONLY  # noqa: E402

MODES = {"suites": [], "report": ["--report"], "headline": ["--headline"]}
EXAMPLE = dict(suites="op", impls="torch", modes="fwd", causal="False", max_case_s="5", sections="op",
               section_s="op:100", budget_s="300", remeasure="True", train_tokens="64", main_iters="10",
               main_tssa_impl="torch", plan_from="results/nvidia-h200.json", compile_cache="off")


def bench_says(argv):
    """bench.py argv as the command line runs it, in this process: the one line it ends with."""
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as ended:
        mp.setattr(sys, "argv", ["bench.py"])
        cli.run_cli(bench.main, ["--device=cpu", "--quick", *argv])
    return ended.value.code


UNREAD = [(name, mode) for mode in MODES for name in (REPORTS_ONLY if mode == "suites" else SUITES_ONLY)]


@pytest.mark.parametrize("name,mode", UNREAD)
def test_a_setting_of_another_mode_is_one_line_before_any_work(name, mode, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = bench_says([*MODES[mode], f"--{name}={EXAMPLE[name]}", f"--out={tmp_path / 'r.json'}"])
    assert isinstance(said, str) and said.startswith(f"bench.py: --{name}: a setting of ") and "\n" not in said
    assert ("add --report or --headline" in said) == (mode == "suites"), said
    assert os.listdir(tmp_path) == []  # nothing measured, nothing written


def test_every_setting_example_is_a_setting():
    assert set(EXAMPLE) == set(SUITES_ONLY + REPORTS_ONLY) and set(EXAMPLE) <= set(bench.DEFAULTS)


def settings_read(path):
    """The settings a module reads as cfg.<name> (cfg: the settings object every mode passes on)."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "cfg"}


def planned():
    """The settings check_settings hands every mode as lists (its `plan = dict(...)`)."""
    with open(os.path.join(REPO, "results", "benchkit", "settings.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {k.arg for n in ast.walk(tree) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "plan"
            and isinstance(n.value, ast.Call) for k in n.value.keywords}


def test_the_lists_are_what_the_code_reads():
    """By the code: SUITES_ONLY is never read by a module of the report or the headline, and
    REPORTS_ONLY never by results/benchkit/suites.py; every other setting (but the two mode switches)
    is read by both, directly or as check_settings' lists. A new setting either does both or
    joins a list."""
    others = [f"results/benchkit/{f}" for f in os.listdir(os.path.join(REPO, "results", "benchkit"))
              if f.endswith(".py") and f not in ("suites.py", "settings.py")] + ["bench.py"]
    suites = settings_read("results/benchkit/suites.py") | planned()
    reports = set().union(*(settings_read(p) for p in others)) | planned()
    assert not set(SUITES_ONLY) & set().union(*(settings_read(p) for p in others))
    assert not set(REPORTS_ONLY) & settings_read("results/benchkit/suites.py")
    shared = set(bench.DEFAULTS) - set(SUITES_ONLY) - set(REPORTS_ONLY) - {"report", "headline"}
    assert {name for name in shared if name not in suites or name not in reports} == set()
