"""
Train and evaluate ToST or the softmax Transformer on any Long Range Arena task.

Settings are the module globals below, overridden by config files and --key=value
(nanoGPT style); lra/configs/ holds the paper's per-task settings, one file per task and
model, with the baseline's MLP sized so both models have the same parameter count.

    python lra/train.py lra/configs/listops_tost.py                  # needs data/lra_release
    python lra/train.py lra/configs/listops_softmax.py --data_dir=data/lra_gen
    python lra/train.py lra/configs/text_tost.py --batch_size=16 --gradient_accumulation_steps=2
    torchrun --standalone --nproc_per_node=8 lra/train.py lra/configs/listops_tost.py \
        --batch_size=8 --gradient_accumulation_steps=8      # the config's 64 examples per step, on 8 GPUs
    python lra/train.py lra/configs/listops_tost.py --init_from=resume   # continue out_dir/ckpt.pt
    python lra/train.py lra/configs/listops_tost.py --eval_only=True      # accuracy of out_dir/ckpt.pt

batch_size and gradient_accumulation_steps mean what they mean in train.py: examples per
process per micro-step, and micro-steps per optimizer step over all processes together, so a
step sees batch_size x gradient_accumulation_steps examples whatever the number of processes.
Every eval_interval steps: loss and accuracy on val (and test accuracy whenever val improves),
one JSON line in out_dir/log.jsonl, and an atomic checkpoint out_dir/ckpt.pt that resumes
exactly (model, optimizer, step, every RNG; batches are a function of (seed, step)).
"""

import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trainkit
from lra.data import get_task, load_split, make_batch
from lra.encoder import LRAClassifier, LRAConfig
from model import configure_adamw
from model import TSSA_IMPLS as _TSSA_IMPLS  # (a leading _: not a setting)

# -----------------------------------------------------------------------------
# settings
# task and data
task = "listops"  # listops | text | retrieval | image | pathfinder | pathx
data_dir = "data/lra_release"  # the unpacked LRA release (or lra/generate.py's out_dir)
cache_dir = "data/lra_cache"  # tokenised arrays are kept here; "" to keep nothing
hf_text = "stanfordnlp/imdb"  # Hugging Face name or local parquet folder for the text task
hf_image = "uoft-cs/cifar10"  # same for the image task
max_len = 0  # 0: the task's LRA length; smaller crops longer sequences (quick runs; it says how many)
n_train = 0  # 0: the whole train split; n: its first n examples (quick runs)
n_eval = 0  # 0: whole val and test splits; n: their first n examples
pad_multiple = 64  # batches are padded to the longest sequence, rounded up to this
load_workers = 1  # processes decoding PNGs (image tasks)
# model
attn = "tssa"  # "tssa" (ToST) | "softmax" (Transformer baseline) | "linear" (linear attention baseline)
pi = "softmax"  # TSSA's Pi: "softmax" | "uniform" (ablation)
n_layer = 2
n_head = 2
n_embd = 64
mlp_hidden = 128
dropout = 0.1
norm = "pre"  # "pre" | "post" (post-norm, the paper's choice for Pathfinder)
bias = True
layer_scale_init = None  # None: no layer scale
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
# optimisation (AdamW)
batch_size = 32  # examples per process per micro-step
gradient_accumulation_steps = 1  # micro-steps per optimizer step, over all processes together
learning_rate = 1e-4
min_lr = 0.0
lr_schedule = "linear"  # "linear" | "cosine" | "invsqrt" | "constant", after a linear warmup
warmup_iters = 100
lr_decay_iters = 0  # 0: max_iters
max_iters = 1000
weight_decay = 1e-2
beta1 = 0.9
beta2 = 0.98
grad_clip = 1.0  # 0: no clipping
# evaluation, logging, checkpoints
eval_interval = 500
eval_batch_size = 0  # 0: batch_size
log_interval = 50
out_dir = "out-lra"
init_from = "scratch"  # "scratch" | "resume"
eval_only = False
seed = 1337
# system
device = "auto"  # "auto" (this rank's GPU if there is one, else cpu), "cpu", "cuda", "cuda:1"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False
num_threads = 0  # CPU threads for torch (0: torch's default)
# -----------------------------------------------------------------------------

