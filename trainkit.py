"""
Plumbing shared by the scripts (the three trainers, sample.py, evaluate.py, the preparation
scripts, bench.py, ...), kept here so that each script reads as its story:

  the one error path   run_cli: a mistake the user can fix (UserError), a file-system error, a
                       config file that does not run, Ctrl-C / SIGTERM -> one line, exit 1 (130
                       for an interrupt); real bugs keep their traceback (NANOTOST_DEBUG=1: all)
  settings             configure (module globals, config files, --key=value), check, require
  devices, processes   choose_device_dtype ("auto" everywhere), distributed (DDP from torchrun)
  files, checkpoints   claim_out_dir (a lock that run_cli releases; no scratch run over a
                       checkpoint), atomic_write, save_checkpoint / load_checkpoint, JsonlLogger
  training             resume_settings, get_lr, non_finite, gather_rng_states / restore_rng
"""

import ast
import difflib
import errno
import fcntl
import gc
import json
import math
import os
import random
import signal
import sys
import traceback
from collections import namedtuple
from contextlib import contextmanager, suppress
import dataclasses
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

# -----------------------------------------------------------------------------
# one error path


class UserError(Exception):
    """A mistake the person running a script can fix: run_cli prints it as one line."""


class ConfigError(UserError, ValueError):
    """A config file or --key=value that does not fit the script's settings."""


_on_interrupt = ["nothing was saved"]  # what an interrupt leaves behind: scripts update it


def on_interrupt(text):
    """Say what an interrupt now leaves behind (e.g. which checkpoint, how to continue)."""
    _on_interrupt[0] = text


def _os_error_line(e):
    what = e.strerror or str(e)
    where = f" {e.filename!r}" if e.filename else ""
    advice = {"ENOSPC": "free some space or write elsewhere", "EACCES": "check its permissions or write elsewhere",
              "EROFS": "write elsewhere", "EISDIR": "give a file, not a folder",
              "ENOTDIR": "a file stands where a folder is expected: move it or choose another path",
              "ENOENT": "check the path"}
    return f"{what}:{where}: {advice.get(errno.errorcode.get(e.errno, ''), 'check the path')}"


def run_cli(main, *args):
    """Run a script's main(*args) for a person at a terminal (see the module docstring)."""
    parts = os.path.normpath(sys.argv[0]).split(os.sep)
    name = "/".join(parts[-2:]) if parts[-2:-1] == ["lra"] else parts[-1]  # train.py, lra/train.py
    if os.environ.get("NANOTOST_DEBUG"):
        return main(*args)
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM (a scheduler, kill) ends as Ctrl-C
    _on_interrupt[0] = "nothing was saved"
    try:
        return main(*args)
    except UserError as e:
        sys.exit(f"{name}: {e}")
    except OSError as e:
        sys.exit(f"{name}: {_os_error_line(e)}")
    except UnicodeDecodeError as e:  # a text file that is not UTF-8 (scripts name the file where they can)
        sys.exit(f"{name}: a file is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                 "convert it first, e.g. iconv -f <encoding> -t utf-8")
    except KeyboardInterrupt:
        print(f"{name}: interrupted; {_on_interrupt[0]}", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, old)
        for out_dir in list(_locks):  # the run is over, however it ended
            release_out_dir(out_dir)


def require(condition, message):
    """Check a setting: raise ConfigError(message) when `condition` is false."""
    if not condition:
        raise ConfigError(message)


def check(C, *, at_least_1=(), non_negative=(), positive=(), fraction=(), choices=None):
    """Check settings of C by kind: at_least_1 (counts, sizes, intervals), non_negative,
    positive, fraction (in [0, 1)) and choices {key: allowed values}."""
    for key in at_least_1:
        require(getattr(C, key) >= 1, f"{key} must be at least 1, got {getattr(C, key)}")
    for key in non_negative:
        require(getattr(C, key) >= 0, f"{key} must not be negative, got {getattr(C, key)}")
    for key in positive:
        require(getattr(C, key) > 0, f"{key} must be positive, got {getattr(C, key)}")
    for key in fraction:
        require(0 <= getattr(C, key) < 1, f"{key} must be in [0, 1), got {getattr(C, key)}")
    for key, allowed in (choices or {}).items():
        require(getattr(C, key) in allowed,
                f"{key} must be one of {', '.join(map(str, allowed))}, got {getattr(C, key)!r}")


# -----------------------------------------------------------------------------
# settings


def coerce(key, value, default):
    """`value` (text from the command line, or a config file's object) as the type of
    `default`, or a ConfigError saying what was expected. Floats must be finite."""
    kind = type(default)
    if isinstance(value, str) and kind is not str:
        text = value.strip()
        try:
            if kind is bool:
                value = {"1": True, "true": True, "yes": True, "on": True,
                         "0": False, "false": False, "no": False, "off": False}[text.lower()]
            elif kind is int:
                number = float(text) if any(c in text for c in ".eE") else int(text)
                value = int(number) if number == int(number) else text
            elif kind is float:
                value = float(text)
            else:
                value = ast.literal_eval(text)  # tuples, lists
        except (ValueError, SyntaxError, KeyError, OverflowError):
            pass
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind in (tuple, list) and isinstance(value, (tuple, list)):
        value = kind(value)
    if type(value) is not kind:
        raise ConfigError(f"{key} expects {kind.__name__} (default {default!r}), got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return value


def _read_config_file(path):
    """The top-level assignments of a config file; any error in it is one line path:line."""
    if os.path.isdir(path):
        raise ConfigError(f"{path} is a folder, not a config file (a Python file of `key = value` lines)")
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} not found (positional arguments are config files; "
                          "settings are written --key=value)")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        scope = {}
        exec(compile(text, path, "exec"), scope)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): a config file is Python source") from None
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: {e.msg}: a config file is Python source, "
                          "one `key = value` a line") from None
    except Exception as e:  # NameError, ImportError, ...: the line of the config file that raised
        line = next((fr.lineno for fr in reversed(traceback.extract_tb(e.__traceback__)) if fr.filename == path), "?")
        raise ConfigError(f"{path}:{line}: {type(e).__name__}: {e}") from None
    return {k: v for k, v in scope.items()
            if not (k.startswith("_") or callable(v) or type(v).__name__ == "module")}


