"""
tests/test_auto.py's two torchrun ranks of one node (gloo, CPU). Torch is imported once and each
rank forked from this process (tests/helpers_ranks.py's way: an interpreter and torch per rank
would cost seconds of CPU each), with the environment torchrun gives it (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and one cache folder. Each builds a tiny
ToST GPT inside ranks.distributed and calls kernels.use(..., "auto", timed_at=...), as
train.py does, then runs it. The Triton kernels pass the check (mocked: nothing interpreted);
the ranks' timers are mocked to disagree (rank 0: Triton the faster, rank 1: the reference),
so ranks that agree on Triton ran rank 0's pick. Rank 0's timer answers only once rank 1 waits
for the pick's file (a deadline, not a race: rank 1 is seen to wait). Writes
{rank: {timed, waited, picks, said, gathered}} as JSON to OUT.

    python tests/auto_ranks.py OUT.json
"""

import contextlib
import io
import json
import os
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import kernels  # noqa: E402
import model  # noqa: E402
from helpers_ranks import free_ports  # noqa: E402
from kernels import auto, auto_cache  # noqa: E402
from nanotost import ranks  # noqa: E402

TIMES = {0: {"triton": 1e-3, "reference": 2e-3}, 1: {"triton": 3e-3, "reference": 2e-3}}  # each rank's own timing
DEADLINE_S = 120.0  # the longest rank 0 waits for rank 1 to wait (a loaded machine), and the launcher for both


def rank_main(rank, folder):
    """One rank: the pick of its model's shape class, and what it timed, waited for and said."""
    timed, waited, rank1_waits = [], [], os.path.join(folder, "rank1.waits")

    def seconds(candidate, run, device, calls, rounds):
        timed.append(candidate)
        deadline = time.monotonic() + DEADLINE_S
        while rank == 0 and not os.path.exists(rank1_waits) and time.monotonic() < deadline:
            time.sleep(0.01)
        return TIMES[rank][candidate]

    def wait(*args, real=auto_cache.wait, **kwargs):
        waited.append(True)
        open(rank1_waits, "w").close()
        return real(*args, **kwargs)
    auto.triton_refusal, auto.seconds, auto_cache.wait = (lambda device: None), seconds, wait
    out = io.StringIO()
    with contextlib.redirect_stdout(out), ranks.distributed("cpu", DEADLINE_S):
        torch.manual_seed(0)
        cfg = model.GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=2, n_embd=16)
        m = kernels.use(model.GPT(cfg), "auto", timed_at=(2, 32, "float32", False))
        m(torch.randint(0, 64, (2, 32)))
        picks = list(auto._PICKS.values())
        gathered = [None, None]
        dist.all_gather_object(gathered, picks)
    said = [line for line in out.getvalue().splitlines() if line.startswith("tssa_impl=auto")]
    return dict(timed=timed, waited=bool(waited), picks=picks, said=said, gathered=gathered)


def start_rank(rank, port, folder):
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NANOTOST_CACHE=os.path.join(folder, "cache"))
        torch.set_num_threads(1)
        result = rank_main(rank, folder)
        with open(os.path.join(folder, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)
        code = 0
    except BaseException as e:  # noqa: BLE001 (said on stderr, as the rank's exit status)
        print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        sys.stderr.flush()
        os._exit(code)


def main(out_path):
    with tempfile.TemporaryDirectory() as folder:
        port, = free_ports(1)
        pids = [start_rank(rank, port, folder) for rank in (0, 1)]
        codes, deadline = {}, time.monotonic() + 2 * DEADLINE_S
        while len(codes) < 2 and time.monotonic() < deadline:
            for pid in pids:
                if pid not in codes and os.waitpid(pid, os.WNOHANG)[0]:
                    codes[pid] = True
            time.sleep(0.05)
        for pid in pids:
            if pid not in codes:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        results = {}
        for rank in (0, 1):
            path = os.path.join(folder, f"rank{rank}.json")
            if not os.path.exists(path):
                sys.exit(f"rank {rank} wrote no result")
            with open(path, encoding="utf-8") as f:
                results[str(rank)] = json.load(f)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
