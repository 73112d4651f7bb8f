"""
The trainers' plumbing (train.py, vit_train.py, lra/train.py; sample.py, evaluate.py and
bench.py use parts), kept here so that each trainer reads as its story. The error path and
the settings of every script are cli.py's.

  devices, processes   choose_device_dtype ("auto" everywhere), distributed (DDP from torchrun; no
                       rank waits for ever: ranks.py),
                       cpu_cores, hub_reachable (offline: the Hugging Face libraries fail at once)
  files, checkpoints   claim_out_dir (a lock that run_cli releases; no scratch run over a
                       checkpoint), save_checkpoint (through cli.atomic_write: a full
                       disk is an OSError naming it) / load_checkpoint (plain data alone, read with
                       weights_only: nothing in a file runs; a file of another format named for what
                       it is; what it holds checked by checkpoints.py before any use) / load_weights,
                       JsonlLogger (a resumed run's log holds each iteration once)
  training             init_from_auto, take_settings (a resumed or fine-tuned run's settings from its
                       checkpoint), get_lr, non_finite, gather_rng_states / restore_rng
  MFU                  flops_per_token, estimate_mfu (against the GPU's peak, PEAK_FLOPS)
"""

import errno
import gc
import json
import math
import os
import pickle
import random
import re
import shutil
import socket
import sys
from collections import namedtuple
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import checkpoints
import cli
import model
import plaindata
import ranks
from checkpoints import KIND_MAKER
from cli import UserError, atomic_write, require

# -----------------------------------------------------------------------------
# devices and processes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mps_available():
    """Whether this torch can run on Apple silicon's GPU (Metal Performance Shaders)."""
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def choose_device_dtype(device, dtype):
    """device: "auto" (CUDA, else Apple's MPS, else the CPU), "cpu", "cuda", "cuda:N", "mps";
    dtype: "auto" (bfloat16 on CUDA GPUs that have it, float16 on older ones, float32 on the
    CPU and on MPS, which runs it on every macOS) or one of DTYPES. float16 on CPU becomes
    bfloat16. Returns (device, dtype) as strings."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if mps_available() else "cpu"
    require(device in ("cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit()),
            f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={device!r} but this machine has no CUDA GPU (torch {torch.__version__}); "
                        "use --device=cpu or --device=auto")
    if device == "mps" and not mps_available():
        raise UserError(f"device='mps' but this torch ({torch.__version__}) sees no Apple silicon GPU; "
                        "use --device=cpu or --device=auto")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s)")
    require(dtype == "auto" or dtype in DTYPES, f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto" and device.startswith("cuda"):
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif dtype == "auto":  # the CPU, MPS
        dtype = "float32"
    if device == "cpu" and dtype == "float16":
        dtype = "bfloat16"  # CPU autocast has no float16 with a GradScaler
    return device, dtype


Dist = namedtuple("Dist", "ddp rank local_rank world_size device is_master")  # what `distributed` yields
DDP_TIMEOUT_S = 600.0  # the trainers' ddp_timeout_s: how long a rank waits for the others at a collective
DDP_TIMEOUT_RANGE = (0.1, 7 * 24 * 3600.0)  # what ddp_timeout_s may be: seconds, up to a week


@contextmanager
def distributed(device, timeout_s=DDP_TIMEOUT_S):
    """DDP from torchrun's RANK / LOCAL_RANK / WORLD_SIZE (nccl on CUDA, gloo on CPU), or one
    process on `device` without torchrun. A normal end waits for every rank before leaving the
    group (rank 0 may still be saving); an error leaves without waiting. DDP wrappers are freed
    (gc) while the interpreter is alive: gloo work freed at exit aborts the process. No rank
    waits for ever (ranks.py): every collective gives up after timeout_s with one line naming
    the rank and the collective, and an interrupt ends a rank even while it waits in one."""
    if "RANK" not in os.environ:
        yield Dist(False, 0, 0, 1, device, True)
        return
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    use_cuda = device.startswith("cuda")
    device = f"cuda:{local_rank}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(device)
    with ranks.no_endless_wait(rank, timeout_s):
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


def cpu_cores():
    """The CPU cores this process may run on (its affinity: a container's or a job's share), for
    default worker counts."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def hub_reachable(timeout=3.0):
    """Whether the Hugging Face Hub answers (a short probe). When it does not, its libraries are
    put in offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): a cached copy still loads, and a
    missing one fails at once instead of after ~25 s of retries. Call it before loading from the
    Hub; offline settings or a proxy in the environment are left to the libraries."""
    env = os.environ
    if any(env.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return env.get("HF_HUB_OFFLINE", "0") in ("", "0") and env.get("HF_DATASETS_OFFLINE", "0") in ("", "0")
    host = env.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host.split(":")[0], 443), timeout=timeout).close()
        return True
    except OSError:
        env["HF_HUB_OFFLINE"] = env["HF_DATASETS_OFFLINE"] = "1"
        for module, name in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE")):
            if module in sys.modules:  # already imported: they read the variable at import
                setattr(sys.modules[module], name, True)
        return False


