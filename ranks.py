"""
How a DDP rank ends when the other ranks are gone or stopped, so that a distributed run always
ends (trainkit.distributed puts every rank's work under no_endless_wait). A collective waits at
most the process group's timeout (the trainers' ddp_timeout_s); one that gave up, or found the
other ranks gone, is one line naming the rank, the collective and the script's line that ran it:

    train.py: rank 1 waited 600 s for the other ranks in all_reduce (trainkit.all_reduce_mean) at
    train.py:<line> (train_loss = tk.all_reduce_mean(loss_sum, d).item()) and gave up: ...

and an interrupt (torchrun's or a scheduler's SIGTERM, Ctrl-C) ends a rank within seconds even
while it waits in one (cli.interrupts_reach_c), with the same words for where it waited.
"""

import linecache
import os
import re
import sysconfig
import traceback
from contextlib import contextmanager

import torch
import torch.distributed as dist

import cli
from cli import UserError

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
    with cli.interrupts_reach_c(lambda frame: held_in(rank, frame)):
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
    cli.interrupts_reach_c's line."""
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
