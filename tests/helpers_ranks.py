"""
Issue 40, class 6, "distributed runs that do not end": two DDP ranks (gloo, CPU) per case, where
one rank stops before a collective (it sleeps, or ends with an error) and the other waits in
it, or where the waiting rank is interrupted there. tests/test_ddp_waits.py runs every case at
once, as one background job (tests/background.py):

    python tests/helpers_ranks.py <results.json> <case> ...

Torch is imported once and every rank is forked from this process (an interpreter and torch
per rank would cost seconds of CPU each); a rank then runs as a script does, its main under
cli.run_cli and the trainers' ranks.distributed, with its stderr in a file. The results:
{case: {"waiter": {"code", "stderr", "seconds", "ended"}, "stopper": {...}}}, seconds counted from
the moment the waiter is about to enter the collective (or, for an interrupt, from the signal),
ended the moment (time.time()) this process saw the rank end: the tests check the order of
events (the waiter ended before the stopper woke, or before its own timeout), not seconds, which
a loaded machine stretches.
A rank still alive at the end is killed (and every rank dies with this process).
"""

import ctypes
import json
import os
import signal
import socket
import sys
import time
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401  (DDP's first construction imports it: a second of CPU in every rank)
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from nanotost import cli, ranks
from nanotost import trainkit as tk  # noqa: E402

# collective: what the waiting rank runs; stopper: the rank that stops, how ("sleep" or "error");
# signal: sent to the waiter once it waits ("" for none); timeout_s: the waiter's process group's
Case = namedtuple("Case", "collective stopper stop signal timeout_s")
SHORT, LONG = 2.0, 120.0  # the timeout of a stop case; of an interrupt case (the signal must end it, not this)
# an ended rank's case: long enough that its exit (a Python teardown, slow on a loaded machine) is
# always seen before the timeout, so the waiter says "lost", never "waited"; it ends at the exit
ENDED = 30.0
STOPS = {
    "init": Case("init", 1, "sleep", "", SHORT),  # a rank that never joins
    "loss mean": Case("loss mean", 1, "sleep", "", SHORT),
    "rng gather": Case("rng gather", 0, "sleep", "", SHORT),  # (rank 1 waits)
    "end barrier": Case("end barrier", 1, "sleep", "", SHORT),
    "DDP start": Case("DDP start", 1, "sleep", "", SHORT),
    "DDP gradients": Case("DDP gradients", 0, "sleep", "", SHORT),
    "script all_reduce": Case("script all_reduce", 1, "sleep", "", SHORT),
    "broadcast": Case("broadcast", 1, "sleep", "", SHORT),
    "disagree": Case("disagree", 1, "sleep", "", SHORT),  # rank 1 goes on to the end barrier instead
    "loss mean, error": Case("loss mean", 1, "error", "", ENDED),  # the other rank ended
    "DDP gradients, error": Case("DDP gradients", 1, "error", "", ENDED),
    "end barrier, error": Case("end barrier", 0, "error", "", ENDED),
}
INTERRUPTS = {
    "init, SIGTERM": Case("init", 1, "sleep", "SIGTERM", LONG),
    "loss mean, SIGTERM": Case("loss mean", 1, "sleep", "SIGTERM", LONG),
    "rng gather, SIGTERM": Case("rng gather", 1, "sleep", "SIGTERM", LONG),
    "end barrier, SIGTERM": Case("end barrier", 0, "sleep", "SIGTERM", LONG),
    "DDP start, SIGTERM": Case("DDP start", 1, "sleep", "SIGTERM", LONG),
    "DDP gradients, SIGTERM": Case("DDP gradients", 1, "sleep", "SIGTERM", LONG),
    "loss mean, SIGINT": Case("loss mean", 1, "sleep", "SIGINT", LONG),
}
CASES = {**STOPS, **INTERRUPTS}
SETTLE_S = 1.5  # after the waiter says it enters the collective, before the signal: it is held in C by then
DEADLINE_S = 200.0  # a rank still alive this long after the case began is killed (and reported as code None)


def stop(case, rank):
    """The stopping rank's stop: asleep (as a rank stuck in I/O or stopped), or ended by an error."""
    if case.stop == "error":
        raise cli.UserError(f"rank {rank} stops here (the test's error)")
    time.sleep(DEADLINE_S)


def run_collective(what, d, model):
    """The collective the waiting rank waits in (the trainers' own, or torch's as a script calls it)."""
    if what == "loss mean":
        ranks.all_reduce_mean(torch.ones(2), d)
    elif what == "rng gather":
        tk.gather_rng_states(d)
    elif what == "DDP start":
        DDP(torch.nn.Linear(4, 4))
    elif what == "DDP gradients":
        model(torch.ones(3, 4)).sum().backward()
    elif what == "script all_reduce":
        dist.all_reduce(torch.ones(2))
    elif what == "broadcast":
        dist.broadcast(torch.ones(2), 0)
    elif what == "disagree":
        ranks.all_reduce_mean(torch.ones(2), d)
    # "end barrier": nothing, the block's end waits for every rank


def meet(out, name, rank):
    """Wait until both ranks of the case run: on a loaded machine a forked rank may start
    seconds after the other, longer than the waiter's timeout, which is for the collective."""
    open(os.path.join(out, f"{name}.{rank}.up"), "w").close()
    while not os.path.exists(os.path.join(out, f"{name}.{1 - rank}.up")):
        time.sleep(0.01)


def case_main(name, rank, out):
    """One rank of case `name`; the waiter creates <out>/<name>.ready as it enters the collective."""
    case, ready = CASES[name], os.path.join(out, f"{name}.ready")
    stopper = rank == case.stopper
    meet(out, name, rank)
    if case.collective == "init" and stopper:
        return stop(case, rank)
    if case.collective == "init":
        open(ready, "w").close()
    with ranks.distributed("cpu", LONG if stopper else case.timeout_s) as d:  # (the waiter's timeout comes first)
        model = DDP(torch.nn.Linear(4, 4)) if case.collective == "DDP gradients" else None
        if stopper and case.collective != "disagree":
            stop(case, rank)
        if stopper:  # "disagree": the end barrier, while the other rank is in an all-reduce
            return
        open(ready, "w").close()
        run_collective(case.collective, d, model)


def start_rank(name, rank, port, out):
    """Fork rank `rank` of case `name`; returns its pid. The child runs case_main under run_cli
    and ends as the interpreter would (a string given to sys.exit goes to stderr, code 1)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # (PR_SET_PDEATHSIG: dies with the launcher)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as started from a terminal
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        os.dup2(os.open(os.path.join(out, f"{name}.{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        cli.run_cli(case_main, name, rank, out)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    finally:
        sys.stderr.flush()
        os._exit(code)


def free_ports(n):
    """n ports free now, each different (held open together while the kernel picks them)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def main(results_path, names):
    out = os.path.dirname(os.path.abspath(results_path))
    began = time.monotonic()
    pids = {}  # case -> [pid of rank 0, pid of rank 1]
    for name, port in zip(names, free_ports(len(names))):
        pids[name] = [start_rank(name, rank, port, out) for rank in (0, 1)]
    codes, ended, since, sent = {}, {}, {}, set()  # pid -> exit code, when it ended; case -> when the count began
    try:
        while len(codes) < 2 * len(names) and time.monotonic() - began < DEADLINE_S:
            for name in names:
                case = CASES[name]
                waiter, stopper = pids[name][1 - case.stopper], pids[name][case.stopper]
                ready = os.path.join(out, f"{name}.ready")
                if name not in since and os.path.exists(ready):  # (a signal: since = when it is sent)
                    since[name] = os.stat(ready).st_mtime + (SETTLE_S if case.signal else 0.0)
                if case.signal and name not in sent and name in since and time.time() >= since[name]:
                    since[name] = time.time()
                    os.kill(waiter, getattr(signal, case.signal))
                    sent.add(name)
                if waiter in codes and stopper not in codes:  # the waiter is done: the stopper goes
                    os.kill(stopper, signal.SIGKILL)
            for pid in [p for pair in pids.values() for p in pair if p not in codes]:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid], ended[pid] = os.waitstatus_to_exitcode(status), time.time()
            time.sleep(0.05)
    finally:
        for pid in [p for pair in pids.values() for p in pair if p not in codes]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    results = {}
    for name in names:
        case = CASES[name]
        results[name] = {}
        for role, rank in (("waiter", 1 - case.stopper), ("stopper", case.stopper)):
            pid = pids[name][rank]
            with open(os.path.join(out, f"{name}.{rank}.err"), encoding="utf-8") as f:
                stderr = f.read()
            seconds = ended[pid] - since[name] if pid in ended and name in since else None
            results[name][role] = dict(rank=rank, code=codes.get(pid), stderr=stderr, seconds=seconds,
                                       ended=ended.get(pid))
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