def all_reduce_mean(tensor, d):
    """Mean of `tensor` over all ranks (unchanged when not distributed)."""
    if d.ddp:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor /= d.world_size
    return tensor


# -----------------------------------------------------------------------------
# files, checkpoints and logs

def claim_out_dir(out_dir, init_from):
    """Lock out_dir for this run (cli.claim_output: a flock on the folder, freed by run_cli or the
    end of the process); refuse a scratch run over an existing checkpoint. Rank 0 only."""
    cli.claim_output(out_dir, "--out_dir=<new folder>", folder=True)
    ckpt = os.path.join(out_dir, "ckpt.pt")
    if init_from != "resume" and os.path.exists(ckpt):
        raise UserError(f"{ckpt} already exists and init_from={init_from!r} would overwrite it: continue that run "
                        "with --init_from=resume, or write this one elsewhere with --out_dir=<new folder>")


def release_out_dir(out_dir):
    cli.release_output(out_dir)


def save_checkpoint(obj, path):
    """torch.save through atomic_write: a crash at any moment leaves the old checkpoint or the new.
    A full disk is an OSError naming path: seen before writing (free space against the tensors'
    bytes), or while writing (torch's zip writer reports it as a RuntimeError, "unexpected pos").
    Only plain data is written (plaindata.not_plain): what load_checkpoint reads back, from anyone, unrun."""
    stray = plaindata.not_plain(obj)
    if stray:
        raise UserError(f"{path} was not written: {stray}, and a checkpoint holds plain data alone (tensors, numbers, "
                        "strings, lists, dicts) so that anyone can load it without running code: store it as such")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    need, free = plaindata.tensor_bytes(obj), shutil.disk_usage(folder).free
    if need > free:
        raise OSError(errno.ENOSPC, f"No space left on device (the checkpoint needs {need:,} bytes, {free:,} are "
                                    "free)", path)
    try:
        with atomic_write(path) as f:
            torch.save(obj, f)
    except RuntimeError as e:
        cause = e.__context__
        if isinstance(cause, KeyboardInterrupt):  # Ctrl-C / SIGTERM while torch's writer ran: an interrupt, not a fault
            raise KeyboardInterrupt from None
        if isinstance(cause, OSError):  # the file's own error, under torch's
            raise OSError(cause.errno, cause.strerror or str(cause), path) from e
        if "inline_container" in str(e) or "PytorchStreamWriter" in str(e):
            raise OSError(errno.ENOSPC, f"No space left on device? torch's writer failed ({str(e)[:80]}), with "
                                        f"{shutil.disk_usage(folder).free:,} bytes free", path) from e
        raise


def load_checkpoint(path, kind, use="weights"):
    """A checkpoint of `kind` (a file, or the folder of its ckpt.pt), loaded onto the CPU as plain
    data (plaindata.read) and checked for `use` (checkpoints.check): "weights" (scoring, sampling,
    inspecting, fine-tuning) or "resume". Anything else is a UserError naming the file: missing,
    damaged, a file of another format (named for what it is), code or objects, another kind, a
    field missing or not what it must be."""
    if os.path.isdir(path):
        path = os.path.join(path, "ckpt.pt")
    maker, folder = KIND_MAKER[kind], os.path.dirname(path) or "."
    if not os.path.isfile(path) and os.path.isfile(os.path.join(folder, "model.safetensors")):
        raise UserError(f"{folder} holds model.safetensors and no ckpt.pt: a model exported to share, not a "
                        f"training run; {plaindata.HUB_FOLDER}")
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}: give the folder or file of a checkpoint that {maker} wrote, "
                        "or train one first")
    other = plaindata.other_format(path)
    if other:
        raise UserError(f"{path} is {other[0]}, not a checkpoint (the ckpt.pt that {maker} writes): "
                        f"{other[1] or f'give a checkpoint that {maker} wrote'}")
    ckpt = read_plain(path, maker)
    if not isinstance(ckpt, dict):  # torch.save of a bare tensor, a list: no checkpoint's fields
        raise UserError(f"{path} holds a {type(ckpt).__name__}, not a checkpoint (a dict of kind, model, model_args, "
                        f"config, iter_num): give a checkpoint that {maker} wrote")
    if plaindata.weights_alone(ckpt):
        raise UserError(f"{path} holds weights alone ({len(ckpt)} tensors: a bare state_dict, as "
                        "torch.save(model.state_dict()) writes), and nothing says which model they fit: give the "
                        f"ckpt.pt that {maker} wrote (its weights with model_args and the run's settings)")
    checkpoints.check(ckpt, kind, use, path, optimizer_for=lambda module: configure_adamw(module, 0.0, 1.0, (0.9, 0.9)))
    return ckpt


