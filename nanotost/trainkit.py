"""
The trainers' plumbing (train.py, vit_train.py, lra/train.py; sample.py, evaluate.py and
bench.py use parts), kept here so that each trainer reads as its story. The error path and
the settings of every script are cli.py's.

  devices, processes   choose_device_dtype ("auto" everywhere), distributed (DDP from torchrun; no
                       rank waits for ever: ranks.py),
                       cpu_cores, hub_reachable (offline: the Hugging Face libraries fail at once)
  files, checkpoints   claim_out_dir (a lock that run_cli releases; no scratch run over a
                       checkpoint), save_checkpoint (through atomic.atomic_write: a full
                       disk is an OSError naming it) / load_checkpoint (plain data alone, read with
                       weights_only: nothing in a file runs; a file of another format named for what
                       it is; what it holds checked by checkpoints.py before any use) / load_weights,
                       JsonlLogger (a resumed run's log holds each iteration once)
  training             check_shared_settings (the rules the three trainers share), init_from_auto, take_settings (a resumed or fine-tuned run's settings from its
                       checkpoint), get_lr, non_finite, gather_rng_states / restore_rng
  MFU                  flops_per_token, estimate_mfu (against the GPU's peak, PEAK_FLOPS)
"""

import json
import math
import os
import random

import numpy as np
import torch
import torch.distributed as dist

import model
from nanotost import checkpoints, cli, outputs
from nanotost.atomic import atomic_write
from nanotost.cli import UserError

# -----------------------------------------------------------------------------
# devices and processes


# -----------------------------------------------------------------------------
# files, checkpoints and logs

def claim_out_dir(out_dir, init_from):
    """Lock out_dir for this run (outputs.claim_output: a flock on the folder, freed by run_cli or the
    end of the process); refuse a scratch run over an existing checkpoint. Rank 0 only."""
    outputs.claim_output(out_dir, "--out_dir=<new folder>", folder=True)
    ckpt = os.path.join(out_dir, "ckpt.pt")
    if init_from != "resume" and os.path.exists(ckpt):
        raise UserError(f"{ckpt} already exists and init_from={init_from!r} would overwrite it: continue that run "
                        "with --init_from=resume, or write this one elsewhere with --out_dir=<new folder>")


def release_out_dir(out_dir):
    outputs.release_output(out_dir)


def load_checkpoint(path, kind, use="weights"):
    """checkpoints.load_checkpoint, the optimizer's state of a resume checked against the trainers'
    AdamW (configure_adamw) for the model the checkpoint describes."""
    return checkpoints.load_checkpoint(path, kind, use, optimizer_for=lambda module: configure_adamw(
        module, 0.0, 1.0, (0.9, 0.9)))


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
        if enabled and fresh and os.path.lexists(path):
            check_own_log(path)  # (a file of the user's of that name is never removed)
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


