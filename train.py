"""
Train a ToST language model (or the GPT-2 softmax baseline), nanoGPT-style: read top to
bottom, it is the whole story (settings, the checkpoint to continue, data, DDP, model,
optimizer, the loop); the plumbing, which a reader need not open, is in nanotost/.

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
losses as an uninterrupted run, and a resume needs no --dataset (the checkpoint's is read).
init_from="finetune" --finetune_from=<ckpt.pt> starts a new run from a checkpoint's weights alone.
out_dir/ckpt.pt is written atomically; evaluations and training losses go to out_dir/log.jsonl.
Scoring a checkpoint on a whole split: evaluate.py; sampling from it: sample.py.
"""

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

import kernels
from model import GPT, GPTConfig
from nanotost import checkpoints, cli, devices, forks, model_settings, ranks
from nanotost import textdata as td
from nanotost import trainkit as tk

# -----------------------------------------------------------------------------
# settings. Defaults: ToST-Base on OpenWebText, the released recipe (config/tost_owt.py says
# which source each value follows); the files in config/ list only what they change.
# I/O
out_dir = "out"
eval_interval = 2000  # evaluate and checkpoint every this many iterations
log_interval = 1  # print (and log) the training loss every this many iterations
eval_iters = 200  # batches per split for the loss estimate
always_save_checkpoint = True  # else only when the val loss improves
init_from = "scratch"  # "scratch" (refuses an out_dir that holds a ckpt.pt), "resume", "auto" (either), "finetune"
finetune_from = ""  # init_from="finetune": a new run from this checkpoint's weights (its architecture, a new optimizer)
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
attn = "tssa"  # a name of model.ATTENTIONS: "tssa", "softmax" (GPT-2), "linear" (linear attention, elu + 1)
pi = "softmax"  # a name of model.PI_MODES: "softmax", or "uniform" (ablation: every token in every group equally)
layer_scale_init = 1e-5  # 0: no layer scale (GPT-2)
short_conv = 0  # opt-in ToST variant: causal depthwise convolution of this kernel size before TSSA (0: off)
hybrid_every = 0  # opt-in variant: every k-th block uses softmax attention (0: off)
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
chunked_loss = False  # the loss a few thousand tokens at a time, never all (B, T, V) logits (long contexts)
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
device = "auto"  # "auto" (this rank's GPU if there is one, else Apple's mps, else cpu), "cpu", "cuda:1", "mps"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False  # torch.compile the model
compile_mode = "default"  # torch.compile's mode: "reduce-overhead" replays the compiled step as CUDA graphs
seed = 1337
num_threads = 0  # torch CPU threads (0: torch's default)
ddp_timeout_s = ranks.DDP_TIMEOUT_S  # under torchrun: how long a rank waits for the others at a collective (seconds)
# -----------------------------------------------------------------------------
# the settings above, and every field of GPTConfig not among them (the vocabulary comes from the data); MODEL_KEYS:
# those fields, the architecture, which a resume takes from the checkpoint (nothing defined below is a setting)
DEFAULTS, MODEL_KEYS = model_settings.with_model_fields(cli.config_defaults(globals()), GPTConfig, ("vocab_size",))
TRAIN, EVAL = 0, 1  # seed tags: training batches and evaluation batches never coincide


def check_settings(cfg):
    """Every setting that can be wrong on its own, checked before anything is built."""
    cli.check(cfg, **model_settings.with_model_ranges(MODEL_KEYS,  # their ranges: a checkpoint's model_args' too
        at_least_1=("eval_interval", "log_interval", "eval_iters", "batch_size", "gradient_accumulation_steps"),
        non_negative=("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip", "max_time"),
        positive=("learning_rate",), fraction=("beta1", "beta2"), seed=("seed",), workers=("num_threads",),
        between={"ddp_timeout_s": ranks.DDP_TIMEOUT_RANGE},
        choices={"init_from": ("scratch", "resume", "auto", "finetune"), "tssa_impl": kernels.IMPLS,
                 "lr_schedule": ("cosine", "linear", "constant", "invsqrt")}))
    cli.build(GPTConfig, **{k: getattr(cfg, k) for k in MODEL_KEYS})  # the model's own rules between settings
    cli.require(cfg.out_dir and cfg.dataset, "out_dir and dataset must not be empty")


