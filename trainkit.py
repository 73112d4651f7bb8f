"""
Shared training plumbing for train.py, vit_train.py and lra/train.py, kept in one place so
each trainer reads as the training loop and nothing else:

  configure        nanoGPT-style config: module globals, then config files, then --key=value,
                   with type checking and clear errors (ConfigError); --help lists them
  run_cli          a script's main(): config mistakes end in one line, not a traceback
  distributed      `with distributed(device) as d:` DDP from torchrun's environment variables
  save_checkpoint / load_checkpoint         atomic writes (stale temp files of killed saves
                   removed), CPU loads, a corrupt file named in a one-line error
  refuse_overwrite a scratch run never overwrites another run's checkpoint
  require          a setting's check: a ConfigError with its message when it fails
  rng_state / set_rng_state / gather_rng_states   every RNG a run touches (of every rank), for exact resume
  lr_at            warmup + cosine / linear / inverse-sqrt / constant schedules
  autocast_for     mixed precision context (+ GradScaler for float16)
  optimizer_step   unscale, clip, step, zero the gradients
  JsonlLogger      one JSON line per evaluation
  UserError        a mistake the user can fix: one line from run_cli, exit status 1
  choose_device_dtype   the one device / precision chooser ("auto" everywhere)

Conventions the three trainers share:
  batch_size                   examples (sequences, images) per process per micro-step
  gradient_accumulation_steps  micro-steps per optimizer step over ALL processes (as nanoGPT):
                               each of the world_size processes runs g / world_size of them, so
                               one step sees batch_size * g examples, whatever world_size is
  device, dtype                "auto" by default, resolved by choose_device_dtype
  checkpoint keys              model, optimizer, scaler, model_args, iter_num, best_val_loss,
                               config, rng (+ best_val_acc for classifiers)
  log record keys (jsonl)      iter, lr, train_loss, val_loss, time_s (+ val_acc for
                               classifiers, tokens_per_s and mfu for language)
"""

import ast
import difflib
import gc
import json
import math
import os
import random
import sys
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

# -----------------------------------------------------------------------------
# configuration


class UserError(Exception):
    """A mistake the person running a script can fix (a setting, a file, the data): run_cli
    prints its message as one line and exits with status 1, no traceback."""


class ConfigError(UserError, ValueError):
    """A config file or --key=value override that does not fit the script's settings."""


def _unknown_key(key, known):
    hint = difflib.get_close_matches(key, known, n=3)
    hint = f" Did you mean {', '.join(hint)}?" if hint else ""
    return ConfigError(f"unknown config key {key!r}.{hint} Known keys: {', '.join(sorted(known))}")


def coerce(key, value, default):
    """Turn `value` (a string from the command line, or any object from a config file) into
    the type of `default`, or raise ConfigError saying what was expected."""
    kind = type(default)
    if default is None and isinstance(value, str):  # no type to go by: a literal, else text
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    if default is None or not isinstance(value, str):
        if default is None or value is None or isinstance(value, kind):
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind in (tuple, list) and isinstance(value, (tuple, list)):
            return kind(value)
        raise ConfigError(f"config key {key!r} expects {kind.__name__} (default {default!r}), got {value!r}")
    text = value.strip()
    try:
        if kind is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            number = float(text) if any(c in text for c in ".eE") else int(text)
            if number != int(number):
                raise ValueError
            return int(number)
        if kind is float:
            return float(text)
        if kind is str:
            return text
        parsed = ast.literal_eval(text)  # tuples, lists, dicts
        if not isinstance(parsed, kind):
            raise ValueError
        return parsed
    except (ValueError, SyntaxError):
        raise ConfigError(f"config key {key!r} expects {kind.__name__} (default {default!r}), "
                          f"got {value!r}") from None