def read_plain(path, maker):
    """plaindata.read(path), or one line: a damaged file, or one that holds code or objects."""
    try:
        ckpt, stray = plaindata.read(path), None
    except pickle.UnpicklingError as e:  # weights_only refused a global (a function, a class) or what needs one
        found = re.search(r"GLOBAL (\S+)", str(e))
        ckpt, stray = None, f"GLOBAL {found.group(1)}" if found else "pickle instructions that are not data"
    except Exception as e:  # zip errors, EOF: a damaged file
        raise UserError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e).split('. ')[0][:90]}): the "
                        "file is truncated or corrupt; delete it, or start a new run in another out_dir") from None
    stray = stray or plaindata.not_plain(ckpt)  # (an array outside an earlier version's RNG states, say)
    if stray:
        raise UserError(f"{path} holds code or objects that no checkpoint of this version holds ({stray}): it was "
                        f"refused, nothing in it was run; give a checkpoint that {maker} wrote")
    return ckpt


def load_weights(module, state, path):
    """module.load_state_dict(state), the weights of an earlier version under their new names
    (checkpoints.RENAMED), or one line when the checkpoint's weights are not this version's (other
    names or shapes: written by another version of nanoToST)."""
    try:
        module.load_state_dict(checkpoints.renamed(state, module.state_dict()))
    except RuntimeError as e:
        detail = " ".join(str(e).split())
        raise UserError(f"{path} holds weights this version's {type(module).__name__} does not have "
                        f"({detail[detail.find(':') + 1:][:120].strip()}...): it was written by another version of "
                        "nanoToST; train a new one") from None


def start_wandb(project, name, config):
    """A wandb run (train.py's wandb_log=True; a resumed run continues its own), or one line without wandb."""
    try:
        import wandb
    except ImportError:
        raise UserError("wandb_log=True needs wandb: pip install wandb (or --wandb_log=False)") from None
    wandb.init(project=project, name=name, config=config, resume="allow")
    return wandb