@torch.no_grad()
def estimate_loss(model, get_batch, cfg, d, ctx):
    """Mean loss over eval_iters fixed batches per split. Batch k is seeded by k alone and run by
    rank k % world_size: every rank works, and the result does not depend on the world size."""
    model.eval()
    out = {}
    for split_id, split in enumerate(("train", "val")):
        total = torch.zeros(2, device=d.device)  # (sum of batch losses, number of batches)
        for k in range(d.rank, cfg.eval_iters, d.world_size):
            x, y = get_batch(split, cfg.seed, EVAL, split_id, k)
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
    # settings: the globals above, then config files, then --key=value; every one is checked
    # before any work, so a mistake costs one line now rather than a crash an hour in
    cfg, given = cli.configure(DEFAULTS, argv)
    check_settings(cfg)
    tk.check_shared_settings(cfg, given)  # (the trainers' rules between settings, e.g. finetune_from's)
    device, dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    resume_cmd = tk.init_from_auto(cfg, ckpt_path)  # auto: continue the run in out_dir if any; the command that does

    # -------------------------------------------------------------------------
    # the checkpoint to continue, read before the data: a resumed run is the checkpoint's run, so
    # its architecture, dataset and seed win (settings given that differ are refused); a fine-tuned
    # one starts from its weights and keeps its architecture
    ckpt, from_path = None, {"resume": ckpt_path, "finetune": cfg.finetune_from}.get(cfg.init_from)
    if from_path:
        ckpt = tk.load_checkpoint(from_path, "language", "resume" if cfg.init_from == "resume" else "weights")
        tk.take_settings(ckpt, cfg, given, MODEL_KEYS + (("dataset", "seed") if cfg.init_from == "resume" else ()),
                         from_path, check_settings)
        if cfg.init_from == "resume" and ckpt["iter_num"] >= cfg.max_iters:
            print(f"{ckpt_path} already reached max_iters={cfg.max_iters} (iter {ckpt['iter_num']}): nothing to do; "
                  f"raise --max_iters to train it further, or sample from it: python sample.py --out_dir={cfg.out_dir}")
            return None

    # -------------------------------------------------------------------------
    # the data, opened and checked before anything is written to out_dir: a missing or damaged
    # split is one line that says how to prepare it again
    folder, meta = td.open_dataset(cfg.data_dir, cfg.dataset, ("train", "val"), cfg.block_size)
    if ckpt is not None:
        td.check_tokenizer(ckpt, meta, from_path, cfg.dataset, "train it on data prepared with its tokenizer")
    T = cfg.block_size

    def get_batch(split, *key):
        """batch_size random windows of a split -> x, y (B, T) on this rank's device, y = x shifted.
        Where they start is drawn by a generator seeded with `key` alone (seed, TRAIN or EVAL, the
        iteration, the micro-step counted over all ranks), never by a running RNG: a batch is the
        same whichever rank draws it, on any number of processes, and a resumed run draws exactly
        the batches the uninterrupted run would have (the same losses, bit for bit)."""
        starts = np.random.default_rng(list(key)).integers(0, meta["splits"][split] - T, size=cfg.batch_size)
        return td.read_batch(folder, split, starts, T, device, meta)

    # -------------------------------------------------------------------------
    # DDP: with torchrun every process trains a replica on its own micro-batches and the
    # gradients are averaged, so N processes share each step's micro-batches (one without torchrun)
    with ranks.distributed(device, cfg.ddp_timeout_s) as d:
        device = d.device
        say = print if d.is_master else (lambda *a, **k: None)
        cli.require(cfg.gradient_accumulation_steps % d.world_size == 0,
                    f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) must be divisible by the "
                    f"number of processes ({d.world_size})")
        accum = cfg.gradient_accumulation_steps // d.world_size  # micro-steps of this process per optimizer step
        torch.manual_seed(cfg.seed + d.rank)  # dropout differs per rank; the weights come from rank 0 (DDP)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

        # ---------------------------------------------------------------------
        # the model, from MODEL_KEYS alone: a resumed run (whose keys came from the checkpoint)
        # rebuilds the same shapes, and its weights are loaded below
        model_args = {k: getattr(cfg, k) for k in MODEL_KEYS}
        model_args["layer_scale_init"] = cfg.layer_scale_init or None  # 0: none
        model_args["vocab_size"] = (meta["vocab_size"] + 63) // 64 * 64  # GPT-2's 50257 -> 50304: faster matmuls
        model = cli.build(GPT, GPTConfig(**model_args)).to(device)  # (a ValueError: one line)
        forks.check_decoding(model, "training goes on (it runs the parallel form)", d.is_master)  # a fork's, said now
        if cfg.tssa_impl != "torch" or cfg.chunked_loss:  # fused operators or the chunked loss in place of model.py's
            kernels.use(model, cfg.tssa_impl, cfg.chunked_loss, timed_at=(cfg.batch_size, T, dtype, cfg.compile))
        raw_model = model  # the plain module: parameters, checkpoints, MFU
        if d.is_master:  # (once the model and its operators are accepted: a refusal leaves no out_dir)
            tk.claim_out_dir(cfg.out_dir, cfg.init_from)  # a lock; a scratch run never overwrites a checkpoint

        # ---------------------------------------------------------------------
        # optimizer and precision: autocast runs the matmuls in bfloat16 / float16 (fast) while the
        # weights and the optimizer stay float32; float16 needs a GradScaler (small gradients underflow)
        device_type = device.split(":")[0]  # "cuda", "mps" or "cpu": autocast's and the scaler's
        optimizer = tk.configure_adamw(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
        ctx = torch.autocast(device_type, dtype=devices.DTYPES[dtype], enabled=dtype != "float32")
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        iter_num, best_val_loss = 0, float("inf")
        if ckpt is not None:
            checkpoints.load_weights(model, ckpt["model"], from_path)
        if cfg.init_from == "resume":
            optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt.get("scaler"):  # (empty when the run that saved it had no float16 scaler)
                scaler.load_state_dict(ckpt["scaler"])
            iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
            tk.restore_rng(ckpt["rng"], d, say)
            say(f"resumed from {ckpt_path} at iter {iter_num}")
        ckpt = None  # free the memory

        # ---------------------------------------------------------------------
        # compile and DDP, last, around the loaded model; evaluation skips DDP (no gradients to average)
        if cfg.compile:
            say("compiling the model (takes a minute)...")
            model = torch.compile(model, mode=cfg.compile_mode)
        eval_model = model
        if d.ddp:
            model = DDP(model, device_ids=[d.local_rank] if device.startswith("cuda") else None,
                        find_unused_parameters=cfg.pi != "softmax")  # (uniform Pi leaves gamma unused)

        # ---------------------------------------------------------------------
        # logging: log.jsonl is what plots and tests read (a scratch run starts it afresh, a resumed one
        # keeps what came before its checkpoint); wandb optionally; and an interrupt says what it leaves
        logger = tk.JsonlLogger(os.path.join(cfg.out_dir, "log.jsonl"), d.is_master, fresh=cfg.init_from != "resume",
                                resume_at=iter_num if cfg.init_from == "resume" else None)
        wandb = None
        if cfg.wandb_log and d.is_master:
            wandb = tk.start_wandb(cfg.wandb_project, cfg.wandb_run_name, vars(cfg))
        tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * T
        say(f"{cfg.attn} model: {raw_model.get_num_params() / 1e6:.2f}M parameters, {cfg.dataset} ({meta['tokenizer']} "
            f"tokenizer, vocabulary {meta['vocab_size']}), {d.world_size} process(es) on {device}, {dtype}, "
            f"{tokens_per_iter:,} tokens per iteration ({cfg.gradient_accumulation_steps} x {cfg.batch_size} x {T})")
        if cfg.init_from == "resume":
            cli.on_interrupt(f"{ckpt_path} holds iter {iter_num}; continue with {resume_cmd}")
        else:
            cli.on_interrupt(f"no checkpoint was written yet (the first comes at iter {cfg.eval_interval})")

        # ---------------------------------------------------------------------
        # the training loop: the evaluation and the checkpoint come first in an iteration, so the
        # iteration a run stops at (max_iters or max_time) is evaluated and saved before the break
        resumed_at = iter_num if cfg.init_from == "resume" else None
        t_start, mfu, stop_at = time.time(), None, cfg.max_iters
        while True:
            lr = tk.get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # evaluate, log and checkpoint (not again at the iteration a resume starts from)
            if (iter_num % cfg.eval_interval == 0 or iter_num == stop_at) and iter_num != resumed_at:
                losses = estimate_loss(eval_model, get_batch, cfg, d, ctx)
                say(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                logger.log(dict(iter=iter_num, lr=lr, train_loss=losses["train"], val_loss=losses["val"],
                                time_s=round(time.time() - t_start, 3)))
                if wandb is not None:
                    wandb.log({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"], "lr": lr})
                if (losses["val"] < best_val_loss or cfg.always_save_checkpoint) and iter_num > 0:
                    best_val_loss = min(best_val_loss, losses["val"])
                    rng = tk.gather_rng_states(d)  # a collective: every rank takes part
                    left = f"{ckpt_path} holds iter {iter_num}; continue with {resume_cmd}"  # an interrupt's line
                    if d.is_master:  # (what an interrupt then says changes with the file's rename)
                        checkpoints.save_checkpoint(dict(
                            kind="language", model=raw_model.state_dict(),
                            optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                            model_args=asdict(raw_model.config), iter_num=iter_num, best_val_loss=best_val_loss,
                            config=vars(cfg), rng=rng, tokenizer=td.tokenizer_info(meta)), ckpt_path, saved=left)
                    cli.on_interrupt(left)  # (the other ranks' too)
                    say(f"saved {ckpt_path}")
            if iter_num >= stop_at:
                break

            # one optimizer step: `accum` micro-batches per process, the gradients averaged over
            # the processes at the last one only (no_sync before it)
            t0 = time.time()
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = get_batch("train", cfg.seed, TRAIN, iter_num, d.rank * accum + micro)
                with model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                    with ctx:
                        _, loss = model(x, y)
                        loss = loss / accum  # the step's gradient is the mean over its micro-batches
                    scaler.scale(loss).backward()
                loss_sum += loss.detach()
            train_loss = ranks.all_reduce_mean(loss_sum, d).item()  # over every micro-batch of every rank
            if not math.isfinite(train_loss):  # stop before the update: the last checkpoint stays good
                raise tk.non_finite(f"training loss ({train_loss}) at iter {iter_num} (lr {lr:.3g}), stopped before "
                                    "the update", ckpt_path, cfg, dtype)
            if cfg.grad_clip > 0:
                scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)  # (float16: skipped when the gradients overflowed)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)

            # timing and MFU (per GPU, smoothed, after 5 warm-up steps)
            dt = time.time() - t0
            if iter_num % cfg.log_interval == 0:
                tokens_per_s = tokens_per_iter / dt
                if device.startswith("cuda") and iter_num - (resumed_at or 0) >= 5:
                    now = tk.estimate_mfu(raw_model, tokens_per_s / d.world_size)
                    mfu = now if mfu is None or now is None else 0.9 * mfu + 0.1 * now
                mfu_text = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
                say(f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.2e}, {1000 * dt:.1f} ms, "
                    f"{tokens_per_s:,.0f} tok/s, mfu {mfu_text}")
                logger.log(dict(iter=iter_num, lr=lr, train_loss=train_loss, time_s=round(time.time() - t_start, 3),
                                tokens_per_s=round(tokens_per_s), mfu=mfu))
            iter_num += 1

            # max_time: every rank must agree to stop at the same iteration (clocks differ)
            if cfg.max_time > 0 and stop_at > iter_num:
                out = torch.tensor(float(time.time() - t_start >= cfg.max_time), device=device)
                if d.ddp:
                    torch_dist.all_reduce(out, op=torch_dist.ReduceOp.MAX)
                if out.item():
                    stop_at = iter_num  # evaluate, save and stop at the top of the loop
                    say(f"max_time ({cfg.max_time:.0f}s) reached at iter {iter_num}")
        if wandb is not None:
            wandb.finish()
    return raw_model


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
