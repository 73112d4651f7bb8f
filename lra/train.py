"""
Train and evaluate ToST or the softmax Transformer on any Long Range Arena task.

Settings are the module globals below, overridden by config files and --key=value
(nanoGPT style); lra/configs/ holds the paper's per-task settings, one file per task and
model, with the baseline's MLP sized so both models have the same parameter count.

    python lra/train.py lra/configs/listops_tost.py                  # needs data/lra_release
    python lra/train.py lra/configs/listops_softmax.py --data_dir=data/lra_gen
    python lra/train.py lra/configs/text_tost.py --batch_size=16 --gradient_accumulation_steps=2
    torchrun --standalone --nproc_per_node=8 lra/train.py lra/configs/pathfinder_tost.py
    python lra/train.py lra/configs/listops_tost.py --init_from=resume   # continue out_dir/ckpt.pt
    python lra/train.py lra/configs/listops_tost.py --eval_only=True      # accuracy of out_dir/ckpt.pt

Every eval_interval steps: accuracy on val (and on test whenever val improves), one JSON
line in out_dir/log.jsonl, and an atomic checkpoint out_dir/ckpt.pt that resumes exactly
(model, optimizer, step, every RNG; batches are a function of (seed, step)).
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

# -----------------------------------------------------------------------------
# settings
# task and data
task = "listops"  # listops | text | retrieval | image | pathfinder | pathx
data_dir = "data/lra_release"  # the unpacked LRA release (or lra/generate.py's out_dir)
cache_dir = "data/lra_cache"  # tokenised arrays are kept here; "" to keep nothing
hf_text = "stanfordnlp/imdb"  # Hugging Face name or local parquet folder for the text task
hf_image = "uoft-cs/cifar10"  # same for the image task
max_len = 0  # 0: the task's LRA length; smaller crops every sequence (quick runs)
n_train = 0  # 0: the whole train split; n: its first n examples (quick runs)
n_eval = 0  # 0: whole val and test splits; n: their first n examples
pad_multiple = 64  # batches are padded to the longest sequence, rounded up to this
load_workers = 1  # processes decoding PNGs (image tasks)
# model
attn = "tssa"  # "tssa" (ToST) | "softmax" (Transformer baseline)
pi = "softmax"  # TSSA's Pi: "softmax" | "uniform" (ablation)
n_layer = 2
n_head = 2
n_embd = 64
mlp_hidden = 128
dropout = 0.1
norm = "pre"  # "pre" | "post" (post-norm, the paper's choice for Pathfinder)
bias = True
layer_scale_init = None  # None: no layer scale
# optimisation (AdamW)
batch_size = 32  # examples per optimizer step, over all processes and micro-steps
gradient_accumulation_steps = 1
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
device = ""  # "": cuda if available, else cpu (under torchrun: this rank's GPU)
dtype = ""  # "": bfloat16 on GPUs that have it, else float32
compile = False
num_threads = 0  # CPU threads for torch (0: torch's default)
# -----------------------------------------------------------------------------

SETTINGS = trainkit.config_defaults(globals())


def model_config(cfg):
    spec = get_task(cfg["task"])
    return LRAConfig(vocab_size=spec.vocab_size, num_classes=spec.num_classes,
                     max_len=min(cfg["max_len"] or spec.seq_len, spec.seq_len), two_tower=spec.two_tower,
                     n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                     mlp_hidden=cfg["mlp_hidden"], dropout=cfg["dropout"], attn=cfg["attn"], pi=cfg["pi"],
                     norm=cfg["norm"], bias=cfg["bias"], layer_scale_init=cfg["layer_scale_init"])


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
    """Accuracy on a whole split. Examples are sorted by length so batches carry little
    padding; under DDP each rank takes every world_size-th batch."""
    model.eval()
    lengths = np.max([r.lengths() for r in split.inputs], axis=0)
    order = np.argsort(lengths, kind="stable")
    bs = cfg["eval_batch_size"] or cfg["batch_size"]
    batches = [order[i:i + bs] for i in range(0, len(order), bs)][dist.rank::dist.world_size]
    correct = torch.zeros(2, device=device)  # (right, seen)
    for idx in batches:
        towers, labels = to_device(*make_batch(split, idx, model_max_len(model), cfg["pad_multiple"]), device)
        with ctx():
            logits = model(towers)
        correct += torch.stack([(logits.argmax(-1) == labels).sum().float(), torch.tensor(len(idx), device=device)])
    correct = trainkit.all_reduce_mean(correct, dist)  # same ratio as the sums
    model.train()
    return (correct[0] / correct[1].clamp_min(1)).item()


def model_max_len(model):
    return trainkit.unwrap_model(model).config.max_len


def main(argv=None):
    cfg = trainkit.configure(SETTINGS, sys.argv[1:] if argv is None else argv)
    get_task(cfg["task"])  # an unknown task fails here, before anything is loaded
    dist = trainkit.setup_distributed(cfg["device"] or None)
    dev = dist.device
    if cfg["num_threads"]:
        torch.set_num_threads(cfg["num_threads"])
    dtype = cfg["dtype"] or ("bfloat16" if str(dev).startswith("cuda") and torch.cuda.is_bf16_supported() else "float32")
    ctx, scaler = trainkit.autocast_for(dev, dtype)
    world = dist.world_size
    accum = cfg["gradient_accumulation_steps"]
    if cfg["batch_size"] % (world * accum):
        raise trainkit.ConfigError(f"batch_size {cfg['batch_size']} must be divisible by processes x "
                                   f"gradient_accumulation_steps = {world} x {accum}")
    micro = cfg["batch_size"] // (world * accum)
    torch.manual_seed(cfg["seed"] + dist.rank)
    log = trainkit.JsonlLogger(os.path.join(cfg["out_dir"], "log.jsonl"), enabled=dist.is_master)
    say = print if dist.is_master else (lambda *a, **k: None)

    # data
    load = lambda split: load_split(cfg["task"], split, cfg["data_dir"], cfg["max_len"] or None, cfg["cache_dir"],
                                    cfg["hf_text"], cfg["hf_image"], cfg["load_workers"])
    val, test = load("val").subset(cfg["n_eval"]), load("test").subset(cfg["n_eval"])
    train = None if cfg["eval_only"] else load("train").subset(cfg["n_train"])
    if train is not None:
        say(f"{cfg['task']}: {len(train)} train / {len(val)} val / {len(test)} test examples")

    # model, optimizer, and the state to resume from
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    ckpt = trainkit.load_checkpoint(ckpt_path) if (cfg["init_from"] == "resume" or cfg["eval_only"]) else None
    if cfg["init_from"] not in ("scratch", "resume"):
        raise trainkit.ConfigError(f"init_from must be 'scratch' or 'resume', got {cfg['init_from']!r}")
    mconf = LRAConfig(**ckpt["model_config"]) if ckpt else model_config(cfg)
    model = LRAClassifier(mconf).to(dev)
    optimizer = configure_adamw(model, cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                "cuda" if str(dev).startswith("cuda") else "cpu")
    start_iter, best_val, test_at_best = 0, -1.0, None
    if ckpt:
        model.load_state_dict(trainkit.clean_state_dict(ckpt["model"]))
        optimizer.load_state_dict(ckpt["optimizer"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        start_iter, best_val, test_at_best = ckpt["iter_num"], ckpt["best_val_acc"], ckpt["test_acc_at_best_val"]
        trainkit.set_rng_state(ckpt["rng"])
    n_params = model.get_num_params()
    say(f"model: {'ToST' if mconf.attn == 'tssa' else 'softmax Transformer'}, {n_params:,} parameters "
        f"({mconf.n_layer} layers, width {mconf.n_embd}, {mconf.n_head} heads, MLP {mconf.mlp_hidden}, "
        f"{mconf.norm}-norm), {dtype} on {dev}")
    if cfg["eval_only"]:
        result = {"iter": start_iter, "val_acc": evaluate(model, val, cfg, ctx, dev, dist),
                  "test_acc": evaluate(model, test, cfg, ctx, dev, dist), "n_params": n_params}
        say(result)
        trainkit.cleanup_distributed(dist)
        return result
    raw_model = model
    if cfg["compile"]:
        model = torch.compile(model, dynamic=True)
    if dist.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dist.local_rank] if "cuda" in dev else None)

    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    result = {"n_params": n_params}
    t0, it = time.time(), start_iter
    for it in range(start_iter, cfg["max_iters"] + 1):
        # evaluate and checkpoint (not again right after resuming: that was done before saving)
        if (it % cfg["eval_interval"] == 0 or it == cfg["max_iters"]) and not (ckpt and it == start_iter):
            val_acc = evaluate(model, val, cfg, ctx, dev, dist)
            if val_acc > best_val:
                best_val, test_at_best = val_acc, evaluate(model, test, cfg, ctx, dev, dist)
            record = {"iter": it, "val_acc": val_acc, "best_val_acc": best_val, "test_acc_at_best_val": test_at_best,
                      "time_s": round(time.time() - t0, 1)}
            say(f"step {it}: val acc {val_acc:.4f} (best {best_val:.4f}, test at best {test_at_best:.4f})")
            log.log(record)
            result.update(record)
            if dist.is_master and it > 0:
                trainkit.save_checkpoint({
                    "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "model_config": asdict(mconf), "config": cfg, "iter_num": it, "best_val_acc": best_val,
                    "test_acc_at_best_val": test_at_best, "rng": trainkit.rng_state()}, ckpt_path)
        if it == cfg["max_iters"]:
            break

        # one optimizer step over `accum` micro-batches of this rank's share of the batch
        lr = trainkit.lr_at(it, lr=cfg["learning_rate"], min_lr=cfg["min_lr"], warmup_iters=cfg["warmup_iters"],
                            decay_iters=decay_iters, schedule=cfg["lr_schedule"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        idx = batch_indices(len(train), cfg["batch_size"], it, cfg["seed"])[dist.rank::world]
        loss_sum = 0.0
        for k in range(accum):
            towers, labels = to_device(*make_batch(train, idx[k * micro:(k + 1) * micro], mconf.max_len,
                                                   cfg["pad_multiple"]), dev)
            sync = nullcontext() if (not dist.ddp or k == accum - 1) else model.no_sync()
            with sync:
                with ctx():
                    logits = model(towers)
                loss = F.cross_entropy(logits.float(), labels) / accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += loss.item()
        trainkit.optimizer_step(optimizer, model.parameters(), cfg["grad_clip"], scaler)
        if it % cfg["log_interval"] == 0:
            dt = (time.time() - t0) / max(it - start_iter + 1, 1)
            say(f"iter {it}: loss {loss_sum:.4f}, lr {lr:.2e}, {dt * 1000:.0f} ms/iter")
    trainkit.cleanup_distributed(dist)
    return result


if __name__ == "__main__":
    trainkit.run_cli(main)