SETTINGS = trainkit.config_defaults(globals())


def model_config(cfg):
    spec = get_task(cfg["task"])
    args = dict(vocab_size=spec.vocab_size, num_classes=spec.num_classes,
                max_len=min(cfg["max_len"] or spec.seq_len, spec.seq_len), two_tower=spec.two_tower,
                n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"], mlp_hidden=cfg["mlp_hidden"],
                dropout=cfg["dropout"], attn=cfg["attn"], pi=cfg["pi"], norm=cfg["norm"], bias=cfg["bias"],
                layer_scale_init=cfg["layer_scale_init"], tssa_impl=cfg["tssa_impl"])
    return LRAConfig(**args)


def check_settings(cfg):
    """Every setting that can be wrong on its own, checked before any data is read."""
    get_task(cfg["task"])
    for key in ("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "n_layer", "n_head",
                "n_embd", "mlp_hidden", "pad_multiple"):
        trainkit.require(cfg[key] >= 1, f"{key} must be at least 1, got {cfg[key]}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip", "max_len",
                "eval_batch_size"):
        trainkit.require(cfg[key] >= 0, f"{key} must not be negative, got {cfg[key]}")
    trainkit.require(cfg["learning_rate"] > 0, f"learning_rate must be positive, got {cfg['learning_rate']}")
    trainkit.require(cfg["tssa_impl"] in _TSSA_IMPLS,
                     f"tssa_impl must be one of {', '.join(_TSSA_IMPLS)}, got {cfg['tssa_impl']!r}")
    trainkit.require(0 <= cfg["dropout"] < 1, f"dropout must be in [0, 1), got {cfg['dropout']}")
    trainkit.require(cfg["n_embd"] % cfg["n_head"] == 0,
                     f"n_embd ({cfg['n_embd']}) must be divisible by n_head ({cfg['n_head']})")
    for key, allowed in (("init_from", ("scratch", "resume")), ("attn", ("tssa", "softmax", "linear")),
                         ("pi", ("softmax", "uniform")), ("norm", ("pre", "post")),
                         ("lr_schedule", ("linear", "cosine", "invsqrt", "constant"))):
        trainkit.require(cfg[key] in allowed, f"{key} must be one of {', '.join(allowed)}, got {cfg[key]!r}")


def count_params(cfg):
    """Parameters of the model a config builds (on the meta device: no memory, no time)."""
    with torch.device("meta"):
        return LRAClassifier(model_config(cfg)).get_num_params()


@lru_cache(maxsize=4)
def _epoch_order(n, seed, epoch):
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_indices(n, batch_size, it, seed):
    """Examples of step `it`: the next batch_size of an endless stream of seeded epoch
    permutations, so any step's batch can be recomputed (exact resume)."""
    out, pos = [], it * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(pos, n)
        take = _epoch_order(n, seed, epoch)[offset:offset + batch_size - len(out)]
        out.extend(take.tolist())
        pos += len(take)
    return np.array(out)


def to_device(towers, labels, device):
    """Move a batch to the device; a mask with no padding becomes None (checked on the CPU,
    so no sync), which lets SDPA pick its flash kernel and TSSA skip the masking."""
    nb = str(device).startswith("cuda")
    moved = [(t.to(device, non_blocking=nb), None if m.all() else m.to(device, non_blocking=nb)) for t, m in towers]
    return moved, labels.to(device, non_blocking=nb)


@torch.no_grad()
def evaluate(model, split, cfg, ctx, device, dist):
    """(mean loss, accuracy) on a whole split. Examples are sorted by length so batches carry
    little padding; under DDP each rank takes every world_size-th batch."""
    model.eval()
    lengths = np.max([r.lengths() for r in split.inputs], axis=0)
    order = np.argsort(lengths, kind="stable")
    bs = cfg["eval_batch_size"] or cfg["batch_size"]
    batches = [order[i:i + bs] for i in range(0, len(order), bs)][dist.rank::dist.world_size]
    total = torch.zeros(3, device=device)  # (sum of losses, right, seen)
    for idx in batches:
        towers, labels = to_device(*make_batch(split, idx, model_max_len(model), cfg["pad_multiple"]), device)
        with ctx():
            logits = model(towers)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        total += torch.stack([loss, (logits.argmax(-1) == labels).sum().float(), torch.tensor(float(len(idx)), device=device)])
    total = trainkit.all_reduce_mean(total, dist)  # same ratios as the sums
    model.train()
    seen = total[2].clamp_min(1)
    return (total[0] / seen).item(), (total[1] / seen).item()