class JsonlLogger:
    """One JSON object per line appended to `path` (where enabled, e.g. on rank 0); fresh=True
    starts a new file (a scratch run); resume_at=N keeps what a run logged before the checkpoint
    it resumes from (iterations before N, and the evaluation at N), since the resumed run logs
    the rest again: each iteration is in the file once, however often a run was interrupted."""

    def __init__(self, path, enabled=True, fresh=False, resume_at=None):
        self.path, self.enabled = path, enabled
        if enabled and fresh and os.path.exists(path):
            os.remove(path)
        if enabled and resume_at is not None and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
            kept = [line for line in lines if _logged_before(line, resume_at)]
            if kept != lines:
                with atomic_write(path, "w") as f:  # all or nothing
                    f.writelines(kept)

    def log(self, record):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _logged_before(line, it):
    """Whether a log line belongs before the checkpoint at iteration `it` (a line cut short by a
    kill does not)."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    step = record.get("iter") if isinstance(record, dict) else None
    return step is None or step < it or (step == it and "val_loss" in record)


# -----------------------------------------------------------------------------
# training: resume, the learning-rate schedule, a non-finite loss, the RNGs


def check_init_from(C, given, written_by="a ckpt.pt"):
    """init_from="finetune" needs --finetune_from; a new run (scratch, or auto) never reads it,
    so there it is refused, never ignored (a resume may keep it from the command that began it)."""
    cli.require(C.init_from != "finetune" or C.finetune_from,
                f"init_from='finetune' needs --finetune_from=<{written_by}>")
    cli.unread(given, ("finetune_from",) if C.init_from in ("scratch", "auto") else (),
               f"read by --init_from=finetune alone (a new run from its weights), not by --init_from={C.init_from}: "
               "add --init_from=finetune, or drop it")


def init_from_auto(C, ckpt_path):
    """init_from="auto" becomes "resume" where ckpt_path exists, else "scratch". Returns how to
    continue the run after a stop: the same command where it resumes by itself (resume, auto),
    else the same command and --init_from=resume."""
    again = "the same command" + ("" if C.init_from in ("resume", "auto") else " and --init_from=resume")
    if C.init_from == "auto":
        C.init_from = "resume" if os.path.isfile(ckpt_path) else "scratch"
    return again


def take_settings(ckpt, C, given, keys, path, check):
    """A resumed run is the checkpoint's run, a fine-tuned one (C.init_from="finetune") keeps its
    architecture: the settings `keys` of ckpt["config"] replace C's. Refused in one line: settings
    given on the command line or in a config file that differ from them, a key the checkpoint
    lacks, or a value the trainer would refuse (of another type than its setting, or by check(C))."""
    old = ckpt["config"]
    differ = [k for k in keys if k in given and k in old and getattr(C, k) != old[k]]
    if differ:
        pairs = ", ".join(f"{k}={getattr(C, k)!r} (checkpoint: {old[k]!r})" for k in differ)
        advice = ("fine-tuning keeps its architecture: drop them" if C.init_from == "finetune" else
                  "drop them to resume it, or start a new run with --out_dir=<new folder>")
        raise UserError(f"{path} was trained with other settings: {pairs}; {advice}")
    missing = [k for k in keys if k not in old]
    if missing:
        raise UserError(f"{path} was written by another version of nanoToST (its settings lack "
                        f"{', '.join(missing)}): start a new run with --out_dir=<new folder>")
    for key in keys:
        mine = type(getattr(C, key))
        if not (type(old[key]) is mine or (mine is float and type(old[key]) is int)):
            raise UserError(f"{path} holds config['{key}'] = {old[key]!r} ({type(old[key]).__name__}), where the "
                            f"setting {key} takes {mine.__name__} values: the file was damaged or written by another "
                            "program; start a new run with --out_dir=<new folder>")
        setattr(C, key, mine(old[key]))
    try:
        check(C)
    except UserError as e:
        raise UserError(f"{path} holds settings this version refuses ({e}): use the version of nanoToST that "
                        "wrote it") from None


NO_DECAY = ("pos_bias", "cls_token")  # model.py's parameters of 2+ dimensions that are not weight matrices


def configure_adamw(module, weight_decay, learning_rate, betas, device_type="cpu"):
    """AdamW with weight decay on the weight matrices and embeddings (p.dim() >= 2), never on
    vectors (biases, norms, temperatures, layer scales) nor on position biases or class tokens."""
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and not name.endswith(NO_DECAY) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")


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
    name, key, *rest = np.random.get_state()  # its key an array: a list, plain data (plaindata)
    state = {"python": random.getstate(), "numpy": [name, key.tolist(), *rest], "torch": torch.get_rng_state()}
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
    if state["numpy"] is None:  # an earlier version's array, not read (plaindata.read)
        say("resume: the checkpoint was written by an earlier version, whose numpy RNG state (an array) is not read: "
            "numpy's RNG starts afresh (augmentations may differ from an uninterrupted run)")
    else:
        name, key, *rest = state["numpy"]
        np.random.set_state((name, np.array(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -----------------------------------------------------------------------------
# model FLOPs utilisation (MFU)

# peak dense bf16 tensor throughput (FLOP/s) for MFU, matched against the device name
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12,
              "L4": 121e12, "RTX 4090": 165e12, "V100": 125e12, "T4": 65e12}


def device_peak_flops(device_name=None):
    """Peak bf16 FLOP/s of a known GPU (by name), or None if unknown (then no MFU)."""
    if device_name is None:
        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for key, flops in PEAK_FLOPS.items():
        if key.lower() in device_name.lower():
            return flops
    return None


def flops_per_token(gpt, T=None):
    """Training FLOPs per token of a GPT (forward + backward = 3x forward). Matmuls: 6N. The
    attention operator: TSSA is linear, ~12 FLOPs per feature forward (squares, two cumulative
    sums, softmax, scaling); softmax attention adds 2 * 2 * T * C forward; linear attention
    ~4 * C * p (the p x p state: its update and its read); another (a forker's) counts its weights only."""
    c, T = gpt.config, T or gpt.config.block_size
    n = gpt.get_num_params(non_embedding=True)
    per_attn = {"tssa": 12 * c.n_embd, "softmax": 4 * T * c.n_embd, "linear": 4 * c.n_embd * (c.n_embd // c.n_head)}
    return 6 * n + 3 * sum(per_attn.get(model.GPT.attention_of_block(c, i), 0) for i in range(c.n_layer))


def estimate_mfu(gpt, tokens_per_second, device_name=None):
    """Model FLOPs utilisation against the device's bf16 peak; None if the peak is unknown."""
    peak = device_peak_flops(device_name)
    return None if peak is None else flops_per_token(gpt) * tokens_per_second / peak