def check_own_log(path):
    """Refuse, in one line, a file at `path` that is not a log a run wrote (each line a JSON record
    of an iteration; the last may be cut short by a kill): a scratch run replaces only its own."""
    try:
        with open(path, encoding="utf-8") as f:
            whole = f.read().split("\n")[:-1]  # the lines written whole (after the last newline: cut short)
        records = [json.loads(line) for line in whole]
        own = bool(records) and not os.path.islink(path) and all(isinstance(r, dict) and "iter" in r for r in records)
    except (OSError, UnicodeDecodeError, ValueError):
        own = False
    if not own:
        raise UserError(f"{path} is not a log a run wrote, and a new run starts its log afresh: move it, or write "
                        "the run elsewhere with --out_dir=<new folder>")


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


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def check_shared_settings(cfg, given, written_by="a ckpt.pt"):
    """The rules between settings that the three trainers share, checked before any work: a learning
    rate that decays to min_lr never rises to it; init_from="finetune" needs --finetune_from, which a
    new run (scratch, or auto) never reads; compile_mode is one of torch.compile's modes, read by a
    compiled run alone (--compile=True). A setting given where the run does not read it is refused
    in one line, never ignored (a resume may keep --finetune_from from the command that began it)."""
    cli.require(cfg.min_lr <= cfg.learning_rate,
                f"min_lr ({cfg.min_lr}) must not exceed learning_rate ({cfg.learning_rate})")
    cli.require(cfg.init_from != "finetune" or cfg.finetune_from,
                f"init_from='finetune' needs --finetune_from=<{written_by}>")
    cli.unread(given, ("finetune_from",) if cfg.init_from in ("scratch", "auto") else (),
               f"read by --init_from=finetune alone (a new run from its weights), not by --init_from={cfg.init_from}: "
               "add --init_from=finetune, or drop it")
    cli.require(cfg.compile_mode in COMPILE_MODES,
                f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {cfg.compile_mode!r}")
    cli.unread(given, ("compile_mode",) if not cfg.compile else (),
               "torch.compile's mode, read by a compiled run alone: add --compile=True, or drop it")


def init_from_auto(cfg, ckpt_path):
    """init_from="auto" becomes "resume" where ckpt_path exists, else "scratch". Returns how to
    continue the run after a stop: the same command where it resumes by itself (resume, auto),
    else the same command and --init_from=resume."""
    again = "the same command" + ("" if cfg.init_from in ("resume", "auto") else " and --init_from=resume")
    if cfg.init_from == "auto":
        cfg.init_from = "resume" if os.path.isfile(ckpt_path) else "scratch"
    return again


def take_settings(ckpt, cfg, given, keys, path, check):
    """A resumed run is the checkpoint's run, a fine-tuned one (cfg.init_from="finetune") keeps its
    architecture: the settings `keys` of ckpt["config"] replace cfg's. Refused in one line: settings
    given on the command line or in a config file that differ from them, a key the checkpoint
    lacks, or a value the trainer would refuse (of another type than its setting, or by check(cfg)). A model
    field that became a setting after the checkpoint was written is read from its model_args."""
    old = {**ckpt.get("model_args", {}), **ckpt["config"]}
    differ = [k for k in keys if k in given and k in old and getattr(cfg, k) != old[k]]
    if differ:
        pairs = ", ".join(f"{k}={getattr(cfg, k)!r} (checkpoint: {old[k]!r})" for k in differ)
        advice = ("fine-tuning keeps its architecture: drop them" if cfg.init_from == "finetune" else
                  "drop them to resume it, or start a new run with --out_dir=<new folder>")
        raise UserError(f"{path} was trained with other settings: {pairs}; {advice}")
    missing = [k for k in keys if k not in old]
    if missing:
        raise UserError(f"{path} was written by another version of nanoToST (its settings lack "
                        f"{', '.join(missing)}): start a new run with --out_dir=<new folder>")
    for key in keys:
        mine = type(getattr(cfg, key))
        if not (type(old[key]) is mine or (mine is float and type(old[key]) is int)):
            raise UserError(f"{path} holds config['{key}'] = {old[key]!r} ({type(old[key]).__name__}), where the "
                            f"setting {key} takes {mine.__name__} values: the file was damaged or written by another "
                            "program; start a new run with --out_dir=<new folder>")
        setattr(cfg, key, mine(old[key]))
    try:
        check(cfg)
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


def get_lr(it, cfg):
    """Linear warmup over warmup_iters, then decay to min_lr at lr_decay_iters (0: max_iters)
    by a cosine, a straight line, or not at all ("constant"). "invsqrt" (lra/configs/listops_*)
    decays as 1 / sqrt(it) from the end of the warmup, never below min_lr, and ignores
    lr_decay_iters. The three trainers use it."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if cfg.lr_schedule == "constant":
        return cfg.learning_rate
    if cfg.lr_schedule == "invsqrt":
        return max(cfg.min_lr, cfg.learning_rate * math.sqrt(max(cfg.warmup_iters, 1) / max(it, 1)))
    if it >= decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(decay_iters - cfg.warmup_iters, 1)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if cfg.lr_schedule == "cosine" else 1.0 - ratio  # 1 -> 0
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def non_finite(what, ckpt_path, cfg, dtype):
    """The error of a non-finite loss (`what`: which loss, where, what was not done): what is
    left, and only advice that would change something."""
    where = f"{ckpt_path} is the last good checkpoint" if os.path.isfile(ckpt_path) else "nothing was saved"
    return UserError(f"non-finite {what}; {where}. Try a lower --learning_rate"
                     + (", --grad_clip=1.0" if cfg.grad_clip == 0 else "")
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
    if state["numpy"] is None:  # an earlier version's array, not read (checkpoints.read)
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
