"""
Train or fine-tune ToST-ViT (the Token Statistics Transformer for images), or the softmax
baseline of the same size (--attn=softmax), for image classification, nanoGPT-style: the
settings, then main() top to bottom (the checkpoint, the data, DDP, the model, the loop). The
images and the recipes are nanotost/vit_data.py's.

    python vit_train.py config/vit_cpu.py                  # CPU, built-in "shapes" data, minutes
    torchrun --standalone --nproc_per_node=8 vit_train.py config/vit_tost_s.py   # ImageNet-1k
    python vit_train.py config/vit_finetune.py --finetune_from=out-vit-tost-s/ckpt.pt --dataset=cifar10

Data (`dataset`): "shapes" (built in, learnable on a CPU), "cifar10", "cifar100", "imagenet-1k"
(Hugging Face `datasets`) or "folder" (data_dir/train/<class>/* and data_dir/val/<class>/*, or one
tree of class folders); every image file is checked before any work. Recipes (`recipe`):
"builtin" (crops, flips, mixup / cutmix, label smoothing) or "paper" (the paper's ImageNet recipe
through timm; pip install timm, README). Every draw is a function of (seed, epoch, position),
whatever the number of processes, so init_from="resume" continues exactly.

init_from: "scratch", "resume" (out_dir/ckpt.pt, exactly), "auto" (either) or "finetune" (the
body of finetune_from's model, a new head when the classes differ; its architecture, this run's
img_size, dropout and drop_path). out_dir/ckpt.pt is written atomically at every evaluation
(always_save_checkpoint) and log.jsonl gets one JSON line per evaluation. Conventions shared
with train.py and lra/train.py: nanotost/trainkit.py's docstring.
"""

import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import kernels
from model import ToSTViT, ViTConfig
from nanotost import checkpoints, cli, devices, loading, model_settings, ranks, vit_data
from nanotost import trainkit as tk

# -----------------------------------------------------------------------------
# settings. Defaults: a small ToST-ViT on the built-in shapes; config/vit_*.py list only what they change.
out_dir = "out-vit"
init_from = "scratch"  # "scratch" (refuses an out_dir that holds a ckpt.pt), "resume", "auto" (either), "finetune"
finetune_from = ""  # init_from="finetune": a ckpt.pt written by vit_train.py
eval_interval = 500  # iterations between evaluations (and checkpoints)
log_interval = 20  # iterations between progress lines
eval_max_images = 0  # 0: the whole validation split
always_save_checkpoint = True  # False: save only when val accuracy improves
# data
dataset = "shapes"  # "shapes" | "cifar10" | "cifar100" | "imagenet-1k" | "folder"
data_dir = ""  # dataset="folder": the image tree
val_fraction = 0.1  # dataset="folder" without train/ and val/: share of each class held out
img_size = 32
num_workers = 0
shapes_train_size = 20000
shapes_val_size = 2000
shapes_num_classes = 10  # 2..10
shapes_source_size = 32
shapes_seed = 0
# recipe
recipe = "builtin"  # "builtin" (no extra package) | "paper" (timm; MATH.md §6.3)
crop_scale = (0.08, 1.0)  # random resized crop: range of the crop's area
hflip = True
mixup = 0.8  # alpha; 0 = off
cutmix = 1.0  # alpha; 0 = off
mix_prob = 1.0
label_smoothing = 0.1
eval_crop_pct = 0.875  # evaluation: resize the short side to img_size / eval_crop_pct, centre crop
randaugment = "rand-m9-mstd0.5-inc1"  # recipe="paper": timm's RandAugment policy
random_erasing = 0.25  # recipe="paper"
repeated_aug = 3  # recipe="paper": each image seen this many times per epoch (1 = off)
# model (resume and finetune take the checkpoint's architecture)
n_layer = 6
n_head = 4
n_embd = 192
patch_size = 4
mlp_ratio = 4.0
dropout = 0.0
drop_path = 0.0  # stochastic depth, the same rate in every ToST block
layer_scale_init = 1.0  # 0: no layer scale
attn = "tssa"  # a name of model.ATTENTIONS: "tssa", "softmax", "linear" (baselines at the same size)
pi = "softmax"  # a name of model.PI_MODES: "softmax" | "uniform" (ablation)
n_cls_layers = 2
tssa_impl = "torch"
# AdamW, learning-rate schedule (trainkit's get_lr: warmup, then decay to min_lr at lr_decay_iters)
batch_size = 128  # images per process per micro-step
gradient_accumulation_steps = 1  # micro-steps per optimizer step over all processes
max_iters = 5000
learning_rate = 1e-3
min_lr = 1e-5
warmup_iters = 250
lr_decay_iters = 0  # 0: max_iters
lr_schedule = "cosine"  # "cosine", "linear" or "constant"
weight_decay = 0.05
beta1 = 0.9
beta2 = 0.999
grad_clip = 1.0  # 0: off
max_time = 0.0  # seconds after which the run evaluates, saves and stops (0: no limit)
# system
device = "auto"  # "auto" (this rank's GPU if there is one, else Apple's mps, else cpu), "cpu", "cuda:1", "mps"
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False
compile_mode = "default"  # torch.compile's mode (train.py's setting)
num_threads = 0  # CPU threads for torch (0: torch's default)
ddp_timeout_s = ranks.DDP_TIMEOUT_S  # under torchrun: how long a rank waits for the others at a collective (seconds)
sync_bn = True  # under DDP on GPUs: SyncBatchNorm in the patch embedding
seed = 1337
# -----------------------------------------------------------------------------
# the settings above, and every field of ViTConfig not among them (the classes and channels come from the data);
# MODEL_KEYS: those fields, the architecture (nothing defined below is a setting)
DEFAULTS, MODEL_KEYS = model_settings.with_model_fields(cli.config_defaults(globals()), ViTConfig,
                                                        ("num_classes", "in_chans"))
