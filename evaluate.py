"""
Score a train.py checkpoint on every token of a split: loss and perplexity (the paper's
Table 4 numbers come from the test splits of prepare_openwebtext.py's evaluation sets).

    python evaluate.py --out_dir=out-tost-owt --dataset=wikitext2 --split=test
    python evaluate.py --out_dir=out-pydocs-char-tost            # the val split of the data it was trained on
    python evaluate.py --init_from=<you>/pydocs-char-tost --split=test   # a model export.py wrote (folder or Hub id)
    torchrun --standalone --nproc_per_node=8 evaluate.py --out_dir=out-tost-owt --dataset=openwebtext

The split is cut into windows of the model's block_size; with --stride < block_size windows
overlap and each token is scored once, by the window that gives it the most context. Every
process scores its share of the windows; the result does not depend on the number of processes.
It is printed (one line), then appended as one JSON record to --out (default out_dir/eval.jsonl;
with --init_from, <folder>-eval.jsonl beside the model's folder, or <name>-eval.jsonl here for a
Hub id: a model's folder stays as it was exported; a default place that cannot be written costs a
warning there, never the printed score).

With --harness=<tasks> the checkpoint is scored by EleutherAI's lm-evaluation-harness instead
(nanotost/lm_eval_adapter.py; an optional extra, pip install lm-eval==0.4.13), on its tasks or task YAML files:

    python evaluate.py --out_dir=out-tost-owt --harness=lambada_openai,wikitext
"""

import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as torch_dist
from tqdm import tqdm

import kernels
from nanotost import atomic, cli, devices, hub, loading, ranks
from nanotost import textdata as td
from nanotost import trainkit as tk

# -----------------------------------------------------------------------------
out_dir = "out"  # folder holding ckpt.pt
init_from = ""  # or a model export.py wrote: its folder, or its Hugging Face Hub id
dataset = ""  # "": the dataset the checkpoint was trained on
data_dir = "data"
split = "val"  # "val", "test" (evaluation sets) or "train"
stride = 0  # windows of block_size every `stride` tokens (0: block_size, no overlap)
max_tokens = 0  # score at most this many tokens of the split (0: all)
batch_size = 8  # windows per forward pass
device = "auto"
dtype = "auto"
num_threads = 0
ddp_timeout_s = ranks.DDP_TIMEOUT_S  # under torchrun: how long a rank waits for the others at a collective (seconds)
tssa_impl = "torch"  # which implementation of the TSSA operator the model runs
harness = ""  # lm-eval tasks instead of a split: names or task YAML files, comma-separated
harness_limit = 0  # at most this many documents per harness task (0: all)
out = ""  # the JSON lines file the result is appended to ("": out_dir/eval.jsonl, skipped with a warning if unwritable)
# -----------------------------------------------------------------------------
SPLIT_ONLY = ("dataset", "data_dir", "split", "max_tokens")  # settings of a split's scoring, not of --harness


def check_settings(cfg, given):
    """Every setting, checked before any work, with the settings one mode ignores refused in the
    other (a setting given must do something) and an --out given checked to be writable."""
    cli.check(cfg, at_least_1=("batch_size",), non_negative=("stride", "max_tokens", "harness_limit"),
              workers=("num_threads",), between={"ddp_timeout_s": ranks.DDP_TIMEOUT_RANGE},
              choices={"tssa_impl": kernels.IMPLS})
    ignored = ", ".join(f"--{k}" for k in SPLIT_ONLY if k in given)
    cli.require(not (cfg.harness and ignored), f"--harness scores lm-eval's tasks, not a split: drop {ignored} "
                                             "(--harness_limit limits the documents per task)")
    if cfg.harness:  # each task once (lm-eval would run a name twice), at least one
        cli.name_list("harness", cfg.harness, paths=True)
    cli.require(cfg.harness or "harness_limit" not in given,
                "--harness_limit limits the documents of --harness=<tasks>: drop it, or give --harness")
    record_path(cfg)  # (where the result goes: never inside a model's folder)
    if cfg.out:
        cli.require(not os.path.isdir(cfg.out),
                    f"--out={cfg.out} is a folder: give a file, e.g. --out={cfg.out}/eval.jsonl")
        existing = os.path.dirname(os.path.abspath(cfg.out))
        while not os.path.exists(existing):  # the part of the path that exists: a folder that can be written
            existing = os.path.dirname(existing)
        cli.require(os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK),
                    f"--out={cfg.out} cannot be written ({existing} is not a writable folder): choose another --out")


def record_path(cfg):
    """--out, else beside the model's folder (--init_from), else out_dir/eval.jsonl: never inside a
    model's folder (hub.check_outside)."""
    path = cfg.out or (hub.beside(cfg.init_from, "eval.jsonl") if cfg.init_from else
                       os.path.join(cfg.out_dir, "eval.jsonl"))
    if cfg.init_from:
        hub.check_outside(path, cfg.init_from, "--out", "eval.jsonl")
    return path


def save_record(record, cfg):
    """Append the printed result to --out; where none was given, a failure to write out_dir/
    eval.jsonl (a read-only checkpoint folder) is a warning: the score is out already."""
    path = record_path(cfg)
    atomic.check_finite_result(record, "the score", "score it in float32 (--dtype=float32), or check the model")
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tk.JsonlLogger(path).log(record)
    except OSError as e:
        if cfg.out:
            raise
        print(f"evaluate.py: warning: the result was not saved ({cli.os_error_line(e)}); --out=<file> saves it "
              "elsewhere", file=sys.stderr)
        return
    print(f"appended to {path}")