def configure(defaults, argv):
    """Settings from `defaults` (a dict of name -> value), overridden in order by each
    config file named in argv (a python file whose top-level assignments are settings) and
    each --key=value. Returns the new dict; raises ConfigError on anything unknown or mistyped."""
    if "--help" in argv or "-h" in argv:
        doc = sys.modules["__main__"].__doc__ or ""
        print(doc.rstrip() + "\n\nSettings (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
        raise SystemExit(0)
    config = dict(defaults)
    for arg in argv:
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                raise ConfigError(f"config file {arg!r} not found (positional arguments are config files; "
                                  "overrides are written --key=value)")
            scope = {}
            with open(arg) as f:
                exec(compile(f.read(), arg, "exec"), scope)
            for key, value in scope.items():
                if key.startswith("_") or callable(value) or type(value).__name__ == "module":
                    continue
                if key not in defaults:
                    raise _unknown_key(key, defaults)
                config[key] = coerce(key, value, defaults[key])
        else:
            key, sep, value = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"override {arg!r} must be written --key=value")
            if key not in defaults:
                raise _unknown_key(key, defaults)
            config[key] = coerce(key, value, defaults[key])
    return config


def require(condition, message):
    """Check a setting: raise ConfigError(message) when `condition` is false."""
    if not condition:
        raise ConfigError(message)


def run_cli(main, *args):
    """Run a script's main(*args) for a person at a terminal: a configuration mistake or a
    missing file ends the program with its one-line message (exit status 1), not a traceback."""
    try:
        return main(*args)
    except (UserError, FileNotFoundError) as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {e}")


def config_defaults(namespace):
    """The settings of a script: its module globals of plain types, not starting with _."""
    plain = (int, float, bool, str, tuple, list, type(None))
    return {k: v for k, v in namespace.items() if not k.startswith("_") and isinstance(v, plain)}


# -----------------------------------------------------------------------------
# distributed


@dataclass
class Dist:
    ddp: bool
    rank: int
    local_rank: int
    world_size: int
    device: str
    is_master: bool


@contextmanager
def distributed(device):
    """with distributed(device) as d: DDP from torchrun's RANK / LOCAL_RANK / WORLD_SIZE (nccl
    on CUDA, this rank's GPU; gloo on CPU), or one process on `device` (choose_device_dtype's
    choice) without torchrun; the process group is left at the end.
    A normal end first waits for every rank, so none tears its connections down while another
    still communicates (rank 0 saving a checkpoint); an error ends without waiting, since the
    other ranks may never come. Unreachable DDP wrappers are freed before the group goes (gc),
    while the interpreter is fully alive: gloo work they still own aborts the process if it is
    freed at exit."""
    if "RANK" not in os.environ:
        yield Dist(False, 0, 0, 1, device, True)
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available() and device.startswith("cuda")
    if use_cuda:
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    else:
        device = "cpu"
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
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


# -----------------------------------------------------------------------------
# checkpoints


def unwrap_model(model):
    """The plain nn.Module under DDP (.module) and torch.compile (._orig_mod) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def clean_state_dict(state_dict):
    """Strip the wrapper prefixes older checkpoints carry ('_orig_mod.', 'module.')."""
    out = {}
    for key, value in state_dict.items():
        for prefix in ("_orig_mod.", "module."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(folder, name):
    """Delete the temp files `.<name>.tmp<pid>` that saves of processes no longer alive left
    behind (a kill -9 mid-save): nothing else would ever remove them."""
    for entry in os.listdir(folder):
        head, sep, pid = entry.rpartition(".tmp")
        if sep and head == f".{name}" and pid.isdigit() and not _pid_alive(int(pid)):
            try:
                os.remove(os.path.join(folder, entry))
            except OSError:
                pass


def save_checkpoint(obj, path):
    """torch.save to a temporary file in the same folder (.<name>.tmp<pid>), fsync, then
    rename over `path`: a crash at any moment leaves either the old checkpoint or the new one,
    never half. Temp files that killed saves left behind are removed first."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_temps(folder, os.path.basename(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(folder, os.O_RDONLY)
        os.fsync(dir_fd)
        os.close(dir_fd)
    except OSError:
        pass


