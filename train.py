"""
Train a ToST language model (or the GPT-2 softmax baseline), nanoGPT-style.

    python train.py config/pydocs_char_tost.py                 # CPU, a few minutes, no download
    python train.py config/pydocs_char_tost.py --max_iters=500 --device=cpu   # --key=value overrides
    torchrun --standalone --nproc_per_node=8 train.py config/tost_owt.py  # ToST-Base on OpenWebText
    python train.py config/tost_owt.py --eval_only=True --dataset=wikitext2 --eval_split=test

Multi-node (2 nodes x 8 GPUs): on node 0
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=<node 0 ip> --master_port=29500 \\
        train.py config/tost_owt.py
and the same with --node_rank=1 on node 1 (add NCCL_IB_DISABLE=1 without InfiniBand). Every node
reads <data_dir>/<dataset> and writes out_dir from rank 0 only: use a shared filesystem, or run
prepare_openwebtext.py on each node first. CPU-only machines use gloo (the same commands).

Settings are the module globals below; a config file (python, positional) then --key=value
overrides them; unknown keys or values of the wrong type stop with a clear message.

Data: <data_dir>/<dataset>/{train,val}.bin + meta.json from prepare_openwebtext.py. The
embedded corpus "pydocs_char" (docstrings of Python's standard library) is prepared here on
first use; `--text_path=book.txt` prepares any text file at character level the same way
(as <data_dir>/book_char unless --dataset names it; a changed file is noticed, not reused).

Batches are a pure function of (seed, iteration, micro-batch index), so a checkpoint's
iteration number is its data position: init_from="resume" continues exactly, with the loss
sequence an uninterrupted run gives. Checkpoints (out_dir/ckpt.pt) are written atomically and
hold model, optimizer, grad scaler, iteration, config, the RNG states of every rank and the
tokenizer. Evals go to out_dir/log.jsonl (with the training losses every log_interval).
"""

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

# -----------------------------------------------------------------------------
# settings (defaults: ToST-Base on OpenWebText, see config/ for the runs of the README)
# I/O
out_dir = "out"
eval_interval = 2000  # evaluate and checkpoint every this many iterations
log_interval = 1  # print (and log to log.jsonl) the training loss every this many iterations
eval_iters = 200  # batches per split for the loss estimate during training
eval_only = False  # score out_dir/ckpt.pt on `eval_split` of `dataset` and exit
eval_split = "val"  # eval_only: "val", "test" (evaluation sets) or "train"
eval_stride = 0  # eval_only: windows of block_size every eval_stride tokens (0: non-overlapping)
eval_tokens = 0  # eval_only: score at most this many tokens of the split (0: all)
always_save_checkpoint = True  # else only when val loss improves
init_from = "scratch"  # "scratch" or "resume" (from out_dir/ckpt.pt)
# logging
wandb_log = False
wandb_project = "nanotost"
wandb_run_name = "tost"
# data
dataset = "openwebtext"
data_dir = "data"
text_path = ""  # a plain text file, prepared at character level as <data_dir>/<file stem>_char (or <dataset>)
gradient_accumulation_steps = 5 * 8  # micro-batches per iteration, over all ranks together
batch_size = 12  # sequences per micro-batch
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
# AdamW
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0: no clipping
max_time = 0.0  # seconds of training after which the run stops as if max_iters were reached (0: none)
# learning-rate schedule
decay_lr = True  # False: constant after warmup
lr_schedule = "cosine"  # "cosine", "linear", "invsqrt" or "constant"
warmup_iters = 2000
lr_decay_iters = 600000
min_lr = 6e-5
# system
device = "auto"  # "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
dtype = "auto"  # "auto" (bfloat16 on GPUs that have it, else float16; float32 on CPU), or explicit
compile = False  # torch.compile the model
seed = 1337
num_threads = 0  # torch CPU threads (0: torch's default)
# -----------------------------------------------------------------------------
DEFAULTS = tk.config_defaults(globals())  # the settings above (names defined below are not settings)

MODEL_KEYS = ("n_layer", "n_head", "n_embd", "dropout", "bias", "attn", "pi", "block_size")
EVAL_SEED_TAG, TRAIN_SEED_TAG = 1, 0
SPLIT_CODE = {"train": 0, "val": 1, "test": 2}


class NonFiniteLoss(RuntimeError):
    pass


class UserError(Exception):
    """A problem with the settings or the data that the message tells how to fix."""


