"""
Issue 40, class 6: a distributed run always ends. Under DDP (ranks.distributed, shared by
train.py, vit_train.py, lra/train.py and evaluate.py) no rank waits for ever: a collective gives
up after the process group's timeout (the setting ddp_timeout_s) with one line naming the rank
and what it waited in, a rank whose peers ended says so at once, and SIGTERM or Ctrl-C end a
rank before its timeout even while it waits in C code (ranks.interrupts_reach_c): each checked
as an order of events, which holds on a loaded machine (issue 54, class 10). Each member of the
class is a case of tests/helpers_ranks.py (two gloo ranks), all run at once in the background;
tests/test_train.py stops a rank of train.py itself under torchrun. And what the interrupt's
helper thread must leave alone: an interrupt the main thread takes, a forked child's signal.

    python -m pytest -q tests/test_ddp_waits.py
"""

import importlib
import json
import os
import subprocess
import sys

import pytest

import background
import helpers_ranks
from helpers_advice import assert_advice_exists
from helpers_signals import default_signals

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nanotost import cli, ranks  # noqa: E402

RESULTS = os.path.join(background.SCRATCH, "ddp_waits", "results.json")
PREFIX = "tests/helpers_ranks.py: "  # how run_cli names the script the ranks run
# what the line names as the wait, for each collective of tests/helpers_ranks.py
NAMED = {"init": "init_process_group (ranks.distributed)", "loss mean": "all_reduce (ranks.all_reduce_mean)",
         "rng gather": "all_gather_object (trainkit.gather_rng_states)",
         "end barrier": "barrier (ranks.distributed)",
         "DDP start": "DistributedDataParallel at", "DDP gradients": "backward (DDP's gradient all-reduce)",
         "script all_reduce": "all_reduce at", "broadcast": "broadcast at",
         "disagree": "all_reduce (ranks.all_reduce_mean)"}
USES_RANKS = {"test_a_rank_that_stops_ends_the_rank_that_waits", "test_an_interrupt_ends_a_rank_held_in_a_collective"}


def start_ranks_job():
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    background.start("ddp waits", [sys.executable, os.path.join(REPO, "tests", "helpers_ranks.py"), RESULTS,
                                   *helpers_ranks.CASES], cwd=REPO)


start_in_background = background.when_chosen(USES_RANKS, start_ranks_job)  # (with the session, beside the other tests)


@pytest.fixture(scope="module")
def ranks():
    start_ranks_job()  # a no-op where the session started it already
    background.succeeded("ddp waits", timeout=400)  # (helpers_ranks.DEADLINE_S, and a loaded machine's start)
    with open(RESULTS, encoding="utf-8") as f:
        return json.load(f)