def run_harness(cfg, given):
    """--harness: lm-eval's tasks on the checkpoint, in one process (nanotost/lm_eval_adapter.py); prints
    lm-eval's table and appends the metrics to --out (save_record)."""
    cli.require("RANK" not in os.environ, "--harness runs in one process: python evaluate.py, not torchrun")
    from nanotost import lm_eval_adapter  # without lm-eval: a one-line UserError that says how to install it

    specs = cli.name_list("harness", cfg.harness, paths=True)
    lm = lm_eval_adapter.NanoToSTLM(out_dir=cfg.out_dir if "out_dir" in given else None, init_from=cfg.init_from,
                                    device=cfg.device, dtype=cfg.dtype, batch_size=cfg.batch_size, stride=cfg.stride,
                                    tssa_impl=cfg.tssa_impl)
    t0 = time.time()
    results, table = lm_eval_adapter.run_tasks(lm, specs, cfg.harness_limit)
    print(table)
    print(f"lm-eval {', '.join(specs)}: {time.time() - t0:.1f}s")
    metrics = {task: {k: v for k, v in values.items() if isinstance(v, (int, float))
                      and (math.isfinite(v) or "_stderr" not in k)}  # (an error bar lm-eval could not compute: none)
               for task, values in results["results"].items()}
    record = dict(iter=lm.iter_num, harness=specs, limit=cfg.harness_limit, block_size=lm.T, stride=lm.stride,
                  results=metrics)
    save_record(record, cfg)
    return record


@torch.no_grad()
def main(argv):
    cfg, given = cli.configure(cli.config_defaults(globals()), argv)
    check_settings(cfg, given)
    device, dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    if cfg.harness:
        return run_harness(cfg, given)
    with ranks.distributed(device, cfg.ddp_timeout_s) as dist:  # under torchrun: this rank's GPU
        device = dist.device
        model, ckpt, ckpt_path = loading.load_reader_model(cfg, device, given)  # (or the folder export.py wrote)
        cfg.dataset = cfg.dataset or ckpt["config"].get("dataset") or ckpt["tokenizer"].get("dataset")  # its own data
        cli.require(cfg.dataset, f"{ckpt_path} does not say what it was trained on: give --dataset=<prepared dataset>")
        folder, meta = td.open_dataset(cfg.data_dir, cfg.dataset, (cfg.split,), 1)
        td.check_tokenizer(ckpt, meta, ckpt_path, cfg.dataset, "score it on data prepared with its tokenizer")
        tokens = np.memmap(os.path.join(folder, f"{cfg.split}.bin"), dtype=np.uint16, mode="r")
        if cfg.max_tokens:
            tokens = tokens[:cfg.max_tokens + 1]
        T = model.config.block_size
        stride = cfg.stride or T
        cli.require(0 < stride <= T, f"stride must be in 1..block_size ({T}), got {stride}")
        ctx = torch.autocast(device.split(":")[0], dtype=devices.DTYPES[dtype],
                             enabled=dtype != "float32")

        t0 = time.time()
        total = torch.zeros(2, dtype=torch.float64, device=dist.device)  # (sum of losses, tokens scored)
        mine = td.windows(len(tokens), T, stride)[dist.rank::dist.world_size]
        batches = range(0, len(mine), cfg.batch_size)  # (a bar where stderr is a terminal, on the master alone)
        for i in tqdm(batches, desc=f"{cfg.dataset} {cfg.split}", unit="batch", leave=False,
                      disable=None if dist.is_master else True):
            x = np.zeros((len(mine[i:i + cfg.batch_size]), T), dtype=np.int64)  # (B, T)
            y = np.full_like(x, -1)  # -1: not scored (padding, or scored by an earlier window)
            for row, (start, skip) in enumerate(mine[i:i + cfg.batch_size]):
                chunk = tokens[start:start + T + 1].astype(np.int64)
                x[row, :len(chunk) - 1], y[row, :len(chunk) - 1] = chunk[:-1], chunk[1:]
                y[row, :skip] = -1
            if x.max(initial=0) >= meta["vocab_size"]:
                raise cli.UserError(f"{folder}/{cfg.split}.bin holds token id {x.max()}, outside the vocabulary "
                                    f"({meta['vocab_size']}): prepare it again: {meta['redo']}")
            x, y = torch.from_numpy(x).to(dist.device), torch.from_numpy(y).to(dist.device)
            with ctx:
                _, loss = model(x, y)  # mean over the scored targets
            n = (y != -1).sum()
            total += torch.stack([loss.double() * n, n.double()])
        if dist.ddp:
            torch_dist.all_reduce(total)
        loss, n = (total[0] / total[1]).item(), int(total[1].item())
        record = dict(iter=ckpt["iter_num"], dataset=cfg.dataset, split=cfg.split, loss=loss, ppl=math.exp(loss),
                      tokens=n, block_size=T, stride=stride)
        if dist.is_master:
            print(f"{cfg.dataset} {cfg.split}: loss {loss:.4f}, perplexity {math.exp(loss):.2f} ({n:,} tokens, "
                  f"windows of {T} every {stride}, {time.time() - t0:.1f}s)")
            save_record(record, cfg)
    return record


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