# -----------------------------------------------------------------------------
# data


def dataset_folder(C):
    return os.path.join(C.data_dir, C.dataset)


NAMED_CORPORA = ("openwebtext", "wikitext2", "lambada", "ptb", "pydocs_char")


def text_dataset_name(C):
    """The dataset name a text_path run uses: C.dataset, unless that is one of the named corpora
    (e.g. the default "openwebtext" or a config's "pydocs_char"), then "<file stem>_char"."""
    if C.dataset not in NAMED_CORPORA:
        return C.dataset
    return os.path.splitext(os.path.basename(C.text_path))[0] + "_char"


def ensure_dataset(C, dist):
    """The dataset's meta.json. The embedded corpus is prepared on first use; text_path is
    prepared (or found already prepared: prepare() is idempotent and notices a changed file)
    on every run. Rank 0 prepares, then tells the other ranks whether it worked."""
    from prepare_openwebtext import PrepareError, parse_args, prepare, read_meta

    if C.text_path:
        if not os.path.isfile(C.text_path):
            raise UserError(f"text_path {C.text_path!r} is not a file")
        C.dataset = text_dataset_name(C)
    folder = dataset_folder(C)
    error = None  # rank 0's preparation error, shared with every rank
    if dist.is_master and (C.text_path or (C.dataset == "pydocs_char" and read_meta(folder) is None)):
        argv = [f"--data_dir={C.data_dir}", f"--name={C.dataset}", "--char"]
        argv += [f"--input={C.text_path}"] if C.text_path else ["--dataset=pydocs_char"]
        try:
            prepare(parse_args(argv))
        except PrepareError as e:
            error = str(e)
            if "prepared from other settings" in error:  # prepare.py's hints are its own flags
                source = (read_meta(folder) or {}).get("request", {}).get("source")
                error = (f"{folder} was prepared from other text ({source}): another file, or an earlier "
                         f"version of {C.text_path or 'the embedded corpus'}. Pass --dataset=<another name>, "
                         f"or delete {folder} to prepare it again")
    if dist.ddp:  # also the barrier: the others wait here until rank 0 is done
        shared = [error]
        torch_dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error is not None:
        raise UserError(error)
    meta = read_meta(folder)
    if meta is None:
        raise UserError(
            f"dataset {C.dataset!r} is not prepared ({folder}/meta.json is missing). Run "
            f"`python prepare_openwebtext.py --dataset={C.dataset} --data_dir={C.data_dir}` (names: "
            f"{', '.join(NAMED_CORPORA)}), or `--input=<files> --name={C.dataset}` for your own text "
            "(text, jsonl or parquet); or train on the embedded corpus with --dataset=pydocs_char, or on any "
            "text file at character level with --text_path=<file>")
    return meta


class TokenData:
    """The prepared splits of one dataset as uint16 memmaps, and how batches are drawn."""

    def __init__(self, folder, meta, block_size, device):
        self.folder, self.meta, self.block_size, self.device = folder, meta, block_size, device

    def tokens(self, split):
        path = os.path.join(self.folder, f"{split}.bin")
        if not os.path.isfile(path):
            raise UserError(f"{path} does not exist; this dataset has splits: {', '.join(self.meta['splits'])}")
        # a fresh memmap per call: numpy keeps a long-lived one's pages around (memory grows)
        data = np.memmap(path, dtype=np.uint16, mode="r")
        if len(data) < self.block_size + 1:
            raise UserError(f"{path} has {len(data)} tokens, fewer than block_size + 1 = {self.block_size + 1}; "
                             "lower block_size or prepare more text")
        return data

    def batch(self, split, batch_size, *key):
        """batch_size random windows of split, chosen by a generator seeded with `key` only:
        the same key always gives the same batch, on any rank, before or after a resume.
        Returns x, y (B, T) int64 on the device, y = x shifted by one token."""
        data = self.tokens(split)
        starts = np.random.default_rng(list(key)).integers(0, len(data) - self.block_size, size=batch_size)
        x = torch.from_numpy(np.stack([data[i:i + self.block_size] for i in starts]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1:i + 1 + self.block_size] for i in starts]).astype(np.int64))
        return self.to_device(x), self.to_device(y)

    def to_device(self, t):
        if str(self.device).startswith("cuda"):
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)


# -----------------------------------------------------------------------------
# model, optimizer, checkpoint