def the_line(rank):
    """The one line a rank printed (and nothing else: no traceback)."""
    lines = rank["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), rank["stderr"]
    return lines[0][len(PREFIX):]


@pytest.mark.parametrize("name", list(helpers_ranks.STOPS))
def test_a_rank_that_stops_ends_the_rank_that_waits(ranks, name):
    """One rank stops (asleep, or ended by an error) before a collective: the rank waiting in it
    ends with one line, exit status 1, at its timeout (asleep) or at the other's end (ended). The
    order of events is checked, not seconds (a loaded machine stretches those): the waiter ends
    while the sleeper still sleeps (unfixed: both are killed at the job's deadline); a waiter
    whose peer ended says it lost it, before its own timeout (at which it would say waited)."""
    case, waiter = helpers_ranks.CASES[name], ranks[name]["waiter"]
    line = the_line(waiter)
    assert waiter["code"] == 1, waiter
    if case.stop == "sleep":
        assert line.startswith(f"rank {waiter['rank']} waited {case.timeout_s:g} s for the other ranks in "
                               f"{NAMED[case.collective]}"), line
        assert "--ddp_timeout_s" in line, line  # the setting to raise where a rank was only slow
    else:  # (at the other rank's exit, not at the timeout: seconds, on a loaded machine too)
        assert line.startswith(f"rank {waiter['rank']} lost the other ranks in {NAMED[case.collective]}"), line
        assert "another rank ended" in line, line
        assert ranks[name]["stopper"]["stderr"].strip().endswith("(the test's error)")  # its own line says why
    assert line.endswith("; nothing was saved"), line  # and what the run leaves (cli.on_interrupt)
    stopper = ranks[name]["stopper"]
    assert waiter["ended"] is not None and stopper["ended"] is not None, ranks[name]
    if case.stop == "sleep" and case.collective != "disagree":  # the sleeper ends only when the job kills it
        assert waiter["ended"] <= stopper["ended"] and stopper["code"] == -9, ranks[name]
    elif case.stop == "error":  # (its line says lost: it ended before its own timeout, at the other's error)
        assert stopper["code"] == 1, ranks[name]


@pytest.mark.parametrize("name", list(helpers_ranks.INTERRUPTS))
def test_an_interrupt_ends_a_rank_held_in_a_collective(ranks, name):
    """SIGTERM (a launcher's, a scheduler's) or SIGINT to a rank waiting in a collective for a
    rank that sleeps: it ends before the process group's timeout would have ended it (checked
    as that order, however loaded the machine), with run_cli's status and one line naming the
    signal, the rank and the wait; the sleeper still sleeps."""
    case, waiter = helpers_ranks.CASES[name], ranks[name]["waiter"]
    line = the_line(waiter)
    assert waiter["code"] == 130, waiter
    assert line.startswith(f"interrupted ({case.signal}) while rank {waiter['rank']} waited for the other ranks in "
                           f"{NAMED[case.collective]}"), line
    assert line.endswith("; nothing was saved"), line
    assert waiter["seconds"] is not None and waiter["seconds"] < case.timeout_s - helpers_ranks.SETTLE_S, waiter
    assert waiter["ended"] <= ranks[name]["stopper"]["ended"], ranks[name]


@pytest.mark.parametrize("script", ["train.py", "vit_train.py", "lra/train.py", "evaluate.py"])
@pytest.mark.parametrize("value", ["0", "-5", "1e9"])
def test_ddp_timeout_s_is_checked_before_any_work(script, value, tmp_path, monkeypatch):
    """The scripts that run under torchrun share the setting, and its range (trainkit)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit) as e:
        cli.run_cli(importlib.import_module(script[:-3].replace("/", ".")).main, [f"--ddp_timeout_s={value}"])
    assert e.value.code == f"{script}: ddp_timeout_s must be in [0.1, 604800], got {float(value)}"
    assert_advice_exists(e.value.code)
    assert os.listdir(tmp_path) == []


# what the helper thread of ranks.interrupts_reach_c must leave alone: an interrupt that the main
# thread takes (run_cli says it, once), and a signal to a process forked inside the block (a
# DataLoader worker its loader terminates): it shares the wakeup socket, not the interrupt
TAKEN = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
from nanotost import cli, ranks
def main():
    cli.on_interrupt("the test's text")
    with ranks.interrupts_reach_c(lambda frame: "held in C code", grace_s=0.5):
        if {fork}:
            pid = os.fork()
            if pid == 0:
                try:
                    time.sleep(10)
                finally:
                    os._exit(0)
            time.sleep(0.2)
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.5)  # (three graces: the helper would have ended this process by now)
    print("went on")
cli.run_cli(main)
"""


@pytest.mark.parametrize("fork", [False, True], ids=["taken by the main thread", "a forked child's"])
def test_the_interrupt_helper_ends_only_a_process_held_in_c(fork):
    """An interrupt the main thread takes is run_cli's one line (the helper stands down); a
    forked child's signal leaves the parent running (ranks._unwatch_in_child)."""
    p = subprocess.run([sys.executable, "-c", TAKEN.format(repo=REPO, fork=fork)], capture_output=True, text=True,
                       timeout=60, preexec_fn=default_signals)
    if fork:
        assert (p.returncode, p.stdout, p.stderr) == (0, "went on\n", ""), p
    else:
        assert (p.returncode, p.stdout, p.stderr) == (130, "", "-c: interrupted; the test's text\n"), p