def configure(defaults, argv):
    """Settings from `defaults` (name -> value), overridden in order by each config file in
    argv and each --key=value. Returns (C, given): the settings as attributes, and the set of
    keys a config file or the command line set. --help lists the settings."""
    if "--help" in argv or "-h" in argv:
        doc = sys.modules["__main__"].__doc__ or ""
        print(doc.rstrip() + "\n\nSettings (defaults):\n" + "\n".join(f"  --{k}={v!r}" for k, v in defaults.items()))
        raise SystemExit(0)
    config, given = dict(defaults), set()
    for arg in argv:
        if arg.startswith("--"):
            key, sep, value = arg[2:].partition("=")
            if not sep:
                raise ConfigError(f"{arg!r} must be written --key=value")
            pairs = {key: value}
        else:
            pairs = _read_config_file(arg)
        for key, value in pairs.items():
            if key not in defaults:
                hint = difflib.get_close_matches(key, defaults, n=3)
                hint = f" Did you mean {', '.join(hint)}?" if hint else ""
                raise ConfigError(f"unknown setting {key!r}.{hint} Known settings: {', '.join(sorted(defaults))}")
            config[key] = coerce(key, value, defaults[key])
            given.add(key)
    return SimpleNamespace(**config), given


def config_defaults(namespace):
    """The settings of a script: its module globals of plain types, not starting with _."""
    plain = (int, float, bool, str, tuple, list)
    return {k: v for k, v in namespace.items() if not k.startswith("_") and isinstance(v, plain)}