def padded_vocab(n):
    return (n + 63) // 64 * 64  # a multiple of 64 is faster on GPUs (GPT-2: 50257 -> 50304)


def model_args_from(C, meta):
    args = {k: getattr(C, k) for k in MODEL_KEYS}
    args["layer_scale_init"] = C.layer_scale_init if C.layer_scale_init > 0 else None
    args["vocab_size"] = padded_vocab(meta["vocab_size"])
    return args


def tokenizer_info(meta):
    """What sample.py and eval_only need to know about the tokenizer (kept in the checkpoint)."""
    keys = ("dataset", "tokenizer", "vocab_size", "chars", "eot_token")
    return {k: meta[k] for k in keys if k in meta}


def same_tokenizer(a, b):
    return a["tokenizer"] == b["tokenizer"] and a.get("chars") == b.get("chars")


def save(path, raw_model, optimizer, scaler, C, it, best_val_loss, meta, dist):
    rng = tk.gather_rng_states(dist)
    if not dist.is_master:
        return
    ckpt = {
        "model": tk.clean_state_dict(raw_model.state_dict()),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "model_args": asdict(raw_model.config),
        "iter_num": it,
        "best_val_loss": best_val_loss,
        "config": vars(C),
        "rng": rng,  # one per rank
        "world_size": dist.world_size,
        "data": {"sampler": "batches seeded by (seed, iter, micro-batch index)", "seed": C.seed, "iter": it},
        "tokenizer": tokenizer_info(meta),
    }
    tk.save_checkpoint(ckpt, path)


def build_model(model_args):
    return GPT(GPTConfig(**model_args))


# -----------------------------------------------------------------------------
# evaluation


@torch.no_grad()
def estimate_loss(model, data, C, dist, ctx, splits=("train", "val")):
    """Mean loss over eval_iters fixed batches per split. Batch k is seeded by k alone and done
    by rank k % world_size: every rank works, and the result does not depend on the world size."""
    model.eval()
    out = {}
    for split in splits:
        total = torch.zeros(2, device=dist.device)  # (sum of batch losses, number of batches)
        for k in range(dist.rank, C.eval_iters, dist.world_size):
            x, y = data.batch(split, C.batch_size, C.seed, EVAL_SEED_TAG, SPLIT_CODE[split], k)
            with ctx():
                _, loss = model(x, y)
            total += torch.stack([loss.float(), torch.ones((), device=dist.device)])
        if dist.ddp:
            torch_dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def eval_windows(n_tokens, T, stride):
    """(start, skip) of windows of up to T tokens that score every prediction of a stream of
    n_tokens (n_tokens - 1 predictions) exactly once: a window starts every `stride` tokens and
    its first `skip` predictions were scored by an earlier window (with more context).
    stride = T gives non-overlapping windows."""
    windows, done, start = [], 0, 0  # predictions [0, done) are scored
    while done < n_tokens - 1:
        windows.append((start, done - start))
        done = min(start + T, n_tokens - 1)
        start += stride
    return windows


@torch.no_grad()
def score_split(model, data, split, C, dist, ctx):
    """Cross-entropy over every token of a split (eval_only): windows of the model's block size,
    split over the ranks, summed with an all-reduce. Returns (mean loss, tokens scored)."""
    tokens = data.tokens(split)
    if C.eval_tokens:
        tokens = tokens[:C.eval_tokens + 1]
    T = data.block_size
    stride = C.eval_stride or T
    if not 0 < stride <= T:
        raise UserError(f"eval_stride must be in 1..block_size ({T}), got {C.eval_stride}")
    windows = eval_windows(len(tokens), T, stride)
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=dist.device)  # (sum of losses, tokens)
    mine = windows[dist.rank::dist.world_size]
    for i in range(0, len(mine), C.batch_size):
        xs, ys = [], []
        for start, skip in mine[i:i + C.batch_size]:
            x = np.full(T, 0, dtype=np.int64)
            y = np.full(T, -1, dtype=np.int64)  # -1: not scored (padding, or scored by an earlier window)
            chunk = tokens[start:start + T + 1].astype(np.int64)
            x[:len(chunk) - 1], y[:len(chunk) - 1] = chunk[:-1], chunk[1:]
            y[:skip] = -1
            xs.append(x)
            ys.append(y)
        x, y = data.to_device(torch.from_numpy(np.stack(xs))), data.to_device(torch.from_numpy(np.stack(ys)))
        with ctx():
            _, loss = model(x, y)  # mean over the scored targets
        n = (y != -1).sum()
        total += torch.stack([loss.double() * n, n.double()])
    if dist.ddp:
        torch_dist.all_reduce(total)
    return (total[0] / total[1]).item(), int(total[1].item())


