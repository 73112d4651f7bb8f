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
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel as DDP

import trainkit as tk
from model import GPT, GPTConfig
from model import TSSA_IMPLS as _TSSA_IMPLS  # (a leading _: not a setting)

# -----------------------------------------------------------------------------
# settings. Defaults: ToST-Base on OpenWebText, the released recipe (config/tost_owt.py says
# which source each value follows); the files in config/ list only what they change.
# I/O
out_dir = "out"
eval_interval = 2000  # evaluate and checkpoint every this many iterations
log_interval = 1  # print (and log) the training loss every this many iterations
eval_iters = 200  # batches per split for the loss estimate
always_save_checkpoint = True  # else only when the val loss improves
init_from = "scratch"  # "scratch" (refuses an out_dir that holds a ckpt.pt) or "resume"
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
attn = "tssa"  # "tssa" or "softmax"
pi = "softmax"  # "softmax" or "uniform" (ablation: every token in every group equally)
layer_scale_init = 1e-5  # 0: no layer scale
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
# AdamW
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-2  # the released ToST-Base config (the paper's text says 0.1)
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0: no clipping
max_time = 0.0  # seconds after which the run evaluates, saves and stops (0: no limit)
# learning-rate schedule: linear warmup, then decay to min_lr at lr_decay_iters
lr_schedule = "cosine"  # "cosine", "linear", "invsqrt" or "constant"
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
TRAIN, EVAL = 0, 1  # seed tags: training batches and evaluation batches never coincide


class NonFiniteLoss(tk.UserError):
    pass


def check_settings(C):
    """Every setting that can be wrong on its own, checked before anything is built."""
    for key in ("eval_interval", "log_interval", "eval_iters", "batch_size", "gradient_accumulation_steps",
                "block_size", "n_layer", "n_head", "n_embd"):
        tk.require(getattr(C, key) >= 1, f"{key} must be at least 1, got {getattr(C, key)}")
    for key in ("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip", "max_time"):
        tk.require(getattr(C, key) >= 0, f"{key} must not be negative, got {getattr(C, key)}")
    tk.require(C.learning_rate > 0, f"learning_rate must be positive, got {C.learning_rate}")
    tk.require(0 <= C.dropout < 1, f"dropout must be in [0, 1), got {C.dropout}")
    tk.require(C.n_embd % C.n_head == 0, f"n_embd ({C.n_embd}) must be divisible by n_head ({C.n_head})")
    for key, allowed in (("init_from", ("scratch", "resume")), ("attn", ("tssa", "softmax")),
                         ("pi", ("softmax", "uniform")), ("tssa_impl", _TSSA_IMPLS), ("lr_schedule", ("cosine", "linear", "invsqrt", "constant"))):
        tk.require(getattr(C, key) in allowed, f"{key} must be one of {', '.join(allowed)}, got {getattr(C, key)!r}")


def read_meta(folder, dataset):
    path = os.path.join(folder, "meta.json")
    if not os.path.isfile(path):
        how = "prepare_char.py" if dataset == "pydocs_char" else f"prepare_openwebtext.py --dataset={dataset}"
        raise tk.UserError(f"dataset {dataset!r} is not prepared ({path} is missing): run `python {how}` "
                           f"(or prepare_openwebtext.py / prepare_char.py --input=<your files> --name={dataset})")
    with open(path) as f:
        return json.load(f)


def tokens(folder, split):
    """A split's token ids, (N,) uint16, memory-mapped (a fresh map per call: numpy keeps a
    long-lived map's pages in memory)."""
    return np.memmap(os.path.join(folder, f"{split}.bin"), dtype=np.uint16, mode="r")


def get_batch(folder, split, B, T, device, *key):
    """B random windows of T + 1 tokens of a split, chosen by a generator seeded with `key`
    alone: the same key gives the same batch on any rank, before or after a resume.
    Returns x, y (B, T) int64 on the device, y = x shifted by one token."""
    data = tokens(folder, split)
    starts = np.random.default_rng(list(key)).integers(0, len(data) - T, size=B)
    xy = torch.from_numpy(np.stack([data[i:i + T + 1] for i in starts]).astype(np.int64))  # (B, T + 1)
    if str(device).startswith("cuda"):
        xy = xy.pin_memory().to(device, non_blocking=True)
    return xy[:, :-1].to(device), xy[:, 1:].to(device)


