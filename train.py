"""
Train a ToST language model (or the GPT-2 softmax baseline), nanoGPT-style: read top to
bottom, it is the whole story (settings, config, DDP, data, model, the loop).

    python prepare_char.py && python train.py config/pydocs_char_tost.py   # CPU, a few minutes
    python train.py config/pydocs_char_tost.py --max_iters=500             # --key=value overrides
    python prepare_openwebtext.py && torchrun --standalone --nproc_per_node=8 train.py config/tost_owt.py

Multi-node (2 nodes x 8 GPUs): on node 0
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=<node 0 ip> --master_port=29500 \\
        train.py config/tost_owt.py
and the same with --node_rank=1 on node 1 (add NCCL_IB_DISABLE=1 without InfiniBand). Every node
reads <data_dir>/<dataset> and rank 0 writes out_dir: use a shared filesystem, or prepare the
data on each node. CPU-only machines run the same commands on gloo.

Data: <data_dir>/<dataset>/{train,val}.bin (uint16 token ids) + meta.json, written by
prepare_openwebtext.py (GPT-2 BPE) or prepare_char.py (characters). Batches are a pure function
of (seed, iteration, micro-batch index), so init_from="resume" continues exactly: the same
losses as an uninterrupted run. out_dir/ckpt.pt is written atomically; evaluations and training
losses go to out_dir/log.jsonl. Scoring a checkpoint on a whole split: evaluate.py.
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

import trainkit as tk
import kernels
from model import GPT, GPTConfig, estimate_mfu

# -----------------------------------------------------------------------------
# settings. Defaults: ToST-Base on OpenWebText, the released recipe (config/tost_owt.py says
# which source each value follows); the files in config/ list only what they change.
# I/O
out_dir = "out"
eval_interval = 2000  # evaluate and checkpoint every this many iterations
log_interval = 1  # print (and log) the training loss every this many iterations
eval_iters = 200  # batches per split for the loss estimate
always_save_checkpoint = True  # else only when the val loss improves
init_from = "scratch"  # "scratch" (refuses an out_dir that holds a ckpt.pt), "resume", or "auto" (either)
# logging
wandb_log = False
wandb_project = "nanotost"
wandb_run_name = "tost"
# data
dataset = "openwebtext"  # <data_dir>/<dataset>/ from prepare_openwebtext.py or prepare_char.py
data_dir = "data"
gradient_accumulation_steps = 5 * 8  # micro-steps per optimizer step, over all processes together
batch_size = 12  # sequences per process per micro-step
block_size = 1024
# model (ToST-Base; attn="softmax", bias=True, layer_scale_init=0 is the GPT-2 baseline)
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attn = "tssa"  # "tssa", "softmax" or "linear" (linear attention, elu + 1)
pi = "softmax"  # "softmax" or "uniform" (ablation: every token in every group equally)
layer_scale_init = 1e-5  # 0: no layer scale (GPT-2)
short_conv = 0  # opt-in ToST variant: causal depthwise convolution of this kernel size before TSSA (0: off)
hybrid_every = 0  # opt-in variant: every k-th block uses softmax attention (0: off)
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
# AdamW
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-2  # the released ToST-Base config (the paper's text says 0.1)
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0: no clipping
max_time = 0.0  # seconds after which the run evaluates, saves and stops (0: no limit)
# learning-rate schedule: linear warmup, then decay to min_lr at lr_decay_iters (0: max_iters)
lr_schedule = "cosine"  # "cosine", "linear", "constant" or "invsqrt" (lr * sqrt(warmup_iters / it))
warmup_iters = 2000
lr_decay_iters = 600000
min_lr = 6e-5
# system
device = "auto"  # "auto" (this rank's GPU if there is one, else cpu), "cpu", "cuda", "cuda:1"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False  # torch.compile the model
seed = 1337
num_threads = 0  # torch CPU threads (0: torch's default)
# -----------------------------------------------------------------------------
DEFAULTS = tk.config_defaults(globals())  # the settings above (nothing defined below is one)
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "attn", "pi", "layer_scale_init",
              "short_conv", "hybrid_every")
TRAIN, EVAL = 0, 1  # seed tags: training batches and evaluation batches never coincide


def check_settings(C):
    """Every setting that can be wrong on its own, checked before anything is built."""
    tk.check(C, at_least_1=("eval_interval", "log_interval", "eval_iters", "batch_size", "gradient_accumulation_steps",
                            "block_size", "n_layer", "n_head", "n_embd"),
             non_negative=("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip",
                           "max_time", "layer_scale_init", "num_threads", "short_conv", "hybrid_every"),
             positive=("learning_rate",), fraction=("dropout", "beta1", "beta2"),
             choices={"init_from": ("scratch", "resume", "auto"), "attn": ("tssa", "softmax", "linear"),
                      "pi": ("softmax", "uniform"), "tssa_impl": kernels.IMPLS,
                      "lr_schedule": ("cosine", "linear", "constant", "invsqrt")})
    tk.require(C.n_embd % C.n_head == 0, f"n_embd ({C.n_embd}) must be divisible by n_head ({C.n_head})")
    tk.require(not C.short_conv or C.attn == "tssa", f"short_conv convolves the TSSA input: it needs attn=tssa, got {C.attn!r}")
    tk.require(C.min_lr <= C.learning_rate, f"min_lr ({C.min_lr}) must not exceed learning_rate ({C.learning_rate})")
    tk.require(C.out_dir and C.dataset, "out_dir and dataset must not be empty")


def open_dataset(data_dir, dataset, splits, min_tokens):
    """meta.json and the given splits of <data_dir>/<dataset>, checked: the sizes meta.json
    records, more than min_tokens tokens each. Damage is one line with the command that re-prepares."""
    from prepare_openwebtext import HUB  # the corpora that script fetches by name

    folder = os.path.join(data_dir, dataset)
    f = " --force"
    redo = ("python prepare_char.py" + f if dataset == "pydocs_char" else
            f"python prepare_openwebtext.py --dataset={dataset}" + f if dataset in HUB else
            f"python prepare_char.py --input=<text file> --name={dataset}{f} (or prepare_openwebtext.py "
            f"--input=<files> --name={dataset}{f})")
    path = os.path.join(folder, "meta.json")
    if not os.path.isfile(path):
        raise tk.UserError(f"dataset {dataset!r} is not prepared ({path} is missing): run {redo.replace(f, '')}")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        meta["vocab_size"], meta["tokenizer"], meta["splits"].items()  # noqa: B018 (the keys it must have)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise tk.UserError(f"{path} is damaged ({type(e).__name__}: {e}): prepare it again: {redo}") from None
    for split in splits:
        path = os.path.join(folder, f"{split}.bin")
        if split not in meta["splits"]:
            raise tk.UserError(f"dataset {dataset!r} has no {split} split (it has: {', '.join(meta['splits'])})")
        expected, size = meta["splits"][split], os.path.getsize(path) if os.path.isfile(path) else None
        if size != 2 * expected:
            what = "missing" if size is None else f"{size:,} bytes where meta.json says {expected:,} uint16 tokens"
            raise tk.UserError(f"{path} is {what}: prepare it again: {redo}")
        tk.require(expected > min_tokens, f"{path} has {expected:,} tokens, not more than block_size "
                                          f"({min_tokens:,}): lower --block_size or prepare more text")
    meta["redo"] = redo
    return folder, meta


def get_batch(folder, split, B, T, device, vocab_size, redo, *key):
    """B random windows of T + 1 tokens of a split (a fresh memory map per call: numpy keeps a
    long-lived map's pages), chosen by a generator seeded with `key` alone: the same batch on
    any rank, before or after a resume. Returns x, y (B, T) int64 on the device, y = x shifted."""
    data = np.memmap(os.path.join(folder, f"{split}.bin"), dtype=np.uint16, mode="r")
    starts = np.random.default_rng(list(key)).integers(0, len(data) - T, size=B)
    xy = np.stack([data[i:i + T + 1] for i in starts]).astype(np.int64)  # (B, T + 1)
    if xy.max() >= vocab_size:  # a damaged file; checked here, on the CPU, at no cost
        raise tk.UserError(f"{folder}/{split}.bin holds token id {xy.max()}, outside the vocabulary "
                           f"({vocab_size}): prepare it again: {redo}")
    xy = torch.from_numpy(xy)
    if device.startswith("cuda"):
        xy = xy.pin_memory().to(device, non_blocking=True)
    return xy[:, :-1], xy[:, 1:]


@torch.no_grad()
def estimate_loss(model, C, data, d, ctx):
    """Mean loss over eval_iters fixed batches per split. Batch k is seeded by k alone and run by
    rank k % world_size: every rank works, and the result does not depend on the world size."""
    model.eval()
    out = {}
    for code, split in enumerate(("train", "val")):
        total = torch.zeros(2, device=d.device)  # (sum of batch losses, number of batches)
        for k in range(d.rank, C.eval_iters, d.world_size):
            x, y = get_batch(*data(split), C.seed, EVAL, code, k)
            with ctx:
                _, loss = model(x, y)
            total += torch.stack([loss.float(), torch.ones((), device=d.device)])
        if d.ddp:
            torch_dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def main(argv):
    # -------------------------------------------------------------------------
    # settings: the globals above, then config files and --key=value, then checks
    C, given = tk.configure(DEFAULTS, argv)
    check_settings(C)
    device, dtype = tk.choose_device_dtype(C.device, C.dtype)
    if C.num_threads > 0:
        torch.set_num_threads(C.num_threads)
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")
    if C.init_from == "auto":  # continue the run in out_dir if there is one, else start one
        C.init_from = "resume" if os.path.isfile(ckpt_path) else "scratch"
    folder, meta = open_dataset(C.data_dir, C.dataset, ("train", "val"), C.block_size)

    # -------------------------------------------------------------------------
    # DDP from torchrun's environment (one process without torchrun)
    with tk.distributed(device) as d:
        device = d.device
        say = print if d.is_master else (lambda *a, **k: None)
        tk.require(C.gradient_accumulation_steps % d.world_size == 0,
                   f"gradient_accumulation_steps ({C.gradient_accumulation_steps}) must be divisible by the "
                   f"number of processes ({d.world_size})")
        accum = C.gradient_accumulation_steps // d.world_size  # micro-steps of this process per optimizer step
        if d.is_master:
            tk.claim_out_dir(C.out_dir, C.init_from)  # a lock; a scratch run never overwrites a checkpoint
        torch.manual_seed(C.seed + d.rank)  # dropout differs per rank; the weights come from rank 0 (DDP)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

        # ---------------------------------------------------------------------
        # the model: fresh, or the checkpoint's (whose architecture and seed win)
        ckpt = None
        if C.init_from == "resume":
            ckpt = tk.load_checkpoint(ckpt_path, "language")
            tk.check_resume(ckpt, C, given, ("dataset",), ckpt_path)
            tk.resume_settings(ckpt, C, given, MODEL_KEYS + ("seed",), ckpt_path)
            if (ckpt["tokenizer"]["tokenizer"], ckpt["tokenizer"].get("chars")) != (meta["tokenizer"], meta.get("chars")):
                raise tk.UserError(f"{ckpt_path} was trained with another tokenizer than dataset {C.dataset!r}'s: "
                                   "resume it on its own dataset, or start a new run with --out_dir=<new folder>")
            if ckpt["iter_num"] >= C.max_iters:
                say(f"{ckpt_path} already reached max_iters={C.max_iters} (iter {ckpt['iter_num']}): nothing to do; "
                    f"raise --max_iters to train it further, or sample from it: python sample.py --out_dir={C.out_dir}")
                return None
        model_args = dict(n_layer=C.n_layer, n_head=C.n_head, n_embd=C.n_embd, block_size=C.block_size,
                          dropout=C.dropout, bias=C.bias, attn=C.attn, pi=C.pi,
                          short_conv=C.short_conv, hybrid_every=C.hybrid_every,
                          layer_scale_init=C.layer_scale_init or None,  # 0: none
                          vocab_size=(meta["vocab_size"] + 63) // 64 * 64)  # GPT-2: 50257 -> 50304, faster
        model = kernels.use(GPT(GPTConfig(**model_args)), C.tssa_impl).to(device)
        raw_model = model  # the plain module: parameters, checkpoints, MFU

        # ---------------------------------------------------------------------
        # optimizer and precision: autocast for the forward pass, a GradScaler for float16
        optimizer = model.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2),
                                               "cuda" if device.startswith("cuda") else "cpu")
        device_type = "cuda" if device.startswith("cuda") else "cpu"
        ctx = torch.autocast(device_type, dtype=tk.DTYPES[dtype], enabled=dtype != "float32")
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        iter_num, best_val_loss = 0, float("inf")
        if ckpt is not None:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt.get("scaler"):
                scaler.load_state_dict(ckpt["scaler"])
            iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
            tk.restore_rng(ckpt["rng"], d, say)
            say(f"resumed from {ckpt_path} at iter {iter_num}")
            ckpt = None  # free the memory
        if C.compile:
            say("compiling the model (takes a minute)...")
            model = torch.compile(model)
        eval_model = model  # evaluation skips DDP (no gradients)
        if d.ddp:
            model = DDP(model, device_ids=[d.local_rank] if device.startswith("cuda") else None,
                        find_unused_parameters=C.pi == "uniform")  # uniform Pi leaves temp unused

        # ---------------------------------------------------------------------
        # logging
        logger = tk.JsonlLogger(os.path.join(C.out_dir, "log.jsonl"), d.is_master, fresh=C.init_from == "scratch")
        wandb = None
        if C.wandb_log and d.is_master:
            try:
                import wandb
            except ImportError:
                raise tk.UserError("wandb_log=True needs wandb: pip install wandb (or --wandb_log=False)") from None
            wandb.init(project=C.wandb_project, name=C.wandb_run_name, config=vars(C), resume="allow")
        T = C.block_size
        tokens_per_iter = C.gradient_accumulation_steps * C.batch_size * T
        say(f"{C.attn} model: {raw_model.get_num_params() / 1e6:.2f}M parameters, {C.dataset} ({meta['tokenizer']} "
            f"tokenizer, vocabulary {meta['vocab_size']}), {d.world_size} process(es) on {device}, {dtype}, "
            f"{tokens_per_iter:,} tokens per iteration ({C.gradient_accumulation_steps} x {C.batch_size} x {T})")
        tokenizer = {k: meta[k] for k in ("dataset", "tokenizer", "vocab_size", "chars", "eot_token") if k in meta}
        data = lambda split: (folder, split, C.batch_size, T, device, meta["vocab_size"], meta["redo"])  # noqa: E731
        tk.on_interrupt(f"no checkpoint was written yet (the first comes at iter {C.eval_interval})")

        # ---------------------------------------------------------------------
        # the training loop
        resumed_at = iter_num if C.init_from == "resume" else None
        t_start, mfu, stop_at = time.time(), None, C.max_iters
        while True:
            lr = tk.get_lr(iter_num, C)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # evaluate, log and checkpoint (not again at the iteration a resume starts from)
            if (iter_num % C.eval_interval == 0 or iter_num == stop_at) and iter_num != resumed_at:
                losses = estimate_loss(eval_model, C, data, d, ctx)
                say(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                logger.log(dict(iter=iter_num, lr=lr, train_loss=losses["train"], val_loss=losses["val"],
                                time_s=round(time.time() - t_start, 3)))
                if wandb is not None:
                    wandb.log({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"], "lr": lr})
                if (losses["val"] < best_val_loss or C.always_save_checkpoint) and iter_num > 0:
                    best_val_loss = min(best_val_loss, losses["val"])
                    rng = tk.gather_rng_states(d)  # a collective: every rank takes part
                    if d.is_master:
                        tk.save_checkpoint(dict(
                            kind="language", model=raw_model.state_dict(),
                            optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                            model_args=asdict(raw_model.config), iter_num=iter_num, best_val_loss=best_val_loss,
                            config=vars(C), rng=rng, tokenizer=tokenizer), ckpt_path)
                    tk.on_interrupt(f"{ckpt_path} holds iter {iter_num}; continue with the same command "
                                    f"and --init_from=resume")
                    say(f"saved {ckpt_path}")
            if iter_num >= stop_at:
                break

            # one optimizer step: `accum` micro-batches per process, the gradients averaged over
            # the processes at the last one only (no_sync before it)
            t0 = time.time()
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = get_batch(*data("train"), C.seed, TRAIN, iter_num, d.rank * accum + micro)
                with model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                    with ctx:
                        _, loss = model(x, y)
                        loss = loss / accum  # the step's gradient is the mean over its micro-batches
                    scaler.scale(loss).backward()
                loss_sum += loss.detach()
            train_loss = tk.all_reduce_mean(loss_sum, d).item()  # over every micro-batch of every rank
            if not math.isfinite(train_loss):  # stop before the update: the last checkpoint stays good
                raise tk.non_finite(f"training loss ({train_loss}) at iter {iter_num} (lr {lr:.3g}), stopped before "
                                    "the update", ckpt_path, C, dtype)
            if C.grad_clip > 0:
                scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), C.grad_clip)
            scaler.step(optimizer)  # (float16: skipped when the gradients overflowed)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)

            # timing and MFU (per GPU, smoothed, after 5 warm-up steps)
            dt = time.time() - t0
            if iter_num % C.log_interval == 0:
                tokens_per_s = tokens_per_iter / dt
                if device.startswith("cuda") and iter_num - (resumed_at or 0) >= 5:
                    now = estimate_mfu(raw_model, tokens_per_s / d.world_size)
                    mfu = now if mfu is None or now is None else 0.9 * mfu + 0.1 * now
                mfu_text = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
                say(f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.2e}, {1000 * dt:.1f} ms, "
                    f"{tokens_per_s:,.0f} tok/s, mfu {mfu_text}")
                logger.log(dict(iter=iter_num, lr=lr, train_loss=train_loss, time_s=round(time.time() - t_start, 3),
                                tokens_per_s=round(tokens_per_s), mfu=mfu))
            iter_num += 1

            # max_time: every rank must agree to stop at the same iteration (clocks differ)
            if C.max_time > 0 and stop_at > iter_num:
                out = torch.tensor(float(time.time() - t_start >= C.max_time), device=device)
                if d.ddp:
                    torch_dist.all_reduce(out, op=torch_dist.ReduceOp.MAX)
                if out.item():
                    stop_at = iter_num  # evaluate, save and stop at the top of the loop
                    say(f"max_time ({C.max_time:.0f}s) reached at iter {iter_num}")
        if wandb is not None:
            wandb.finish()
        if d.is_master:
            tk.release_out_dir(C.out_dir)
    return raw_model


if __name__ == "__main__":
    tk.run_cli(main, sys.argv[1:])