# -----------------------------------------------------------------------------
# setup


def resolve_device_and_dtype(C, dist):
    dev = dist.device
    dt = C.dtype
    if dt == "auto":
        if dev.startswith("cuda"):
            dt = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        else:
            dt = "float32"
    return dev, dt


def setup(argv):
    """Config, distributed setup, device, precision, seeds. Returns (C, dist, device, dtype)."""
    config = tk.configure(DEFAULTS, argv)
    C = SimpleNamespace(**config)
    if C.init_from not in ("scratch", "resume"):
        raise tk.ConfigError(f"init_from must be 'scratch' or 'resume', got {C.init_from!r}")
    dist = tk.setup_distributed(None if C.device == "auto" else C.device)
    if C.num_threads > 0:
        torch.set_num_threads(C.num_threads)
    device, dt = resolve_device_and_dtype(C, dist)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(C.seed + dist.rank)  # dropout differs per rank; weights come from rank 0 (DDP)
    return C, dist, device, dt


def log(dist, *args):
    if dist.is_master:
        print(*args, flush=True)


# -----------------------------------------------------------------------------
# modes


def run_eval_only(C, dist, device, dt, meta):
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")
    ckpt = tk.load_checkpoint(ckpt_path)
    if not same_tokenizer(ckpt["tokenizer"], meta):
        raise UserError(f"{ckpt_path} was trained with the {ckpt['tokenizer']['tokenizer']} tokenizer of "
                         f"{ckpt['tokenizer'].get('dataset')!r}; dataset {C.dataset!r} uses {meta['tokenizer']}: "
                         "prepare the evaluation set with the same tokenizer")
    model = build_model(ckpt["model_args"])
    model.load_state_dict(tk.clean_state_dict(ckpt["model"]))
    model.to(device)
    ctx, _ = tk.autocast_for(device, dt)
    data = TokenData(dataset_folder(C), meta, model.config.block_size, device)
    t0 = time.time()
    loss, n = score_split(model, data, C.eval_split, C, dist, ctx)
    record = dict(type="eval_only", ckpt=ckpt_path, iter=ckpt["iter_num"], dataset=C.dataset, split=C.eval_split,
                  loss=loss, ppl=math.exp(loss), tokens=n, block_size=data.block_size,
                  stride=C.eval_stride or data.block_size)
    log(dist, f"{C.dataset} {C.eval_split}: loss {loss:.4f}, perplexity {math.exp(loss):.2f} "
              f"({n:,} tokens, windows of {data.block_size}, {time.time() - t0:.1f}s)")
    tk.JsonlLogger(os.path.join(C.out_dir, "log.jsonl"), dist.is_master).log(record)
    return record


def build_or_resume(C, meta, device, dt, dist):
    """Model, optimizer and grad scaler, fresh or exactly as out_dir/ckpt.pt left them (then the
    RNG states are restored too). Returns (model, optimizer, scaler, ctx, iter, best val loss)."""
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")
    ckpt = None
    if C.init_from == "resume":
        ckpt = tk.load_checkpoint(ckpt_path)
        wanted = model_args_from(C, meta)
        changed = {k: (ckpt["model_args"].get(k), v) for k, v in wanted.items() if ckpt["model_args"].get(k) != v}
        if changed:
            log(dist, f"resume: the model keeps the checkpoint's settings, ignoring {changed}")
        if not same_tokenizer(ckpt["tokenizer"], meta):
            raise UserError(f"{ckpt_path} was trained on another tokenizer than dataset {C.dataset!r}'s")
        C.seed = ckpt["config"]["seed"]  # the data order continues only with the same seed
    model = build_model(ckpt["model_args"] if ckpt else model_args_from(C, meta))
    if ckpt is not None:
        model.load_state_dict(tk.clean_state_dict(ckpt["model"]))
    model.to(device)
    C.block_size = model.config.block_size  # a resumed model keeps its own
    ctx, scaler = tk.autocast_for(device, dt)
    optimizer = model.configure_optimizers(C.weight_decay, C.learning_rate, (C.beta1, C.beta2),
                                           "cuda" if device.startswith("cuda") else "cpu")
    if ckpt is None:
        return model, optimizer, scaler, ctx, 0, float("inf")
    optimizer.load_state_dict(ckpt["optimizer"])
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    if ckpt["world_size"] == dist.world_size:
        tk.set_rng_state(ckpt["rng"][dist.rank])
    else:
        log(dist, f"resume: the checkpoint ran on {ckpt['world_size']} processes, this run on {dist.world_size}; "
                  "RNG states start fresh (dropout masks differ from an uninterrupted run)")
    log(dist, f"resumed from {ckpt_path} at iter {ckpt['iter_num']}")
    return model, optimizer, scaler, ctx, ckpt["iter_num"], ckpt["best_val_loss"]