@torch.no_grad()
def estimate_loss(model, C, folder, block_size, dist, ctx):
    """Mean loss over eval_iters fixed batches per split. Batch k is seeded by k alone and run by
    rank k % world_size: every rank works, and the result does not depend on the world size."""
    model.eval()
    out = {}
    for code, split in enumerate(("train", "val")):
        total = torch.zeros(2, device=dist.device)  # (sum of batch losses, number of batches)
        for k in range(dist.rank, C.eval_iters, dist.world_size):
            x, y = get_batch(folder, split, C.batch_size, block_size, dist.device, C.seed, EVAL, code, k)
            with ctx():
                _, loss = model(x, y)
            total += torch.stack([loss.float(), torch.ones((), device=dist.device)])
        if dist.ddp:
            torch_dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def main(argv):
    # -------------------------------------------------------------------------
    # settings: the globals above, then config files and --key=value, then checks
    C = SimpleNamespace(**tk.configure(DEFAULTS, argv))
    check_settings(C)
    device, dtype = tk.choose_device_dtype(C.device, C.dtype)
    if C.num_threads > 0:
        torch.set_num_threads(C.num_threads)
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")

    # -------------------------------------------------------------------------
    # DDP from torchrun's environment (one process without torchrun)
    with tk.distributed(device) as dist:
        device, world = dist.device, dist.world_size
        say = print if dist.is_master else (lambda *a, **k: None)
        tk.require(C.gradient_accumulation_steps % world == 0,
                   f"gradient_accumulation_steps ({C.gradient_accumulation_steps}) must be divisible by the "
                   f"number of processes ({world})")
        accum = C.gradient_accumulation_steps // world  # micro-steps of this process per optimizer step
        torch.manual_seed(C.seed + dist.rank)  # dropout differs per rank; the weights come from rank 0 (DDP)
        if device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

        # ---------------------------------------------------------------------
        # the run to continue, if any (its model settings and seed win over the config's)
        ckpt = None
        if C.init_from == "resume":
            ckpt = tk.load_checkpoint(ckpt_path)
            C.seed = ckpt["config"]["seed"]  # the data order continues only with the same seed
            C.block_size = ckpt["model_args"]["block_size"]
        else:
            tk.refuse_overwrite(C.out_dir)

        # ---------------------------------------------------------------------
        # data: checked against block_size before anything big is built
        folder = os.path.join(C.data_dir, C.dataset)
        meta = read_meta(folder, C.dataset)
        for split in ("train", "val"):
            path = os.path.join(folder, f"{split}.bin")
            if not os.path.isfile(path):
                raise tk.UserError(f"{path} is missing (this dataset has: {', '.join(meta['splits'])}); "
                                   "prepare a dataset with train and val splits")
            n = len(tokens(folder, split))
            tk.require(n > C.block_size, f"{path} has {n:,} tokens, not more than block_size ({C.block_size:,}): "
                                         "lower --block_size or prepare more text")
        tokenizer = {k: meta[k] for k in ("dataset", "tokenizer", "vocab_size", "chars", "eot_token") if k in meta}

        # ---------------------------------------------------------------------
        # model and optimizer: fresh, or exactly as the checkpoint left them
        if ckpt is None:
            model_args = dict(n_layer=C.n_layer, n_head=C.n_head, n_embd=C.n_embd, block_size=C.block_size,
                              dropout=C.dropout, bias=C.bias, attn=C.attn, pi=C.pi,
                              layer_scale_init=C.layer_scale_init or None,
                              vocab_size=(meta["vocab_size"] + 63) // 64 * 64)  # GPT-2: 50257 -> 50304, faster
        else:
            model_args = dict(ckpt["model_args"])
            if (ckpt["tokenizer"]["tokenizer"], ckpt["tokenizer"].get("chars")) != (meta["tokenizer"], meta.get("chars")):
                raise tk.UserError(f"{ckpt_path} was trained with another tokenizer than dataset {C.dataset!r}'s")
        model_args["tssa_impl"] = C.tssa_impl  # how to compute, not what: this run's choice
        model = GPT(GPTConfig(**model_args)).to(device)
        raw_model = model  # the plain module: parameters, checkpoints, MFU
        optimizer = model.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2),
                                               "cuda" if device.startswith("cuda") else "cpu")
        ctx, scaler = tk.autocast_for(device, dtype)
        iter_num, best_val_loss = 0, float("inf")
        if ckpt is not None:
            model.load_state_dict(tk.clean_state_dict(ckpt["model"]))
            optimizer.load_state_dict(ckpt["optimizer"])
            if scaler is not None and ckpt.get("scaler") is not None:
                scaler.load_state_dict(ckpt["scaler"])
            iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
            if len(ckpt["rng"]) == world:
                tk.set_rng_state(ckpt["rng"][dist.rank])
            else:
                say(f"resume: the checkpoint ran on {len(ckpt['rng'])} processes, this run on {world}: the RNG "
                    "states start fresh (dropout masks differ from an uninterrupted run)")
            say(f"resumed from {ckpt_path} at iter {iter_num}")
            ckpt = None  # free the memory
        if C.compile:
            say("compiling the model (takes a minute)...")
            model = torch.compile(model)
        eval_model = model  # evaluation skips DDP (no gradients)
        if dist.ddp:
            model = DDP(model, device_ids=[dist.local_rank] if device.startswith("cuda") else None,
                        find_unused_parameters=raw_model.config.pi == "uniform")  # uniform Pi leaves temp unused

        # ---------------------------------------------------------------------
        # logging
        logger = tk.JsonlLogger(os.path.join(C.out_dir, "log.jsonl"), dist.is_master, fresh=C.init_from == "scratch")
        wandb = None
        if C.wandb_log and dist.is_master:
            try:
                import wandb
            except ImportError:
                raise tk.UserError("wandb_log=True needs wandb: pip install wandb (or --wandb_log=False)") from None
            wandb.init(project=C.wandb_project, name=C.wandb_run_name, config=vars(C), resume="allow")
        T = raw_model.config.block_size
        tokens_per_iter = C.gradient_accumulation_steps * C.batch_size * T
        say(f"{raw_model.config.attn} model: {raw_model.get_num_params() / 1e6:.2f}M parameters, {C.dataset} "
            f"({meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']}), {world} process(es) on {device}, "
            f"{dtype}, {tokens_per_iter:,} tokens per iteration ({C.gradient_accumulation_steps} x {C.batch_size} x {T})")

        # ---------------------------------------------------------------------
        # the training loop
        def lr_at(it):
            return tk.lr_at(it, lr=C.learning_rate, min_lr=C.min_lr, warmup_iters=C.warmup_iters,
                            decay_iters=C.lr_decay_iters, schedule=C.lr_schedule)

        resumed_at = iter_num if C.init_from == "resume" else None
        t_start, mfu, stop_at = time.time(), None, C.max_iters
        while True:
            lr = lr_at(iter_num)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # evaluate, log and checkpoint (not again at the iteration a resume starts from)
            if (iter_num % C.eval_interval == 0 or iter_num == stop_at) and iter_num != resumed_at:
                losses = estimate_loss(eval_model, C, folder, T, dist, ctx)
                say(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                if not all(map(math.isfinite, losses.values())):
                    raise NonFiniteLoss(f"non-finite evaluation loss at iter {iter_num}: {losses}")
                logger.log(dict(iter=iter_num, lr=lr, train_loss=losses["train"], val_loss=losses["val"],
                                time_s=round(time.time() - t_start, 3)))
                if wandb is not None:
                    wandb.log({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"], "lr": lr})
                if losses["val"] < best_val_loss or C.always_save_checkpoint:
                    best_val_loss = min(best_val_loss, losses["val"])
                    rng = tk.gather_rng_states(dist)  # a collective: every rank takes part
                    if iter_num > 0 and dist.is_master:
                        tk.save_checkpoint(dict(
                            model=tk.clean_state_dict(raw_model.state_dict()), optimizer=optimizer.state_dict(),
                            scaler=scaler.state_dict() if scaler is not None else None,
                            model_args=asdict(raw_model.config), iter_num=iter_num, best_val_loss=best_val_loss,
                            config=vars(C), rng=rng, tokenizer=tokenizer), ckpt_path)
                        say(f"saved {ckpt_path}")
            if iter_num >= stop_at:
                break

            # one optimizer step: `accum` micro-batches per process, gradients averaged over the
            # processes at the last one only (no_sync before), then clip and step
            t0 = time.time()
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = get_batch(folder, "train", C.batch_size, T, device,  # keyed by the global micro index
                                 C.seed, TRAIN, iter_num, dist.rank * accum + micro)
                with model.no_sync() if dist.ddp and micro < accum - 1 else nullcontext():
                    with ctx():
                        _, loss = model(x, y)
                    loss = loss / accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                loss_sum += loss.detach()
            train_loss = tk.all_reduce_mean(loss_sum, dist).item()  # over every micro-batch of every rank
            if not math.isfinite(train_loss):  # stop before the update: the last checkpoint stays good
                where = (f"the last good checkpoint is {ckpt_path}" if os.path.isfile(ckpt_path)
                         else "no checkpoint was written")
                raise NonFiniteLoss(f"stopping: non-finite training loss ({train_loss}) at iter {iter_num} "
                                    f"(lr {lr:.3g}); nothing was saved for it, {where}. Try a lower learning_rate, "
                                    "grad_clip=1.0, or dtype=bfloat16 / float32")
            tk.optimizer_step(optimizer, raw_model.parameters(), C.grad_clip, scaler)

            # timing and MFU (per GPU, smoothed, after 5 warm-up steps)
            dt = time.time() - t0
            if iter_num % C.log_interval == 0:
                tokens_per_s = tokens_per_iter / dt
                if device.startswith("cuda") and iter_num - (resumed_at or 0) >= 5:
                    now = raw_model.estimate_mfu(tokens_per_s / world)
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
                if dist.ddp:
                    torch_dist.all_reduce(out, op=torch_dist.ReduceOp.MAX)
                if out.item():
                    stop_at = iter_num  # evaluate, save and stop at the top of the loop
                    say(f"max_time ({C.max_time:.0f}s) reached at iter {iter_num}")
        if wandb is not None:
            wandb.finish()
    return raw_model


if __name__ == "__main__":
    tk.run_cli(main, sys.argv[1:])
