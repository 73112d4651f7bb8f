"""
Train and evaluate ToST or the softmax Transformer on any Long Range Arena task.

Settings are the module globals below, overridden by config files and --key=value
(nanoGPT style); lra/configs/ holds the paper's per-task settings, one file per task and
model, with the baseline's MLP sized so both models have the same parameter count.

    python lra/train.py lra/configs/listops_tost.py                  # needs data/lra_release
    python lra/train.py lra/configs/listops_softmax.py --data_dir=data/lra_gen
    python lra/train.py lra/configs/text_tost.py --batch_size=16 --gradient_accumulation_steps=2
    torchrun --standalone --nproc_per_node=8 lra/train.py lra/configs/listops_tost.py \\
        --batch_size=8 --gradient_accumulation_steps=8      # the config's 64 examples per step, on 8 GPUs
    python lra/train.py lra/configs/listops_tost.py --init_from=resume   # continue out_dir/ckpt.pt
    python lra/train.py lra/configs/listops_tost.py --eval_only=True      # accuracy of out_dir/ckpt.pt

batch_size and gradient_accumulation_steps mean what they mean in train.py: examples per
process per micro-step, and micro-steps per optimizer step over all processes together, so a
step sees batch_size x gradient_accumulation_steps examples whatever the number of processes.
The policies are train.py's: init_from scratch | resume | auto | finetune (a new run from the
weights of finetune_from, its architecture and task), one run per out_dir (a lock),
a resume keeps the checkpoint's architecture and task (given settings that differ are
refused), a finished run says so, a non-finite training loss stops before the update.
Every eval_interval steps: loss and accuracy on val (and test accuracy whenever val improves),
one JSON line in out_dir/log.jsonl, and an atomic checkpoint out_dir/ckpt.pt that resumes
exactly (model, optimizer, step, every RNG; batches are a function of (seed, step)).
"""

import math
import os
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels
from lra.data import TASKS, get_task, load_split, make_batch
from lra.encoder import LRAClassifier, LRAConfig
from nanotost import checkpoints, cli, devices, model_settings, ranks
from nanotost import trainkit as tk

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
attn = "tssa"  # a name of model.ATTENTIONS: "tssa" (ToST), "softmax" (Transformer), "linear" (linear attention)
pi = "softmax"  # TSSA's Pi, a name of model.PI_MODES: "softmax" | "uniform" (ablation)
n_layer = 2
n_head = 2
n_embd = 64
mlp_hidden = 128
dropout = 0.1
norm = "pre"  # "pre" | "post" (post-norm, the paper's choice for Pathfinder)
bias = True
layer_scale_init = 0.0  # 0: no layer scale
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
eval_interval = 500  # evaluate and checkpoint every this many iterations
eval_batch_size = 0  # 0: batch_size
log_interval = 50
out_dir = "out-lra"
init_from = "scratch"  # "scratch" (refuses an out_dir that holds a ckpt.pt), "resume", "auto" (either), "finetune"
finetune_from = ""  # init_from="finetune": a new run from this checkpoint's weights (its model and task)
eval_only = False  # val and test accuracy of out_dir/ckpt.pt, no training
seed = 1337
# system
device = "auto"  # "auto" (this rank's GPU if there is one, else Apple's mps, else cpu), "cpu", "cuda:1", "mps"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False
compile_mode = "default"  # torch.compile's mode (train.py's setting)
num_threads = 0  # CPU threads for torch (0: torch's default)
ddp_timeout_s = ranks.DDP_TIMEOUT_S  # under torchrun: how long a rank waits for the others at a collective (seconds)
# -----------------------------------------------------------------------------
# the settings above, and every field of LRAConfig not among them (the task gives the vocabulary, classes, length and
# towers); MODEL_KEYS: those fields, the architecture (nothing defined below is a setting)
DEFAULTS, MODEL_KEYS = model_settings.with_model_fields(cli.config_defaults(globals()), LRAConfig,
                                                        ("vocab_size", "num_classes", "max_len", "two_tower"))
TASK_KEYS = ("task", "max_len")  # what a checkpoint's position table and head were built for


