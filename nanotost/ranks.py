"""
A run's processes: DDP ranks from torchrun, and how every rank ends when the others are gone,
stopped or interrupted, so that a distributed run always ends.

  distributed   DDP from torchrun's RANK / LOCAL_RANK / WORLD_SIZE (nccl on CUDA, gloo on the
                CPU), or one process without torchrun; every rank's work under no_endless_wait
  no_endless_wait  a collective waits at most the process group's timeout (the trainers'
                ddp_timeout_s); one that gave up, or found the other ranks gone, is one line
                naming the rank, the collective and the script's line that ran it:

    train.py: rank 1 waited 600 s for the other ranks in all_reduce (ranks.all_reduce_mean) at
    train.py:<line> (train_loss = tk.all_reduce_mean(loss_sum, d).item()) and gave up: ...

  interrupts_reach_c  an interrupt (torchrun's or a scheduler's SIGTERM, Ctrl-C) ends a rank within
                seconds even while its main thread is held in C code (a collective), with the
                same words for where it waited
  all_reduce_mean  a tensor's mean over the ranks
"""

import gc
import linecache
import os
import re
import signal
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections import namedtuple
from contextlib import contextmanager, suppress
from datetime import timedelta

import torch
import torch.distributed as dist

from nanotost import cli, portable
from nanotost.cli import UserError

TORCH = os.path.dirname(torch.__file__) + os.sep
DISTRIBUTED = (os.path.join(TORCH, "distributed") + os.sep, os.path.join(TORCH, "nn", "parallel") + os.sep)
LIBRARIES = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
HERE = os.path.dirname(os.path.abspath(__file__))
PLUMBING = {os.path.join(HERE, name): name[:-3] for name in ("trainkit.py", "cli.py", "ranks.py")}
BROKEN = r"gloo|timed? ?out|connection (closed|reset)"  # what gloo's errors of a broken group say


@contextmanager
def no_endless_wait(rank, timeout_s):
    """The block of DDP rank `rank`, whose process group gives up a wait after timeout_s: a
    collective that gave up or lost the other ranks becomes one line (UserError); an interrupt
    ends the rank even while it waits in one."""
    with interrupts_reach_c(lambda frame: held_in(rank, frame)):
        try:
            yield
        except RuntimeError as e:
            if not broken_group(e):
                raise
            raise UserError(lost_line(rank, timeout_s, e)) from e


def broken_group(e):
    """Whether `e` says that the ranks' group broke: a DistError (the store's, NCCL's), or one of
    gloo's RuntimeErrors raised in a collective (not, say, a DataLoader's timeout)."""
    in_collective = _collective(_frames(traceback.walk_tb(e.__traceback__)))[1] is not None
    return isinstance(e, dist.DistError) or (in_collective and re.search(BROKEN, str(e), re.IGNORECASE) is not None)


def lost_line(rank, timeout_s, e):
    """The line of a collective that failed with `e`: it gave up after timeout_s, or the other
    ranks were gone (one ended: its own output says why)."""
    frames = _frames(traceback.walk_stack(None))[::-1] + _frames(traceback.walk_tb(e.__traceback__))
    text = " ".join(str(e).split())
    if re.search(r"timed? ?out", text, re.IGNORECASE):
        return (f"rank {rank} waited {timeout_s:g} s for the other ranks {_place(frames)} and gave up: a rank stopped "
                "or fell behind (its output may say why; if it was only slow, e.g. saving a large checkpoint, raise "
                f"--ddp_timeout_s); {cli.left_behind()}")
    detail = re.split(r"\.\s", re.sub(r"^\[[^\]]*\]\s*", "", text))[0][:100]  # gloo's words, without its source file
    return (f"rank {rank} lost the other ranks {_place(frames)}: another rank ended ({detail}); its output says why; "
            f"{cli.left_behind()}")


def held_in(rank, frame):
    """What the main thread of rank `rank`, now at `frame` (its innermost), is held in: for
    ranks.interrupts_reach_c's line."""
    frames = _frames(traceback.walk_stack(frame))[::-1]  # (outermost first)
    if _collective(frames)[1] is None:
        return f"rank {rank} was held in C code {_place(frames)}"
    return f"rank {rank} waited for the other ranks {_place(frames)}"


def _frames(walk):
    """(file, line, qualified name) of each frame of a traceback.walk_* (3.11+: Class.method)."""
    return [(f.f_code.co_filename, line, getattr(f.f_code, "co_qualname", f.f_code.co_name)) for f, line in walk]


def _collective(frames):
    """(where, what): the collective a stack (outermost first) is in, the outermost function of
    torch.distributed or of DDP (their logging wrappers aside), or DDP's gradient all-reduce in
    a backward; (len(frames), None) when it is in none."""
    for i, (file, _, name) in enumerate(frames):
        if file.startswith(DISTRIBUTED) and "<locals>" not in name:
            return i, name.removesuffix(".__init__")
    for i, (file, _, name) in enumerate(frames):
        if file.startswith(TORCH) and name.endswith("backward"):
            return i, "backward (DDP's gradient all-reduce)"
    return len(frames), None


def _place(frames):
    """"in <collective> (<the plumbing function that ran it>) at <script>:<line> (<its code>)"."""
    at, collective = _collective(frames)
    words = [f"in {collective}"] if collective else []
    callers = [(file, name) for file, _, name in frames[:at] if not file.startswith(TORCH)]
    if collective and callers and callers[-1][0] in PLUMBING:  # trainkit's function that ran it, e.g. all_reduce_mean
        words.append(f"({PLUMBING[callers[-1][0]]}.{callers[-1][1]})")
    script = [(file, line) for file, line, _ in frames[:at] if file not in PLUMBING and not file.startswith(LIBRARIES)]
    if script:
        file, line = script[-1]
        code = linecache.getline(file, line).strip()
        words.append(f"at {cli.script_name(file)}:{line}" + (f" ({code})" if code else ""))
    return " ".join(words) or "(no frame of the script)"


