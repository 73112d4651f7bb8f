"""
bench.py's settings and its four modes (the suites; --report; --headline; the headline's plan,
--headline --plan_from): a setting given must do something. Each mode declares the settings it
reads (results/benchkit/settings.py's READS); given to a mode that does not read it, a setting
is one line before any work, never ignored (`bench.py --sections=op` without --report ran the
suites for ten minutes; `--headline --plan_from=... --out=... --remeasure=True` printed the plan
and said nothing). The lists are checked against the code that reads each setting (the plan's
by recording what it reads as it runs), so a new setting of one mode joins its list or fails here.

    python -m pytest -q tests/test_bench_settings.py          # seconds
"""

import ast
import contextlib
import io
import json
import os
import sys
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import bench  # noqa: E402
from nanotost import cli  # noqa: E402
from results.benchkit import plan  # noqa: E402
from results.benchkit.settings import READS, SWITCHES  # noqa: E402

MODES = {"suites": [], "report": ["--report"], "headline": ["--headline"],
         "plan": ["--headline", "--plan_from=results/nvidia-h200.json"]}
EXAMPLE = dict(suites="op", impls="torch", modes="fwd", causal="False", max_case_s="5", sections="op",
               section_s="op:100", budget_s="300", remeasure="True", train_tokens="64", main_iters="10",
               main_tssa_impl="torch", plan_from="results/nvidia-h200.json", compile_cache="off", device="cpu",
               dtype="float32", T="64", model_T="64", decode_T="32", B="1", H="2", p="16", threads="1", repeats="3",
               warmup="0", decode_steps="4", quick="True", out="r.json")


UNREAD = [(name, mode) for mode in MODES for name in EXAMPLE if name not in READS[mode]
          and (name, mode) != ("plan_from", "headline")]  # (--plan_from makes a headline its plan)


@pytest.mark.parametrize("name,mode", UNREAD)
def test_a_setting_the_mode_does_not_read_is_one_line_before_any_work(name, mode, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = [f"--out={tmp_path / 'r.json'}"] if "out" in READS[mode] else []  # (never the default place)
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as ended:
        mp.setattr(sys, "argv", ["bench.py"])
        cli.run_cli(bench.main, [*MODES[mode], *given, f"--{name}={EXAMPLE[name]}"])
    said = ended.value.code
    assert isinstance(said, str) and said.startswith(f"bench.py: --{name}: a setting of ") and "\n" not in said, said
    assert "which this command does not run: drop it" in said, said
    assert ("add --report or --headline" in said) == (mode == "suites" and name != "plan_from"), said
    assert ("drop --plan_from to measure" in said) == (mode == "plan"), said
    assert os.listdir(tmp_path) == []  # nothing measured, nothing written


def test_every_setting_example_is_a_setting_and_every_setting_is_read_by_a_mode():
    assert set(EXAMPLE) == set(bench.DEFAULTS) - set(SWITCHES)
    assert set().union(*READS.values()) == set(EXAMPLE)


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
    """By the code: a setting the suites do not read is never read by results/benchkit/suites.py,
    one the report and the headline do not read never by their modules; every setting the suites
    and the report both read is read by both, directly or as check_settings' lists."""
    others = [f"results/benchkit/{f}" for f in os.listdir(os.path.join(REPO, "results", "benchkit"))
              if f.endswith(".py") and f not in ("suites.py", "settings.py", "plan.py")] + ["bench.py"]
    suites = settings_read("results/benchkit/suites.py") | planned()
    reports = set().union(*(settings_read(p) for p in others)) | planned()
    read_by_reports = set().union(*(settings_read(p) for p in others))
    assert not (set(bench.DEFAULTS) - set(READS["report"]) - set(SWITCHES) - {"plan_from"}) & read_by_reports
    not_suites = set(bench.DEFAULTS) - set(READS["suites"]) - set(SWITCHES)
    assert not not_suites & settings_read("results/benchkit/suites.py")
    shared = set(READS["suites"]) & set(READS["report"])
    assert {name for name in shared if name not in suites or name not in reports} == set()


class Recording(SimpleNamespace):
    """The settings, noting each one read."""

    def __getattribute__(self, name):
        if not name.startswith("_"):
            object.__getattribute__(self, "_read").add(name)
        return object.__getattribute__(self, name)


def empty_report(tmp_path):
    """The committed H200 report with no rows: every row of unknown cost."""
    with open(os.path.join(REPO, "results", "nvidia-h200.json"), encoding="utf-8") as f:
        data = json.load(f)
    data["sections"] = {k: {**v, "rows": []} for k, v in data["sections"].items()}
    data["history"] = []
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("argv", [[], ["--budget_s=200"], ["--quick"], ["--sections=op,decode", "--section_s=op:60"],
                                  ["EMPTY"]])
def test_the_plan_reads_only_the_settings_it_declares(argv, tmp_path, monkeypatch):
    """The plan, run as the command runs it with its settings recorded as they are read: every
    one it reads is among READS["plan"] (a setting it reads and does not declare would be
    refused when given)."""
    read = set()
    show = plan.show

    def recorded(cfg, sections):
        return show(Recording(**vars(cfg), _read=read), sections)
    monkeypatch.setattr(plan, "show", recorded)
    monkeypatch.chdir(REPO)
    argv = [f"--plan_from={empty_report(tmp_path)}" if a == "EMPTY" else a for a in argv]
    with contextlib.redirect_stdout(io.StringIO()):
        cli.run_cli(bench.main, ["--headline", "--plan_from=results/nvidia-h200.json", *argv])
    assert read and read <= set(READS["plan"]) | {"headline"}, read - set(READS["plan"])