# -----------------------------------------------------------------------------
# devices and processes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def choose_device_dtype(device, dtype):
    """device: "auto" (a GPU if there is one), "cpu", "cuda", "cuda:N"; dtype: "auto" (bfloat16
    on GPUs that have it, float16 on older ones, float32 on CPU) or one of DTYPES. float16 on
    CPU becomes bfloat16. Returns (device, dtype) as strings."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    require(device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()),
            f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but this machine has no CUDA GPU (torch {torch.__version__}); "
                        "use --device=cpu or --device=auto")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s)")
    require(dtype == "auto" or dtype in DTYPES, f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if device != "cpu" else "float32"
    if device == "cpu" and dtype == "float16":
        dtype = "bfloat16"  # CPU autocast has no float16 with a GradScaler
    return device, dtype


Dist = namedtuple("Dist", "ddp rank local_rank world_size device is_master")  # what `distributed` yields


@contextmanager
def distributed(device):
    """DDP from torchrun's RANK / LOCAL_RANK / WORLD_SIZE (nccl on CUDA, gloo on CPU), or one
    process on `device` without torchrun. A normal end waits for every rank before leaving the
    group (rank 0 may still be saving); an error leaves without waiting. DDP wrappers are freed
    (gc) while the interpreter is alive: gloo work freed at exit aborts the process."""
    if "RANK" not in os.environ:
        yield Dist(False, 0, 0, 1, device, True)
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    use_cuda = device.startswith("cuda")
    device = f"cuda:{local_rank}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(device)
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
# files, checkpoints and logs

_locks = {}  # out_dir -> its open descriptor, locked while this process lives


def claim_out_dir(out_dir, init_from):
    """Lock out_dir for this run (flock on the folder itself: nothing is written, and the OS
    frees it when the process ends, however it ends); refuse a scratch run over an existing
    checkpoint. Rank 0 only."""
    os.makedirs(out_dir, exist_ok=True)
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UserError(f"{out_dir} is in use by another run: wait for it to end, or write this run elsewhere "
                        "with --out_dir=<new folder>") from None
    _locks[os.path.abspath(out_dir)] = fd
    ckpt = os.path.join(out_dir, "ckpt.pt")
    if init_from != "resume" and os.path.exists(ckpt):
        raise UserError(f"{ckpt} already exists and init_from={init_from!r} would overwrite it: continue that run "
                        "with --init_from=resume, or write this one elsewhere with --out_dir=<new folder>")


def release_out_dir(out_dir):
    fd = _locks.pop(os.path.abspath(out_dir), None)
    if fd is not None:
        os.close(fd)


@contextmanager
def atomic_write(path, mode="wb"):
    """with atomic_write(path) as f: ... -- written to .<name>.tmp<pid> beside path, flushed to
    disk and renamed over path only if the block ends normally; otherwise the temp file goes
    and path is untouched. Temp files of dead processes (kill -9) are removed first."""
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    for entry in os.listdir(folder):
        head, sep, pid = entry.rpartition(".tmp")
        if sep and head == f".{name}" and pid.isdigit() and not pid_alive(int(pid)):
            with suppress(OSError):
                os.remove(os.path.join(folder, entry))
    tmp = os.path.join(folder, f".{name}.tmp{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.remove(tmp)
        raise


def pid_alive(pid):
    """Whether process `pid` is alive (signal 0 sends nothing: it only asks)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def save_checkpoint(obj, path):
    """torch.save through atomic_write: a crash at any moment leaves the old checkpoint or the new."""
    with atomic_write(path) as f:
        torch.save(obj, f)


KIND_MAKER = {"language": "train.py", "vit": "vit_train.py", "lra": "lra/train.py"}
CKPT_FIELDS = ("kind", "model", "model_args", "config", "iter_num")  # what every checkpoint of this version holds
KIND_FIELDS = {"language": ("tokenizer",), "vit": (), "lra": ()}


def load_checkpoint(path, kind):
    """A checkpoint of `kind`, loaded onto the CPU. A missing, damaged or other-kind file, or
    one without the fields this version writes, is a UserError naming it."""
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: give the folder or file of a checkpoint that "
                        f"{KIND_MAKER[kind]} wrote, or train one first")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        fields = set(ckpt)
    except Exception as e:  # zip errors, EOF, unpickling errors, not a dict: a damaged file
        raise UserError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e).split('. ')[0][:90]}): the "
                        "file is truncated or corrupt; delete it, or start a new run in another out_dir") from None
    found = ckpt.get("kind")
    if found in KIND_MAKER and found != kind:
        raise UserError(f"{path} is a {found} checkpoint (written by {KIND_MAKER[found]}), not "
                        f"{'an' if kind == 'lra' else 'a'} {kind} one: give a checkpoint that {KIND_MAKER[kind]} wrote")
    missing = [f for f in CKPT_FIELDS + KIND_FIELDS[kind] if f not in fields]
    if missing:
        raise UserError(f"{path} was not written by this version of {KIND_MAKER[kind]} (it lacks "
                        f"{', '.join(missing)}): train a new one with {KIND_MAKER[kind]}")
    return ckpt