def check_settings(cfg):
    """Every setting that can be wrong on its own, checked before anything is read or written."""
    cli.check(cfg, **model_settings.with_model_ranges(MODEL_KEYS,  # their ranges: a checkpoint's model_args' too
        at_least_1=("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "pad_multiple",
                    "load_workers"),
        non_negative=("max_iters", "warmup_iters", "lr_decay_iters", "min_lr", "weight_decay", "grad_clip", "max_len",
                      "eval_batch_size", "n_train", "n_eval"),
        positive=("learning_rate",), fraction=("beta1", "beta2"), seed=("seed",),
        workers=("load_workers", "num_threads"), between={"ddp_timeout_s": ranks.DDP_TIMEOUT_RANGE},
        choices={"task": tuple(TASKS), "init_from": ("scratch", "resume", "auto", "finetune"),
                 "tssa_impl": kernels.IMPLS, "lr_schedule": ("linear", "cosine", "invsqrt", "constant")}))
    cli.require(cfg.n_embd % cfg.n_head == 0, f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    cli.require(cfg.norm == "post" or int(cfg.mlp_hidden / cfg.n_embd * cfg.n_embd) == cfg.mlp_hidden,
                f"mlp_hidden ({cfg.mlp_hidden}) / n_embd ({cfg.n_embd}) is not a ratio model.Block (norm='pre') can "
                "turn back into mlp_hidden: pick another --mlp_hidden, or --norm=post")
    cli.require(cfg.out_dir and cfg.data_dir, "out_dir and data_dir must not be empty")
    cli.require(not (cfg.eval_only and cfg.init_from == "finetune"),
                "eval_only scores out_dir/ckpt.pt: drop --init_from")
    top = os.path.abspath(cfg.out_dir)  # the part of out_dir that exists must be a folder
    while not os.path.exists(top):
        top = os.path.dirname(top)
    cli.require(os.path.isdir(top), f"out_dir {cfg.out_dir!r}: {top} is a file, not a folder: choose another --out_dir")


def model_config(cfg):
    """The classifier the settings describe (sizes from the task: vocabulary, classes, length)."""
    spec = get_task(cfg.task)
    settings = {**{k: getattr(cfg, k) for k in MODEL_KEYS}, "layer_scale_init": cfg.layer_scale_init or None}  # 0: none
    return LRAConfig(vocab_size=spec.vocab_size, num_classes=spec.num_classes,
                     max_len=min(cfg.max_len or spec.seq_len, spec.seq_len), two_tower=spec.two_tower, **settings)


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
    nb = device.startswith("cuda")
    moved = [(t.to(device, non_blocking=nb), None if m.all() else m.to(device, non_blocking=nb)) for t, m in towers]
    return moved, labels.to(device, non_blocking=nb)


@torch.no_grad()
def evaluate(model, split, cfg, max_len, ctx, d):
    """(mean loss, accuracy) on a whole split. Examples are sorted by length so batches carry
    little padding; under DDP each rank takes every world_size-th batch."""
    model.eval()
    lengths = np.max([r.lengths() for r in split.inputs], axis=0)
    order = np.argsort(lengths, kind="stable")
    bs = cfg.eval_batch_size or cfg.batch_size
    batches = [order[i:i + bs] for i in range(0, len(order), bs)][d.rank::d.world_size]
    total = torch.zeros(3, device=d.device)  # (sum of losses, right, seen)
    for idx in tqdm(batches, desc="scoring", unit="batch", leave=False, disable=None if d.is_master else True):
        towers, labels = to_device(*make_batch(split, idx, max_len, cfg.pad_multiple), d.device)
        with ctx:
            logits = model(towers)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        total += torch.stack([loss, (logits.argmax(-1) == labels).sum().float(),
                              torch.tensor(float(len(idx)), device=d.device)])
    total = ranks.all_reduce_mean(total, d)  # same ratios as the sums
    model.train()
    seen = total[2].clamp_min(1)
    return (total[0] / seen).item(), (total[1] / seen).item()


def main(argv):
    # -------------------------------------------------------------------------
    # settings: the globals above, then config files and --key=value, then checks
    cfg, given = cli.configure(DEFAULTS, argv)
    check_settings(cfg)
    tk.check_shared_settings(cfg, given)  # (the trainers' rules between settings, as train.py's)
    device, dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    resume_cmd = tk.init_from_auto(cfg, ckpt_path)  # auto: continue the run in out_dir if any; the command that does
    resume = cfg.init_from == "resume" and not cfg.eval_only  # (eval_only: out_dir's weights, no optimizer)
    from_path = ckpt_path if resume or cfg.eval_only else cfg.finetune_from if cfg.init_from == "finetune" else None

    # -------------------------------------------------------------------------
    # DDP from torchrun's environment (one process without torchrun)
    with ranks.distributed(device, cfg.ddp_timeout_s) as d, ExitStack() as cleanup:
        device = d.device
        say = print if d.is_master else (lambda *a, **k: None)
        cli.require(cfg.gradient_accumulation_steps % d.world_size == 0,
                    f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) must be divisible by the "
                    f"number of processes ({d.world_size})")
        accum = cfg.gradient_accumulation_steps // d.world_size  # micro-steps of this process per optimizer step
        torch.manual_seed(cfg.seed + d.rank)  # dropout differs per rank; the weights come from rank 0 (DDP)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

        # ---------------------------------------------------------------------
        # the run to continue or score: its architecture, task and seed win (fine-tuning: its
        # architecture and task, a new optimizer)
        ckpt = None
        if from_path:
            ckpt = tk.load_checkpoint(from_path, "lra", "resume" if resume else "weights")
            stamp = (os.stat(ckpt_path).st_ino, os.stat(ckpt_path).st_mtime_ns) if resume else None  # a save renames
            own = ("seed",) if cfg.init_from != "finetune" else ()
            tk.take_settings(ckpt, cfg, given, MODEL_KEYS + TASK_KEYS + own, from_path, check_settings)
            if resume and ckpt["iter_num"] >= cfg.max_iters:
                say(f"{ckpt_path} already reached max_iters={cfg.max_iters} (iter {ckpt['iter_num']}, best val acc "
                    f"{ckpt['best_val_acc']:.4f}): nothing to do; raise --max_iters to train it further, or "
                    f"score it with --eval_only=True")
                return None
        mconf = model_config(cfg)

        # ---------------------------------------------------------------------
        # the data, checked when loaded (damage is one line naming the file and line), before
        # anything is written to out_dir
        def load(split, n):
            data = load_split(cfg.task, split, cfg.data_dir, mconf.max_len, cfg.cache_dir, cfg.hf_text, cfg.hf_image,
                              cfg.load_workers, say).subset(n)
            if data.cropped:
                say(f"{cfg.task} {split}: {data.cropped:,} of {len(data):,} sequences are longer than max_len "
                    f"and were cropped to {mconf.max_len:,} tokens (the task's LRA length is "
                    f"{get_task(cfg.task).seq_len:,})")
            return data

        val, test = load("val", cfg.n_eval), load("test", cfg.n_eval)
        train = None if cfg.eval_only else load("train", cfg.n_train)
        if train is not None:
            say(f"{cfg.task}: {len(train)} train / {len(val)} val / {len(test)} test examples")
        if d.is_master and not cfg.eval_only:
            tk.claim_out_dir(cfg.out_dir, cfg.init_from)  # a lock; a scratch run never overwrites a checkpoint
            cleanup.callback(tk.release_out_dir, cfg.out_dir)
            if resume and (os.stat(ckpt_path).st_ino, os.stat(ckpt_path).st_mtime_ns) != stamp:
                raise cli.UserError(f"{ckpt_path} was rewritten while this run loaded it (by a run that has "
                                    "ended since): start this one again to continue from the new checkpoint")

        # ---------------------------------------------------------------------
        # model, optimizer and precision, fresh or exactly as the checkpoint left them
        model = cli.build(LRAClassifier, mconf).to(device)  # (a ValueError: one line)
        if cfg.tssa_impl != "torch":  # fused operators in place of model.py's
            kernels.use(model, cfg.tssa_impl)
        raw_model = model  # the plain module: parameters, checkpoints
        device_type = device.split(":")[0]  # "cuda", "mps" or "cpu": autocast's and the scaler's
        optimizer = tk.configure_adamw(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
        ctx = torch.autocast(device_type, dtype=devices.DTYPES[dtype], enabled=dtype != "float32")
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        start_iter, best_val_loss, best_val, test_at_best = 0, float("inf"), -1.0, None
        if ckpt is not None:
            checkpoints.load_weights(model, ckpt["model"], from_path)
            start_iter = ckpt["iter_num"] if cfg.init_from != "finetune" else 0
        if resume:
            optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt.get("scaler"):  # (empty when the run that saved it had no float16 scaler)
                scaler.load_state_dict(ckpt["scaler"])
            best_val_loss, best_val, test_at_best = (ckpt[k] for k in ("best_val_loss", "best_val_acc",
                                                                         "test_acc_at_best_val"))
            tk.restore_rng(ckpt["rng"], d, say)
            say(f"resumed from {ckpt_path} at iter {start_iter}")
        ckpt = None  # free the memory
        n_params = model.get_num_params()
        say(f"model: {mconf.attn} attention, {n_params:,} parameters "
            f"({mconf.n_layer} layers, width {mconf.n_embd}, {mconf.n_head} heads, MLP {mconf.mlp_hidden}, "
            f"{mconf.norm}-norm), {dtype} on {device}, {cfg.batch_size * cfg.gradient_accumulation_steps} examples "
            f"per step ({cfg.gradient_accumulation_steps} x {cfg.batch_size})")
        if cfg.eval_only:
            (val_loss, val_acc), (_, test_acc) = (evaluate(model, s, cfg, mconf.max_len, ctx, d) for s in (val, test))
            result = {"iter": start_iter, "val_loss": val_loss, "val_acc": val_acc, "test_acc": test_acc,
                      "n_params": n_params}
            say(result)
            return result
        if cfg.compile:
            say("compiling the model (takes a minute)...")
            model = torch.compile(model, dynamic=True, mode=cfg.compile_mode)
        eval_model = model  # evaluation skips DDP (no gradients)
        if d.ddp:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[d.local_rank] if device_type == "cuda" else None)
        logger = tk.JsonlLogger(os.path.join(cfg.out_dir, "log.jsonl"), d.is_master, fresh=cfg.init_from != "resume",
                                resume_at=start_iter if cfg.init_from == "resume" else None)  # each iteration once
        if start_iter:
            cli.on_interrupt(f"{ckpt_path} holds iter {start_iter}; continue with {resume_cmd}")
        else:
            cli.on_interrupt(f"no checkpoint was written yet (the first comes at iter {cfg.eval_interval})")

        # ---------------------------------------------------------------------
        # the training loop
        result = {"n_params": n_params}
        t_start, train_loss = time.time(), None
        for it in range(start_iter, cfg.max_iters + 1):
            lr = tk.get_lr(it, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # evaluate, log and checkpoint (not again at the iteration a resume starts from)
            if (it % cfg.eval_interval == 0 or it == cfg.max_iters) and not (start_iter and it == start_iter):
                val_loss, val_acc = evaluate(eval_model, val, cfg, mconf.max_len, ctx, d)
                best_val_loss = min(best_val_loss, val_loss)
                if val_acc > best_val:
                    best_val, test_at_best = val_acc, evaluate(eval_model, test, cfg, mconf.max_len, ctx, d)[1]
                record = dict(iter=it, lr=lr, train_loss=train_loss, val_loss=val_loss, val_acc=val_acc,
                              best_val_acc=best_val, test_acc_at_best_val=test_at_best,
                              time_s=round(time.time() - t_start, 3))
                say(f"step {it}: val loss {val_loss:.4f}, val acc {val_acc:.4f} (best {best_val:.4f}, "
                    f"test at best {test_at_best:.4f})")
                logger.log(record)
                result.update(record)
                if it > 0:
                    rng = tk.gather_rng_states(d)  # a collective: every rank takes part
                    left = f"{ckpt_path} holds iter {it}; continue with {resume_cmd}"  # an interrupt's line
                    if d.is_master:  # (what an interrupt then says changes with the file's rename)
                        checkpoints.save_checkpoint(dict(
                            kind="lra", model=raw_model.state_dict(),
                            optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), model_args=asdict(mconf),
                            iter_num=it, best_val_loss=best_val_loss, best_val_acc=best_val,
                            test_acc_at_best_val=test_at_best, config=vars(cfg), rng=rng), ckpt_path, saved=left)
                    cli.on_interrupt(left)  # (the other ranks' too)
                    say(f"saved {ckpt_path}")
            if it == cfg.max_iters:
                say(f"max_iters={cfg.max_iters} reached: best val acc {best_val:.4f}, test acc at best val "
                    f"{test_at_best:.4f}" + (f"; {ckpt_path} holds iter {it}" if it > 0 else ""))
                break

            # one optimizer step: this process's `accum` micro-batches of batch_size examples,
            # picked by their global micro-step index from the step's batch
            B = cfg.batch_size
            idx = batch_indices(len(train), B * cfg.gradient_accumulation_steps, it, cfg.seed)
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                m = d.rank * accum + micro
                towers, labels = to_device(*make_batch(train, idx[m * B:(m + 1) * B], mconf.max_len,
                                                       cfg.pad_multiple), device)
                with model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                    with ctx:
                        logits = model(towers)
                    loss = F.cross_entropy(logits.float(), labels) / accum  # the mean over the micro-batches
                    scaler.scale(loss).backward()
                loss_sum += loss.detach()
            train_loss = ranks.all_reduce_mean(loss_sum, d).item()  # over every micro-batch of every rank
            if not math.isfinite(train_loss):  # stop before the update: the last checkpoint stays good
                raise tk.non_finite(f"training loss ({train_loss}) at iter {it} (lr {lr:.3g}), stopped before the "
                                    "update", ckpt_path, cfg, dtype)
            if cfg.grad_clip > 0:
                scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)  # (float16: skipped when the gradients overflowed)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if it % cfg.log_interval == 0:
                dt = (time.time() - t_start) / (it - start_iter + 1)
                say(f"iter {it}: loss {train_loss:.4f}, lr {lr:.2e}, {dt * 1000:.0f} ms/iter")
                logger.log(dict(iter=it, lr=lr, train_loss=train_loss, time_s=round(time.time() - t_start, 3)))
    return result


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