def load_checkpoint(path):
    """Load a checkpoint onto the CPU (move to the device after building the model). A file
    that is not a whole checkpoint (truncated, another format) is a UserError naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}: train first, or point out_dir / --ckpt at "
                                "the folder that holds ckpt.pt")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # zip errors, EOF, unpickling errors: all mean a damaged file
        raise UserError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e).split('. ')[0][:90]}): the file "
                        "is truncated or corrupt. Delete it and resume from a copy, or start again with "
                        "--init_from=scratch in a new out_dir") from None


def refuse_overwrite(out_dir):
    """A scratch run must not overwrite the checkpoint of another run (nor append to its log):
    a UserError naming the ways on if out_dir already holds a ckpt.pt."""
    path = os.path.join(out_dir, "ckpt.pt")
    if os.path.exists(path):
        raise UserError(f"{path} already exists and init_from='scratch' would overwrite it: continue that run "
                        "with --init_from=resume, or write this one elsewhere with --out_dir=<new folder> "
                        "(or delete the old one)")


# -----------------------------------------------------------------------------
# random number generators


def rng_state():
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def gather_rng_states(d):
    """Every rank's RNG state, as a list indexed by rank (a collective: all ranks call it)."""
    state = rng_state()
    if not d.ddp:
        return [state]
    states = [None] * d.world_size
    dist.all_gather_object(states, state)
    return states


def set_rng_state(state):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -----------------------------------------------------------------------------
# learning-rate schedule and mixed precision


def lr_at(it, *, lr, min_lr, warmup_iters, decay_iters, schedule="cosine"):
    """Linear warmup over warmup_iters, then decay to min_lr at decay_iters:
    "cosine" | "linear" | "invsqrt" (lr * sqrt(warmup / it)) | "constant"."""
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if schedule == "constant":
        return lr
    if schedule == "invsqrt":
        return max(min_lr, lr * math.sqrt(max(warmup_iters, 1) / max(it, 1)))
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(decay_iters - warmup_iters, 1)
    if schedule == "linear":
        return lr + ratio * (min_lr - lr)
    if schedule == "cosine":
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
    raise ConfigError(f"unknown lr schedule {schedule!r}; use cosine, linear, invsqrt or constant")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def choose_device_dtype(device, dtype):
    """The one device/precision chooser of the three trainers (and sample.py, bench.py).
    device: "auto" (this rank's GPU if CUDA is available, else cpu), "cpu", "cuda", "cuda:N".
    dtype: "auto" (bfloat16 on GPUs that have it, float16 on older GPUs, float32 on CPU), or
    one of float32 / bfloat16 / float16. Returns (device, dtype) as strings; a device that is
    not there is a UserError."""
    device = device or "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but this machine has no CUDA GPU (torch {torch.__version__}); "
                        "use --device=cpu or --device=auto")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UserError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    dtype = dtype or "auto"
    if dtype == "auto":
        if device.startswith("cuda"):
            dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dtype = "float32"
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    return device, dtype


def autocast_for(device, dtype):
    """(ctx, scaler): ctx() is the autocast context for forward passes; scaler a GradScaler
    for float16 (None otherwise). float16 on CPU falls back to bfloat16."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    if device_type == "cpu" and dtype == "float16":
        warnings.warn("float16 autocast is not supported on CPU; using bfloat16")
        dtype = "bfloat16"
    if device_type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        warnings.warn("this GPU has no bfloat16; using float16 with a GradScaler")
        dtype = "float16"
    scaler = torch.amp.GradScaler("cuda") if dtype == "float16" else None
    if dtype == "float32":
        return nullcontext, scaler
    return (lambda: torch.autocast(device_type=device_type, dtype=DTYPES[dtype])), scaler


def optimizer_step(optimizer, parameters, grad_clip=0.0, scaler=None):
    """One update from the accumulated gradients: unscale (fp16), clip the true gradient norm
    to grad_clip (0: no clipping), step, and clear the gradients."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    if scaler is not None:
        scaler.step(optimizer)  # skipped when the fp16 gradients overflowed
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# -----------------------------------------------------------------------------
# logging


class JsonlLogger:
    """Appends one JSON object per line to `path` (only where enabled, e.g. on rank 0)."""

    def __init__(self, path, enabled=True, fresh=False):
        """fresh=True starts a new file (a scratch run), else records are appended (resume)."""
        self.path, self.enabled = path, enabled
        if enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if fresh and os.path.exists(path):
                os.remove(path)

    def log(self, record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
