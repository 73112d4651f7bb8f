"""
results/benchkit/main_job.py: the report's section main_job: train.py with config/tost_owt.py, and
config/gpt2_owt.py beside it, as each GPU of the recipe's 8 runs them, on a synthetic dataset
written for it: tokens/s and MFU from train.py's log, and on a GPU a profile of each compiled
micro-step, its kernels told apart by name (KERNEL_KINDS).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from functools import partial

import numpy as np
import torch

import kernels
import model
from nanotost import REPO, devices
from results.benchkit import compile_cache
from results.benchkit.costs import MAIN_PROFILE_S
from results.benchkit.part import row_key, why_not
from results.benchkit.settings import PRESETS, TINY, main_warmup



MAIN_JOBS = (("tost", "config/tost_owt.py"), ("gpt2", "config/gpt2_owt.py"))  # ToST's job, GPT-2's beside it
GRAPHS = "cuda_graphs"  # a main job's mode: train.py --compile_mode=reduce-overhead (the step replayed as CUDA graphs)
# kernel names -> what they compute, first match wins (Inductor names a fused kernel after its ops)
KERNEL_KINDS = (("tssa", ("cumsum", "tssa", "_k_")), ("attention", ("flash", "fmha", "cudnn", "attention")),
                ("loss", ("cross_entropy", "nll_loss", "log_softmax", "logsumexp")),
                ("matmuls", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "matmul", "sm80_", "sm90_", "ampere")))


def section_main_job(S):
    """train.py with config/tost_owt.py (tssa_impl=main_tssa_impl), and config/gpt2_owt.py
    beside it, as each GPU of the recipe's 8 runs them (batch 12 x 5 micro-steps = 61,440 tokens
    per iteration), main_iters iterations, compiled on CUDA, on a synthetic dataset written here
    (uniform random GPT-2 token ids; meta.json as prepare_openwebtext.py writes it): throughput
    does not depend on the token values. tokens/s and MFU are the medians of train.py's
    log.jsonl after the first iterations. On CUDA each row also holds a profile of the same
    model's compiled micro-step (main_job_profile: top kernels, shares by kind)."""
    cfg = S.cfg
    work = S.path + ".main_job"
    data = os.path.join(work, "data", "synthetic_gpt2")
    os.makedirs(data, exist_ok=True)
    counts = dict(train=1 << 12 if cfg.quick else 1 << 23, val=1 << 12 if cfg.quick else 1 << 20)
    rng = np.random.default_rng(0)
    for split, n in counts.items():
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(os.path.join(data, f"{split}.bin"))
    with open(os.path.join(data, "meta.json"), "w") as f:
        json.dump(dict(dataset="synthetic_gpt2", tokenizer="gpt2", vocab_size=50257, eot_token=50256,
                       source="bench.py main_job: uniform random token ids (synthetic)", splits=counts,
                       command="python bench.py --report --sections=main_job"), f, indent=1)
    S.data.update(data="synthetic: uniform random GPT-2 token ids (throughput does not depend on their values)",
                  tssa_impl=cfg.main_tssa_impl, iters=cfg.main_iters)
    for key in main_job_rows(cfg, S.cuda):
        why = why_not(S, "captured") if key.get("mode") == GRAPHS else None
        if why:
            S.row(**key, status="skipped", reason=why)
            continue
        S.attempt(key, partial(main_job_row, S, work, key["arch"], key.get("impl"), key.get("mode")))
    shutil.rmtree(work, ignore_errors=True)  # the checkpoint of a real model is ~1.3 GB


def main_job_rows(cfg, cuda):
    """The identifying fields of every row: ToST's job with main_tssa_impl, then GPT-2's; the
    headline's: ToST's with `triton` named, the same with its compiled step replayed as CUDA
    graphs (mode=GRAPHS: train.py --compile_mode=reduce-overhead), GPT-2's, then ToST's with
    main_tssa_impl (auto)."""
    if not cfg.headline:
        return [dict(arch="tost", impl=cfg.main_tssa_impl), dict(arch="gpt2")]
    rest = [dict(arch="tost", impl=cfg.main_tssa_impl)] if cfg.main_tssa_impl != "triton" else []
    return [dict(arch="tost", impl="triton"), dict(arch="tost", impl="triton", mode=GRAPHS), dict(arch="gpt2")] + rest


def job_name(arch, impl, mode=None):
    return "-".join(str(x) for x in (arch, impl, mode) if x)


def main_job_args(cfg, work, arch, config, impl, mode=None):
    """train.py's command line for one main job (the quick report's: a tiny model, 3 iterations)."""
    iters = cfg.main_iters
    args = [config, f"--data_dir={os.path.join(work, 'data')}", "--dataset=synthetic_gpt2",
            f"--out_dir={os.path.join(work, 'out-' + job_name(arch, impl, mode))}", f"--max_iters={iters}",
            f"--eval_interval={iters}", "--eval_iters=1", "--log_interval=1", f"--device={cfg.device}",
            f"--dtype={cfg.dtype}",
            f"--compile={cfg.device.startswith('cuda')}", "--wandb_log=False"]
    args += [f"--tssa_impl={impl}"] if arch == "tost" else []
    args += ["--compile_mode=reduce-overhead"] if mode == GRAPHS else []
    args += ["--gradient_accumulation_steps=5"] if not cfg.quick else \
        ["--gradient_accumulation_steps=1", "--batch_size=2", "--block_size=32"] + \
        [f"--{k}={v}" for k, v in TINY.items()]
    return args