INTERRUPT_GRACE_S = 2.0  # how long a main thread has to take an interrupt before interrupts_reach_c ends the process
_watched = [False]  # whether interrupts_reach_c's helper thread reads this process's signals now


def _unwatch_in_child():
    """A process forked inside interrupts_reach_c (a DataLoader worker) would write its own
    signals to the parent's helper thread (the wakeup socket is shared): a worker that the
    loader terminates would end the parent. The child has no helper: it writes nowhere."""
    if _watched[0]:
        _watched[0] = False
        with suppress(ValueError):  # (a fork from a thread the child does not take as its main one)
            signal.set_wakeup_fd(-1)


@contextmanager
def interrupts_reach_c(describe, grace_s=INTERRUPT_GRACE_S):
    """Within the block, Ctrl-C and SIGTERM end the process even while its main thread is held in
    C code: a DDP rank waiting in a collective for a rank that stopped. Python runs a signal
    handler only between the main thread's bytecodes, so KeyboardInterrupt would wait for the
    call to return (with gloo, until its timeout), and a launcher's SIGTERM would leave the rank
    running. The C-level handler still writes the signal's number to signal.set_wakeup_fd: a
    helper thread reads it, and when the main thread has not taken the interrupt within
    grace_s, the thread says so in one line, with describe(the main thread's innermost frame)
    saying what it is held in, and ends the process (os._exit(130): the main thread can run no
    Python). Signals ignored or at their default action (which ends a process) are left alone."""
    if threading.current_thread() is not threading.main_thread():  # (only the main thread sets handlers)
        yield
        return
    old = {s: signal.getsignal(s) for s in portable.INTERRUPTS if callable(signal.getsignal(s))}
    taken = [0]  # interrupts whose Python handler ran: the main thread took them

    def take(signum, frame):
        taken[0] += 1
        return old[signum](signum, frame)

    reader, writer = socket.socketpair()
    writer.setblocking(False)  # (the C-level handler must never block)
    for signum in old:
        signal.signal(signum, take)
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    _watched[0] = True
    helper = threading.Thread(target=_end_when_held, args=(reader, taken, describe, grace_s), daemon=True)
    helper.start()
    try:
        yield
    finally:
        _watched[0] = False
        signal.set_wakeup_fd(old_fd)
        for signum, handler in old.items():
            signal.signal(signum, handler)
        writer.send(b"\0")  # (no signal is numbered 0: the helper's cue to stop)
        helper.join()
        writer.close()


def _end_when_held(reader, taken, describe, grace_s):
    """interrupts_reach_c's helper thread: each interrupt the main thread has not taken within
    grace_s ends the process with one line (unless run_cli has said it already)."""
    heard = 0
    with reader:
        while True:
            data = reader.recv(64)
            if not data or 0 in data:  # the block ended
                return
            signums = [n for n in data if n in portable.INTERRUPTS]
            heard += len(signums)
            deadline = time.monotonic() + grace_s
            while signums and taken[0] < heard and time.monotonic() < deadline:
                time.sleep(0.05)
            if signums and taken[0] < heard and cli.first_to_say_interrupted():
                try:
                    held = describe(sys._current_frames().get(threading.main_thread().ident))
                except Exception:  # (a bug in describe must not keep the process alive)
                    held = "its main thread was held in C code"
                print(f"{cli.script_name(sys.argv[0])}: interrupted ({signal.Signals(signums[-1]).name}) while {held}; "
                      f"{cli.left_behind()}", file=sys.stderr, flush=True)
                os._exit(130)


if hasattr(os, "register_at_fork"):  # (Windows has no fork)
    os.register_at_fork(after_in_child=_unwatch_in_child)


Dist = namedtuple("Dist", "ddp rank local_rank world_size device is_master")  # what `distributed` yields
DDP_TIMEOUT_S = 600.0  # the trainers' ddp_timeout_s: how long a rank waits for the others at a collective
DDP_TIMEOUT_RANGE = (0.1, 7 * 24 * 3600.0)  # what ddp_timeout_s may be: seconds, up to a week


@contextmanager
def distributed(device, timeout_s=DDP_TIMEOUT_S):
    """DDP from torchrun's RANK / LOCAL_RANK / WORLD_SIZE (nccl on CUDA, gloo on CPU), or one
    process on `device` without torchrun. A normal end waits for every rank before leaving the
    group (rank 0 may still be saving); an error leaves without waiting. DDP wrappers are freed
    (gc) while the interpreter is alive: gloo work freed at exit aborts the process. No rank
    waits for ever (no_endless_wait): every collective gives up after timeout_s with one line naming
    the rank and the collective, and an interrupt ends a rank even while it waits in one."""
    if "RANK" not in os.environ:
        yield Dist(False, 0, 0, 1, device, True)
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    use_cuda = device.startswith("cuda")
    device = f"cuda:{local_rank}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(device)
    with no_endless_wait(rank, timeout_s):
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s))
        normal_end = False
        try:
            yield Dist(True, rank, local_rank, int(os.environ["WORLD_SIZE"]), device, rank == 0)
            normal_end = True
        finally:
            if dist.is_initialized():
                if normal_end:
                    dist.barrier()
                gc.collect()
                dist.destroy_process_group()


def all_reduce_mean(tensor, d):
    """Mean of `tensor` over all ranks (unchanged when not distributed)."""
    if d.ddp:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= d.world_size
    return tensor