FINETUNE_OWN = ("img_size", "dropout", "drop_path")  # what a fine-tuning run sets itself


def check_settings(cfg):
    """Every setting that can be wrong on its own, checked before anything is built."""
    cli.check(cfg, **model_settings.with_model_ranges(MODEL_KEYS,  # their ranges: a checkpoint's model_args' too
        at_least_1=("eval_interval", "log_interval", "shapes_train_size", "shapes_val_size", "shapes_source_size",
                    "repeated_aug", "batch_size", "gradient_accumulation_steps"),
        non_negative=("eval_max_images", "mixup", "cutmix", "max_iters", "min_lr", "warmup_iters", "lr_decay_iters",
                      "weight_decay", "grad_clip", "max_time"),
        positive=("learning_rate", "eval_crop_pct"), seed=("seed", "shapes_seed"),
        fraction=("val_fraction", "label_smoothing", "beta1", "beta2"), workers=("num_workers", "num_threads"),
        between={"mix_prob": (0.0, 1.0), "random_erasing": (0.0, 1.0), "eval_crop_pct": (0.0, 1.0),
                 "shapes_num_classes": (2, len(vit_data.SHAPES)), "ddp_timeout_s": ranks.DDP_TIMEOUT_RANGE},
        choices={"init_from": ("scratch", "resume", "auto", "finetune"),
                 "dataset": ("shapes", "folder", *vit_data.HF_DATASETS), "recipe": ("builtin", "paper"),
                 "tssa_impl": kernels.IMPLS, "lr_schedule": ("cosine", "linear", "constant")}))
    low_high = cfg.crop_scale
    cli.require(len(low_high) == 2 and all(type(v) in (int, float) for v in low_high)
                and 0 < low_high[0] <= low_high[1] <= 1,
                f"crop_scale must be two numbers (low, high) with 0 < low <= high <= 1, got {low_high!r}")
    cli.require(cfg.patch_size >= 2 and cfg.patch_size & (cfg.patch_size - 1) == 0,
                f"patch_size must be a power of two >= 2 (stride-2 convolutions), got {cfg.patch_size}")
    cli.require(cfg.img_size % cfg.patch_size == 0,
                f"img_size ({cfg.img_size}) must be divisible by patch_size ({cfg.patch_size})")
    cli.require(cfg.n_embd % cfg.n_head == 0, f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    cli.require(cfg.n_embd >= cfg.patch_size // 2, f"n_embd ({cfg.n_embd}) must be at least patch_size / 2 "
                f"({cfg.patch_size // 2}): the patch embedding halves it per convolution")
    cli.require(cfg.out_dir, "out_dir must not be empty")
    cli.require(cfg.dataset != "folder" or cfg.data_dir,
                "dataset='folder' needs --data_dir=<a folder of class folders>")


@torch.no_grad()
def evaluate(model, loader, ctx, d, dataset):
    """(accuracy, mean cross-entropy) over this process's validation batches, summed over all
    processes. Every rank first takes rank 0's BatchNorm statistics (the checkpoint's), as a
    forward through DDP would."""
    model.eval()
    if d.ddp:
        for buffer in model.buffers():
            torch_dist.broadcast(buffer, 0)
    sums = torch.zeros(3, device=d.device, dtype=torch.float64)  # correct, loss sum, count
    for images, labels in loader:
        labels = labels.to(d.device)
        with ctx:
            logits = model(vit_data.to_input(images, dataset, d.device))
        sums += torch.stack([(logits.argmax(-1) == labels).sum().double(),
                             F.cross_entropy(logits.float(), labels, reduction="sum").double(),
                             torch.tensor(labels.numel(), device=d.device, dtype=torch.float64)])
    if d.ddp:
        torch_dist.all_reduce(sums)
    model.train()
    return (sums[0] / sums[2]).item(), (sums[1] / sums[2]).item()


def main(argv):
    # -------------------------------------------------------------------------
    # settings: the globals above, then config files and --key=value, then checks
    cfg, given = cli.configure(DEFAULTS, argv)
    check_settings(cfg)
    tk.check_shared_settings(cfg, given, "a ckpt.pt written by vit_train.py")  # (the trainers' rules, as train.py's)
    device, dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    resume_cmd = tk.init_from_auto(cfg, ckpt_path)  # auto: continue the run in out_dir if any; the command that does
    if cfg.init_from != "resume" and os.path.exists(ckpt_path):  # before the data is read (claim_out_dir checks again)
        raise cli.UserError(f"{ckpt_path} already exists and init_from={cfg.init_from!r} would overwrite it: continue "
                            "that run with --init_from=resume, or write this one elsewhere with --out_dir=<new folder>")

    # -------------------------------------------------------------------------
    # the checkpoint to continue (its architecture, dataset and seed win), or to fine-tune (its
    # architecture, this run's img_size, dropout and drop_path)
    ckpt = None
    if cfg.init_from == "resume":
        ckpt = tk.load_checkpoint(ckpt_path, "vit", "resume")
        tk.take_settings(ckpt, cfg, given, MODEL_KEYS + ("dataset", "seed"), ckpt_path, check_settings)
    elif cfg.init_from == "finetune":
        pretrained, ckpt = loading.load_vit_model(cfg.finetune_from, tssa_impl=cfg.tssa_impl,
                                                   **{k: getattr(cfg, k) for k in FINETUNE_OWN})
        body = tuple(k for k in MODEL_KEYS if k not in FINETUNE_OWN)
        tk.take_settings(ckpt, cfg, given, body, cfg.finetune_from, check_settings)

    # -------------------------------------------------------------------------
    # the data, read and checked before anything is written to out_dir
    train_src, val_src = vit_data.build_sources(cfg)
    num_classes = len(train_src.classes)
    if cfg.init_from == "resume" and ckpt["classes"] != train_src.classes:
        raise cli.UserError(f"{ckpt_path} classifies {len(ckpt['classes'])} classes, dataset {cfg.dataset!r} has "
                            f"other classes ({num_classes}): resume it on its own data, or start from it with "
                            f"--init_from=finetune --finetune_from={ckpt_path} --out_dir=<new folder>")
    if cfg.init_from == "resume" and ckpt["iter_num"] >= cfg.max_iters:  # (after the classes: those are refused first)
        print(f"{ckpt_path} already reached max_iters={cfg.max_iters} (iter {ckpt['iter_num']}): nothing to do; "
              f"raise --max_iters to train it further, or look inside it: python vit_inspect.py --ckpt={ckpt_path}")
        return None

    # -------------------------------------------------------------------------
    # DDP from torchrun's environment (one process without torchrun)
    with ranks.distributed(device, cfg.ddp_timeout_s) as d:
        device = d.device
        say = print if d.is_master else (lambda *a, **k: None)
        cli.require(cfg.gradient_accumulation_steps % d.world_size == 0,
                    f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) must be divisible by the "
                    f"number of processes ({d.world_size})")
        accum = cfg.gradient_accumulation_steps // d.world_size  # micro-steps of this process per optimizer step
        start = ckpt["iter_num"] * accum if cfg.init_from == "resume" else 0  # this process's next micro-step
        train_loader, val_loader = vit_data.loaders(train_src, val_src, cfg, d, start)  # (checked: >= 1 batch)
        mix = vit_data.mixer(cfg, num_classes)  # the recipe's mixup / cutmix and label smoothing
        torch.manual_seed(cfg.seed + d.rank)  # dropout differs per rank; the weights come from rank 0 (DDP)
        np.random.seed((cfg.seed + d.rank) % 2**32)  # timm's Mixup draws from numpy's and python's generators
        random.seed(cfg.seed + d.rank)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

        # ---------------------------------------------------------------------
        # the model: fresh, or the checkpoint's (finetune: its body, a new head for other classes)
        if cfg.init_from == "finetune":
            model = pretrained
            if model.config.num_classes != num_classes:
                model.reset_classifier(num_classes)
        else:
            model_args = {k: getattr(cfg, k) for k in MODEL_KEYS}
            model_args["layer_scale_init"] = cfg.layer_scale_init or None  # 0: none
            model = cli.build(ToSTViT, ViTConfig(**model_args, num_classes=num_classes))  # (a ValueError: one line)
            if cfg.tssa_impl != "torch":  # fused operators in place of model.py's
                kernels.use(model, cfg.tssa_impl)
        model = model.to(device)
        if d.ddp and cfg.sync_bn and device.startswith("cuda"):  # the patch embedding's BatchNorm over all GPUs
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        raw_model = model  # the plain module: parameters, checkpoints
        if d.is_master:  # (once the model and its operators are accepted: a refusal leaves no out_dir)
            tk.claim_out_dir(cfg.out_dir, cfg.init_from)  # a lock; a scratch run never overwrites a checkpoint

        # ---------------------------------------------------------------------
        # optimizer and precision: autocast for the forward pass, a GradScaler for float16
        device_type = device.split(":")[0]  # "cuda", "mps" or "cpu": autocast's and the scaler's
        optimizer = tk.configure_adamw(model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
        ctx = torch.autocast(device_type, dtype=devices.DTYPES[dtype], enabled=dtype != "float32")
        scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
        iter_num, best_val_loss, best_val_acc = 0, float("inf"), 0.0
        if cfg.init_from == "resume":
            checkpoints.load_weights(model, ckpt["model"], ckpt_path)
            optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt.get("scaler"):  # (empty when the run that saved it had no float16 scaler)
                scaler.load_state_dict(ckpt["scaler"])
            iter_num, best_val_loss, best_val_acc = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["best_val_acc"]
            tk.restore_rng(ckpt["rng"], d, say)
            say(f"resumed from {ckpt_path} at iter {iter_num}")
        ckpt = pretrained = None  # free the memory
        if cfg.compile:
            say("compiling the model (takes a minute)...")
            model = torch.compile(model, mode=cfg.compile_mode)
        eval_model = model  # evaluation skips DDP (no gradients)
        if d.ddp:
            model = DDP(model, device_ids=[d.local_rank] if device.startswith("cuda") else None,
                        find_unused_parameters=cfg.pi != "softmax")  # (uniform Pi leaves gamma unused)

        # ---------------------------------------------------------------------
        # logging
        logger = tk.JsonlLogger(os.path.join(cfg.out_dir, "log.jsonl"), d.is_master, fresh=cfg.init_from != "resume",
                                resume_at=iter_num if cfg.init_from == "resume" else None)  # each iteration once
        images_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size
        say(f"{cfg.attn} ViT: {raw_model.get_num_params() / 1e6:.2f}M parameters, {num_classes} classes, "
            f"{len(train_src)} train / {len(val_src)} val images, {d.world_size} process(es) on {device}, {dtype}, "
            f"recipe {cfg.recipe}, {images_per_iter} images per iteration")
        if cfg.init_from == "resume":
            cli.on_interrupt(f"{ckpt_path} holds iter {iter_num}; continue with {resume_cmd}")

        # ---------------------------------------------------------------------
        # the training loop
        resumed_at = iter_num if cfg.init_from == "resume" else None
        t_start, stop_at = time.time(), cfg.max_iters
        train_iter, train_losses = iter(train_loader), []  # the training losses since the last evaluation
        while True:
            lr = tk.get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # evaluate, log and checkpoint (not again at the iteration a resume starts from)
            if (iter_num % cfg.eval_interval == 0 or iter_num == stop_at) and iter_num != resumed_at:
                val_acc, val_loss = evaluate(eval_model, val_loader, ctx, d, cfg.dataset)
                train_loss = sum(train_losses) / len(train_losses) if train_losses else None
                train_losses = []
                say(f"step {iter_num}: val acc {100 * val_acc:.2f}%, val loss {val_loss:.4f}, train loss "
                    + ("-" if train_loss is None else f"{train_loss:.4f}"))
                logger.log(dict(iter=iter_num, lr=lr, train_loss=train_loss, val_loss=val_loss, val_acc=val_acc,
                                time_s=round(time.time() - t_start, 3)))
                if not math.isfinite(val_loss):  # the last update broke the weights: do not save them
                    raise tk.non_finite(f"validation loss ({val_loss}) at iter {iter_num}, not saved", ckpt_path,
                                        cfg, dtype)
                improved = val_acc > best_val_acc
                best_val_loss, best_val_acc = min(best_val_loss, val_loss), max(best_val_acc, val_acc)
                if cfg.always_save_checkpoint or improved or iter_num == stop_at:
                    rng = tk.gather_rng_states(d)  # a collective: every rank takes part
                    left = f"{ckpt_path} holds iter {iter_num}; continue with {resume_cmd}"  # an interrupt's line
                    if d.is_master:  # (what an interrupt then says changes with the file's rename)
                        checkpoints.save_checkpoint(dict(
                            kind="vit", model=raw_model.state_dict(),
                            optimizer=optimizer.state_dict(), scaler=scaler.state_dict(),
                            model_args=asdict(raw_model.config), iter_num=iter_num, best_val_loss=best_val_loss,
                            config=vars(cfg), rng=rng, best_val_acc=best_val_acc, classes=train_src.classes), ckpt_path,
                            saved=left)
                    cli.on_interrupt(left)  # (the other ranks' too)
                    say(f"saved {ckpt_path}")
            if iter_num >= stop_at:
                break

            # one optimizer step: `accum` micro-batches per process, the gradients averaged over
            # the processes at the last one only (no_sync before it)
            t0 = time.time()
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                images, labels = next(train_iter)
                step = (iter_num * accum + micro) * d.world_size + d.rank  # the global micro-batch number
                x = vit_data.to_input(images, cfg.dataset, device)  # (B, 3, S, S), normalised
                x, target = mix(x, labels.to(device), step)  # the recipe's mixing; soft targets (B, K)
                with model.no_sync() if d.ddp and micro < accum - 1 else nullcontext():
                    with ctx:
                        logits = model(x)  # (B, K)
                    loss = -(target * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()  # soft-target cross-entropy
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

            # timing (the log gets the mean training loss at each evaluation)
            dt = time.time() - t0
            train_losses.append(train_loss)
            if iter_num % cfg.log_interval == 0:
                say(f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.2e}, {1000 * dt:.1f} ms, "
                    f"{images_per_iter / dt:,.0f} images/s")
            iter_num += 1

            # max_time: every rank must agree to stop at the same iteration (clocks differ)
            if cfg.max_time > 0 and stop_at > iter_num:
                out = torch.tensor(float(time.time() - t_start >= cfg.max_time), device=device)
                if d.ddp:
                    torch_dist.all_reduce(out, op=torch_dist.ReduceOp.MAX)
                if out.item():
                    stop_at = iter_num  # evaluate, save and stop at the top of the loop
                    say(f"max_time ({cfg.max_time:.0f}s) reached at iter {iter_num}")
    return raw_model


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