def main_job_row(S, work, arch, impl, mode=None):
    """One train.py run: its median tokens/s and MFU after the warm-up iterations, the first
    iteration's seconds (its compile), and (CUDA, where the time spares it) the profile."""
    cfg = S.cfg
    config = dict(MAIN_JOBS)[arch]
    iters, args = cfg.main_iters, main_job_args(cfg, work, arch, config, impl, mode)
    shown = [a for a in args if not a.startswith(("--data_dir", "--out_dir"))]  # (temporary folders)
    if arch == "tost" and "command" not in S.data:
        S.data["command"] = "python train.py " + " ".join(shown)
    t0 = time.time()
    name = job_name(arch, impl, mode)
    log_path = os.path.join(work, f"train-{name}.log")
    keep = compile_cache.keeping(cfg, f"{S.path}.{name}")  # (train.py's compiles, kept for the next window)
    with open(log_path, "w") as log:
        try:
            done = subprocess.run([sys.executable] + keep + ["train.py"] + args, cwd=REPO, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=max(5.0, S.time_left() - 10))
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(log_path) as f:
        tail_all = f.read()
    records = []
    path = os.path.join(work, "out-" + name, "log.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    shutil.rmtree(os.path.join(work, "out-" + name), ignore_errors=True)  # (its checkpoint: ~1.3 GB on a GPU)
    steps = [r for r in records if r.get("tokens_per_s") is not None]
    skip = main_warmup(cfg)  # compile and warm-up (check_settings refused a job with nothing after them)
    steady = [r for r in steps if r["iter"] >= skip]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    said = re.search(r"([\d,]+) tokens per iteration", tail_all)
    per_iter = int(said.group(1).replace(",", "")) if said else None
    first = steps[0]["tokens_per_s"] if steps and steps[0]["iter"] == 0 else None
    row = dict(config=config, command="python train.py " + " ".join(shown), iters=iters, tokens_per_iter=per_iter,
               wall_s=round(time.time() - t0, 1), iters_logged=len(steps), steady_from_iter=skip,
               tokens_per_s=med([r["tokens_per_s"] for r in steady]), mfu=med(mfus),
               first_iter_s=round(per_iter / first, 2) if per_iter and first else None,  # (the compile, mostly)
               tokens_per_s_all=[r["tokens_per_s"] for r in steps], compiled=S.cuda)
    if rc != 0 or not steady:
        why = "did not finish in the section's time" if rc == "timeout" else f"exit code {rc}"
        row.update(status="failed", reason=f"train.py: {why}" + ("" if steady else "; no iterations logged"),
                   output_tail=tail_all[-2000:])
        return row
    if row["mfu"] is None:
        row["mfu_note"] = "train.py reports MFU on CUDA only" if not S.cuda else "unknown device peak"
    fell_back = re.search(r"tssa_impl='(?:auto|triton)': ([^;\n]*)", tail_all)
    row["tssa_fallback"] = fell_back.group(1)[:300] if fell_back else None
    if arch == "tost":  # what train.py said of its tssa_impl (auto: which it picked)
        row["tssa_said"] = " | ".join(line for line in tail_all.splitlines() if "tssa_impl" in line)[:600] or None
    profile_s = S.estimates.get(row_key(dict(arch=arch, impl=impl, mode="profile"))) or MAIN_PROFILE_S
    if S.cuda and mode is None and S.spare_s() > profile_s:  # (a measurement of less value than the rows to come)
        t0 = time.time()
        row["profile"] = main_job_profile(cfg, arch, impl)
        row["profile_s"] = round(time.time() - t0, 1)
    return row


def main_job_profile(cfg, arch, impl):
    """Where a micro-step of the main job spends the GPU: the same model and batch (12 x 1K, bf16
    autocast, compiled, the loss as train.py computes it by default), forward and backward under
    torch.profiler. Returns GPU ms per micro-step, the top kernels and each KERNEL_KINDS share."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch._dynamo.reset()
    m = model.GPT.from_preset(PRESETS[arch], block_size=1024, vocab_size=50304)
    m = kernels.use(m, impl if arch == "tost" else "torch").to(cfg.device)
    fwd = torch.compile(m)
    idx = torch.randint(0, 50257, (12, 1024), device=cfg.device)

    def micro_step():
        with torch.autocast("cuda", dtype=devices.DTYPES[cfg.dtype]):
            _, loss = fwd(idx, idx)
        loss.backward()
    for _ in range(2):  # compile, then warm
        micro_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            micro_step()
        torch.cuda.synchronize()
    return kernel_shares([(e.name, e.time_range.end - e.time_range.start) for e in prof.events()
                          if e.device_type == DeviceType.CUDA], calls=3)


def kernel_shares(kernels_us, calls):
    """[(kernel name, us)] -> gpu_ms per call, the top 10 kernels, and the share of each
    KERNEL_KINDS kind (the rest: elementwise, norms, the optimizer's kernels, copies)."""
    by_name, by_kind = {}, {kind: 0.0 for kind, _ in KERNEL_KINDS + (("rest", ()),)}
    for name, us in kernels_us:
        by_name[name] = by_name.get(name, 0.0) + us
        low = name.lower()
        by_kind[next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "rest")] += us
    total = sum(by_name.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    return dict(gpu_ms=total / 1e3 / calls, top_kernels=[[n[:120], us / 1e3 / calls] for n, us in top],
                shares={kind: round(us / total, 4) for kind, us in by_kind.items()})