def model_config(config_cls, ckpt, path):
    """config_cls(**ckpt["model_args"]), or one line if the checkpoint's architecture fields are
    not this version's (written by an older version)."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(ckpt["model_args"]) - known)
    if unknown:
        raise UserError(f"{path} was written by another version of nanoToST (model_args {', '.join(unknown)} are "
                        f"not {config_cls.__name__} fields): train a new one with this version")
    return config_cls(**ckpt["model_args"])


class JsonlLogger:
    """One JSON object per line appended to `path` (where enabled, e.g. on rank 0); fresh=True
    starts a new file (a scratch run)."""

    def __init__(self, path, enabled=True, fresh=False):
        self.path, self.enabled = path, enabled
        if enabled and fresh and os.path.exists(path):
            os.remove(path)

    def log(self, record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


# -----------------------------------------------------------------------------
# training: resume, the learning-rate schedule, a non-finite loss, the RNGs


def check_resume(ckpt, C, given, keys, path):
    """A resumed run keeps the checkpoint's architecture: refuse settings given on the command
    line or in a config file that differ from it (the `keys` of ckpt["config"])."""
    old = ckpt["config"]
    differ = [k for k in keys if k in given and k in old and getattr(C, k) != old[k]]
    if differ:
        pairs = ", ".join(f"{k}={getattr(C, k)!r} (checkpoint: {old[k]!r})" for k in differ)
        raise UserError(f"{path} was trained with other settings: {pairs}; drop them to resume it, "
                        "or start a new run with --out_dir=<new folder>")


def resume_settings(ckpt, C, given, keys, path):
    """A resumed run is the checkpoint's run: refuse settings given that differ from it
    (check_resume), then take the checkpoint's values of `keys` (architecture, seed, data)."""
    check_resume(ckpt, C, given, keys, path)
    missing = [k for k in keys if k not in ckpt["config"]]
    if missing:
        raise UserError(f"{path} was written by another version of nanoToST (its settings lack "
                        f"{', '.join(missing)}): start a new run with --out_dir=<new folder>")
    for key in keys:
        setattr(C, key, ckpt["config"][key])


def get_lr(it, C):
    """Linear warmup over warmup_iters, then decay to min_lr at lr_decay_iters (0: max_iters)
    by a cosine, a straight line, or not at all ("constant"). "invsqrt" (lra/configs/listops_*)
    decays as 1 / sqrt(it) from the end of the warmup, never below min_lr, and ignores
    lr_decay_iters. The three trainers use it."""
    if it < C.warmup_iters:
        return C.learning_rate * (it + 1) / (C.warmup_iters + 1)
    decay_iters = C.lr_decay_iters or C.max_iters
    if C.lr_schedule == "constant":
        return C.learning_rate
    if C.lr_schedule == "invsqrt":
        return max(C.min_lr, C.learning_rate * math.sqrt(max(C.warmup_iters, 1) / max(it, 1)))
    if it >= decay_iters:
        return C.min_lr
    ratio = (it - C.warmup_iters) / max(decay_iters - C.warmup_iters, 1)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if C.lr_schedule == "cosine" else 1.0 - ratio  # 1 -> 0
    return C.min_lr + coeff * (C.learning_rate - C.min_lr)


def non_finite(what, ckpt_path, C, dtype):
    """The error of a non-finite loss (`what`: which loss, where, what was not done): what is
    left, and only advice that would change something."""
    where = f"{ckpt_path} is the last good checkpoint" if os.path.isfile(ckpt_path) else "nothing was saved"
    return UserError(f"non-finite {what}; {where}. Try a lower --learning_rate"
                     + (", --grad_clip=1.0" if C.grad_clip == 0 else "")
                     + (", --dtype=bfloat16 or float32" if dtype == "float16" else ""))


def gather_rng_states(d):
    """Every rank's RNG state, a list indexed by rank (a collective: all ranks call it)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if not d.ddp:
        return [state]
    states = [None] * d.world_size
    dist.all_gather_object(states, state)
    return states


def restore_rng(states, d, say):
    """Each rank takes back its RNG state; on another number of processes they start afresh."""
    if len(states) != d.world_size:
        say(f"resume: the checkpoint ran on {len(states)} process(es), this run on {d.world_size}: the RNGs "
            "start afresh (dropout masks and augmentations differ from an uninterrupted run)")
        return
    state = states[d.rank]
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