def train_step(model, raw_model, optimizer, scaler, ctx, data, C, dist, it, accum):
    """One iteration: `accum` micro-batches on each rank, gradients averaged over the ranks at
    the last one only, clipping, optimizer step. Returns the mean loss over every micro-batch
    of every rank (a NonFiniteLoss, before any update, if it is not finite)."""
    lr = lr_for(it, C)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=raw_model.lm_head.weight.device)
    for micro in range(accum):
        # the batch is a function of (seed, iteration, global micro-batch index) only
        x, y = data.batch("train", C.batch_size, C.seed, TRAIN_SEED_TAG, it, dist.rank * accum + micro)
        sync = not dist.ddp or micro == accum - 1
        with nullcontext() if sync else model.no_sync():
            with ctx():
                _, loss = model(x, y)
            loss = loss / accum
            (scaler.scale(loss) if scaler is not None else loss).backward()
        loss_sum += loss.detach()
    loss_value = tk.all_reduce_mean(loss_sum, dist).item()
    if not math.isfinite(loss_value):
        raise NonFiniteLoss(f"non-finite training loss ({loss_value}) at iter {it} (lr {lr:.3g})")
    tk.optimizer_step(optimizer, raw_model.parameters(), C.grad_clip, scaler)
    return loss_value


def train(C, dist, device, dt, meta):
    """The training loop; returns the trained (unwrapped) model."""
    world = dist.world_size
    if C.gradient_accumulation_steps % world:
        raise tk.ConfigError(f"gradient_accumulation_steps ({C.gradient_accumulation_steps}) must be divisible by "
                             f"the number of processes ({world})")
    accum = C.gradient_accumulation_steps // world  # micro-steps per rank per iteration
    ckpt_path = os.path.join(C.out_dir, "ckpt.pt")
    if dist.is_master:
        os.makedirs(C.out_dir, exist_ok=True)
    raw_model, optimizer, scaler, ctx, it, best_val_loss = build_or_resume(C, meta, device, dt, dist)
    tokens_per_iter = C.gradient_accumulation_steps * C.batch_size * C.block_size
    model = raw_model  # raw_model: the plain module (parameters, checkpoints, MFU)
    if C.compile:
        log(dist, "compiling the model (takes a minute)...")
        model = torch.compile(model)
    eval_model = model  # evaluation skips DDP (no gradients; ranks may do different numbers of batches)
    if dist.ddp:
        model = DDP(model, device_ids=[dist.local_rank] if device.startswith("cuda") else None,
                    find_unused_parameters=C.pi == "uniform")  # uniform Pi leaves temp and pos_bias unused

    data = TokenData(dataset_folder(C), meta, C.block_size, device)
    logger = tk.JsonlLogger(os.path.join(C.out_dir, "log.jsonl"), dist.is_master)
    wandb = None
    if C.wandb_log and dist.is_master:
        try:
            import wandb
        except ImportError:
            raise UserError("wandb_log=True needs wandb: pip install wandb (or set --wandb_log=False)")
        wandb.init(project=C.wandb_project, name=C.wandb_run_name, config=vars(C), resume="allow")
    log(dist, f"{C.attn} model: {raw_model.get_num_params() / 1e6:.2f}M parameters, {C.dataset} "
              f"({meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']}), {world} process(es) on {device}, "
              f"{dt}, {tokens_per_iter:,} tokens per iteration "
              f"({C.gradient_accumulation_steps} x {C.batch_size} x {C.block_size})")

    resumed_at = it if C.init_from == "resume" else None
    t_start, mfu_avg, stop_at = time.time(), None, C.max_iters
    while True:
        # evaluate and checkpoint (not again at the iteration a resume starts from: it was done)
        if (it % C.eval_interval == 0 or it == stop_at) and it != resumed_at:
            losses = estimate_loss(eval_model, data, C, dist, ctx)
            log(dist, f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
            if not all(math.isfinite(v) for v in losses.values()):
                raise NonFiniteLoss(f"non-finite evaluation loss at iter {it}: {losses}")
            logger.log(dict(type="eval", iter=it, train_loss=losses["train"], val_loss=losses["val"],
                            lr=lr_for(it, C), tokens=it * tokens_per_iter, time=round(time.time() - t_start, 3)))
            if wandb is not None:
                wandb.log({"iter": it, "train/loss": losses["train"], "val/loss": losses["val"], "lr": lr_for(it, C)})
            if losses["val"] < best_val_loss or C.always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val"])
                if it > 0:
                    save(ckpt_path, raw_model, optimizer, scaler, C, it, best_val_loss, meta, dist)
                    log(dist, f"saved {ckpt_path}")
        if it >= stop_at:
            break

        t0 = time.time()
        loss = train_step(model, raw_model, optimizer, scaler, ctx, data, C, dist, it, accum)
        dt_iter = time.time() - t0
        if it % C.log_interval == 0:
            tok_s = tokens_per_iter / dt_iter
            mfu = raw_model.estimate_mfu(tok_s / world) if device.startswith("cuda") else None  # per GPU
            if mfu is not None and it - (resumed_at or 0) >= 5:  # skip the first (compile, warm-up) steps
                mfu_avg = mfu if mfu_avg is None else 0.9 * mfu_avg + 0.1 * mfu
            mfu_text = f"{100 * mfu_avg:.1f}%" if mfu_avg is not None else "n/a"
            log(dist, f"iter {it}: loss {loss:.4f}, lr {lr_for(it, C):.2e}, {1000 * dt_iter:.1f} ms, "
                      f"{tok_s:,.0f} tok/s, mfu {mfu_text}")
            logger.log(dict(type="train", iter=it, loss=loss, lr=lr_for(it, C), ms=round(1000 * dt_iter, 2),
                            tok_s=round(tok_s), mfu=mfu_avg))
        it += 1
        if C.max_time > 0 and stop_at > it and out_of_time(t_start, C.max_time, dist):
            stop_at = it  # evaluate, save and stop at the top of the loop
            log(dist, f"max_time ({C.max_time:.0f}s) reached at iter {it}")
    if wandb is not None:
        wandb.finish()
    return raw_model


def lr_for(it, C):
    if not C.decay_lr:
        return tk.lr_at(it, lr=C.learning_rate, min_lr=C.min_lr, warmup_iters=C.warmup_iters,
                        decay_iters=C.lr_decay_iters, schedule="constant")
    return tk.lr_at(it, lr=C.learning_rate, min_lr=C.min_lr, warmup_iters=C.warmup_iters,
                    decay_iters=C.lr_decay_iters, schedule=C.lr_schedule)


def out_of_time(t_start, max_time, dist):
    """Whether max_time has passed, agreed by all ranks (rank clocks differ slightly)."""
    flag = torch.tensor(float(time.time() - t_start >= max_time), device=dist.device)
    if dist.ddp:
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX)
    return bool(flag.item())


def main(argv):
    try:
        C, dist, device, dt = setup(argv)
    except tk.ConfigError as e:
        sys.exit(f"train.py: {e}")
    try:
        meta = ensure_dataset(C, dist)
        if C.eval_only:
            run_eval_only(C, dist, device, dt, meta)
        else:
            train(C, dist, device, dt, meta)
    except NonFiniteLoss as e:
        last = os.path.join(C.out_dir, "ckpt.pt")
        where = f"the last good checkpoint is {last}" if os.path.isfile(last) else "no checkpoint was written"
        if dist.is_master:
            print(f"train.py: stopping: {e}; nothing was saved for it, {where}. Try a lower learning_rate, "
                  "grad_clip=1.0, or dtype=bfloat16 / float32.", file=sys.stderr, flush=True)
        tk.cleanup_distributed(dist, wait=False)
        sys.exit(1)
    except (tk.ConfigError, FileNotFoundError, UserError) as e:
        tk.cleanup_distributed(dist, wait=False)
        sys.exit(f"train.py: {e}")
    tk.cleanup_distributed(dist)


if __name__ == "__main__":
    main(sys.argv[1:])