def model_max_len(model):
    return trainkit.unwrap_model(model).config.max_len


def main(argv=None):
    # settings: the globals above, then config files and --key=value, then checks
    cfg = trainkit.configure(SETTINGS, sys.argv[1:] if argv is None else argv)
    check_settings(cfg)
    device, dtype = trainkit.choose_device_dtype(cfg["device"], cfg["dtype"])
    if cfg["num_threads"]:
        torch.set_num_threads(cfg["num_threads"])
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    resume = cfg["init_from"] == "resume" or cfg["eval_only"]
    if not resume:
        trainkit.refuse_overwrite(cfg["out_dir"])

    with trainkit.distributed(device) as dist:
        dev, world = dist.device, dist.world_size
        trainkit.require(cfg["gradient_accumulation_steps"] % world == 0,
                         f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) must be divisible "
                         f"by the number of processes ({world})")
        accum = cfg["gradient_accumulation_steps"] // world  # micro-steps of this process per step
        B = cfg["batch_size"]
        ctx, scaler = trainkit.autocast_for(dev, dtype)
        torch.manual_seed(cfg["seed"] + dist.rank)
        say = print if dist.is_master else (lambda *a, **k: None)

        # the run to continue (its model settings win), then the data, checked when loaded
        ckpt = trainkit.load_checkpoint(ckpt_path) if resume else None
        mconf = LRAConfig(**ckpt["model_args"]) if ckpt else model_config(cfg)

        def load(split, n):
            data = load_split(cfg["task"], split, cfg["data_dir"], mconf.max_len, cfg["cache_dir"], cfg["hf_text"],
                              cfg["hf_image"], cfg["load_workers"]).subset(n)
            if data.cropped:
                say(f"{cfg['task']} {split}: {data.cropped:,} of {len(data):,} sequences are longer than max_len "
                    f"and were cropped to {mconf.max_len:,} tokens (the task's LRA length is "
                    f"{get_task(cfg['task']).seq_len:,})")
            return data

        val, test = load("val", cfg["n_eval"]), load("test", cfg["n_eval"])
        train = None if cfg["eval_only"] else load("train", cfg["n_train"])
        if train is not None:
            say(f"{cfg['task']}: {len(train)} train / {len(val)} val / {len(test)} test examples")

        # model and optimizer, fresh or exactly as the checkpoint left them
        model = LRAClassifier(mconf).to(dev)
        optimizer = configure_adamw(model, cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                    "cuda" if str(dev).startswith("cuda") else "cpu")
        start_iter, best_val_loss, best_val, test_at_best = 0, float("inf"), -1.0, None
        if ckpt:
            model.load_state_dict(trainkit.clean_state_dict(ckpt["model"]))
            optimizer.load_state_dict(ckpt["optimizer"])
            if scaler is not None and ckpt.get("scaler"):
                scaler.load_state_dict(ckpt["scaler"])
            start_iter, best_val_loss, best_val = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["best_val_acc"]
            test_at_best = ckpt["test_acc_at_best_val"]
            if len(ckpt["rng"]) == world:
                trainkit.set_rng_state(ckpt["rng"][dist.rank])
        n_params = model.get_num_params()
        say(f"model: {dict(tssa='ToST', softmax='softmax Transformer', linear='linear-attention Transformer')[mconf.attn]}, {n_params:,} parameters "
            f"({mconf.n_layer} layers, width {mconf.n_embd}, {mconf.n_head} heads, MLP {mconf.mlp_hidden}, "
            f"{mconf.norm}-norm), {dtype} on {dev}, {B * cfg['gradient_accumulation_steps']} examples per step "
            f"({cfg['gradient_accumulation_steps']} x {B})")
        if cfg["eval_only"]:
            (val_loss, val_acc), (_, test_acc) = (evaluate(model, s, cfg, ctx, dev, dist) for s in (val, test))
            result = {"iter": start_iter, "val_loss": val_loss, "val_acc": val_acc, "test_acc": test_acc,
                      "n_params": n_params}
            say(result)
            return result
        raw_model = model
        if cfg["compile"]:
            model = torch.compile(model, dynamic=True)
        if dist.ddp:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dist.local_rank] if "cuda" in dev else None)
        log = trainkit.JsonlLogger(os.path.join(cfg["out_dir"], "log.jsonl"), dist.is_master, fresh=not ckpt)

        decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
        result = {"n_params": n_params}
        t0, train_loss = time.time(), None
        for it in range(start_iter, cfg["max_iters"] + 1):
            lr = trainkit.lr_at(it, lr=cfg["learning_rate"], min_lr=cfg["min_lr"], warmup_iters=cfg["warmup_iters"],
                                decay_iters=decay_iters, schedule=cfg["lr_schedule"])
            # evaluate and checkpoint (not again right after resuming: that was done before saving)
            if (it % cfg["eval_interval"] == 0 or it == cfg["max_iters"]) and not (ckpt and it == start_iter):
                val_loss, val_acc = evaluate(model, val, cfg, ctx, dev, dist)
                best_val_loss = min(best_val_loss, val_loss)
                if val_acc > best_val:
                    best_val, test_at_best = val_acc, evaluate(model, test, cfg, ctx, dev, dist)[1]
                record = {"iter": it, "lr": lr, "train_loss": train_loss, "val_loss": val_loss, "val_acc": val_acc,
                          "best_val_acc": best_val, "test_acc_at_best_val": test_at_best,
                          "time_s": round(time.time() - t0, 1)}
                say(f"step {it}: val loss {val_loss:.4f}, val acc {val_acc:.4f} (best {best_val:.4f}, "
                    f"test at best {test_at_best:.4f})")
                log.log(record)
                result.update(record)
                rng = trainkit.gather_rng_states(dist)  # a collective: every rank takes part
                if dist.is_master and it > 0:
                    trainkit.save_checkpoint({
                        "model": trainkit.clean_state_dict(raw_model.state_dict()), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict() if scaler is not None else None, "model_args": asdict(mconf),
                        "iter_num": it, "best_val_loss": best_val_loss, "best_val_acc": best_val,
                        "test_acc_at_best_val": test_at_best, "config": cfg, "rng": rng}, ckpt_path)
            if it == cfg["max_iters"]:
                break

            # one optimizer step: this process's `accum` micro-batches of B examples, picked by
            # their global micro-step index from the step's batch of B x gradient_accumulation_steps
            for group in optimizer.param_groups:
                group["lr"] = lr
            idx = batch_indices(len(train), B * cfg["gradient_accumulation_steps"], it, cfg["seed"])
            loss_sum = torch.zeros((), device=dev)
            for k in range(accum):
                m = dist.rank * accum + k
                towers, labels = to_device(*make_batch(train, idx[m * B:(m + 1) * B], mconf.max_len,
                                                       cfg["pad_multiple"]), dev)
                with model.no_sync() if dist.ddp and k < accum - 1 else nullcontext():
                    with ctx():
                        logits = model(towers)
                    loss = F.cross_entropy(logits.float(), labels) / accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                loss_sum += loss.detach()
            train_loss = trainkit.all_reduce_mean(loss_sum, dist).item()
            trainkit.optimizer_step(optimizer, model.parameters(), cfg["grad_clip"], scaler)
            if it % cfg["log_interval"] == 0:
                dt = (time.time() - t0) / max(it - start_iter + 1, 1)
                say(f"iter {it}: loss {train_loss:.4f}, lr {lr:.2e}, {dt * 1000:.0f} ms/iter")
    return result


if __name__ == "__main__":
    trainkit.run_cli(main)
