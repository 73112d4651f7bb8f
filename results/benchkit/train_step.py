"""
results/benchkit/train_step.py: the report's training sections (train_tost, train_gpt2_flash,
train_gpt2_cudnn, train_tost_triton) and the headline's train: one training step (forward,
backward, AdamW) of ToST-Base by tssa_impl against GPT-2 Base by SDPA backend, at each length,
the batch chosen so every row holds train_tokens tokens; compiled on CUDA (a fresh compile a
row), eager on the CPU. A ToST row with tssa_impl=auto keeps what auto said it picked.
"""

import contextlib
import io
import time
import warnings
from functools import partial

import torch

import kernels
import model
from nanotost import devices
from nanotost import trainkit as tk
from results.benchkit.part import fallback_note, why_not
from results.benchkit.settings import PRESETS, TINY, plan_lengths
from results.benchkit.timing import attention_ran, forced, measure_row

TRAIN_LENGTHS = [4096, 16384, 65536, 8192, 32768]  # the targets' lengths first


def build_gpt(cfg, arch, block_size, impl="torch"):
    """ToST-Base (arch 'tost', TSSA by impl) or GPT-2 Base ('gpt2'); the TINY shape in a quick
    report. GPT-2's vocabulary padded to 50304 as train.py pads it. Both compute the loss in
    chunks (kernels/cross_entropy.py): neither holds the (B, T, V) logits at a long context."""
    over = dict(block_size=block_size, vocab_size=50304, **(TINY if cfg.quick else {}))
    m = model.GPT.from_preset(PRESETS[arch], **over)
    return kernels.use(m, impl if arch == "tost" else "torch", chunked_loss=True)


def train_rows(cfg, cuda, variants, later=()):
    """The identifying fields of every row: each of `variants` ((arch, impl, backend)) at each
    length of model_T, length by length (so a cut section keeps the comparisons at the first
    lengths), then each of `later` (the rows not needed for a target) at each length; the batch
    holds train_tokens tokens."""
    order = plan_lengths(cfg.model_T, TRAIN_LENGTHS)
    rows = [(*v, T_) for T_ in order for v in variants] + [(*v, T_) for v in later for T_ in order]
    return [{k: v for k, v in dict(arch=arch, impl=impl, backend=backend, T=T_,
                                   B=max(1, cfg.train_tokens // T_)).items()
             if v is not None} for arch, impl, backend, T_ in rows]


def section_train(S, variants, later=(), stand_in=False):
    """The training step of each row of train_rows, compiled on CUDA; on the CPU a row a CUDA
    backend needs is skipped, and with stand_in GPT-2 runs with SDPA's own choice instead (the
    step's code path), once a length."""
    cfg = S.cfg
    S.data.update(train_tokens=cfg.train_tokens, compiled=S.cuda, dtype=cfg.dtype)
    for key in train_rows(cfg, S.cuda, variants, later):
        arch, impl, backend, T_, B = key["arch"], key.get("impl"), key.get("backend"), key["T"], key["B"]
        why = why_not(S, "triton") if impl == "triton" else why_not(S, backend) if backend else None
        if why:
            S.row(**key, status="skipped", reason=why)
            default = dict(key, backend="default")
            if stand_in and arch == "gpt2" and not any(r.get("backend") == "default" and r["T"] == T_
                                                       for r in S.data["rows"]):
                S.attempt(default, partial(train_row, cfg, arch, impl or "torch", "default", T_, B))
            continue
        S.attempt(key, partial(train_row, cfg, arch, impl or "torch", backend, T_, B))


@contextlib.contextmanager
def shown_and_kept(lines):
    """What the code inside prints and warns, appended to `lines` (one string a line) and shown."""
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        try:
            yield
        finally:
            said = out.getvalue().splitlines() + [f"{w.category.__name__}: {w.message}" for w in caught]
            lines.extend(said)
    for line in said:
        print(line, flush=True)


def train_row(cfg, arch, impl, backend, T_, B):
    cuda = cfg.device.startswith("cuda")
    device_type = "cuda" if cuda else "cpu"
    if cuda:
        torch._dynamo.reset()
    m = build_gpt(cfg, arch, T_, impl).to(cfg.device)
    opt = tk.configure_adamw(m, 0.1, 6e-4, (0.9, 0.95), device_type)
    fwd = torch.compile(m) if cuda else m
    idx = torch.randint(0, 50257, (B, T_), device=cfg.device)
    tgt = torch.randint(0, 50257, (B, T_), device=cfg.device)
    amp = cfg.dtype != "float32"
    with forced(backend):
        from torch.backends import cuda as sdp
        flags = dict(flash=sdp.flash_sdp_enabled(), cudnn=sdp.cudnn_sdp_enabled(),
                     efficient=sdp.mem_efficient_sdp_enabled(), math=sdp.math_sdp_enabled())

    def step():
        with forced(backend), torch.autocast(device_type, dtype=devices.DTYPES[cfg.dtype], enabled=amp):
            _, loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    compile_error, t0, said = None, time.perf_counter(), []
    with shown_and_kept(said):  # the first step: the compile, and auto's pick (what it says of it)
        try:
            step()
            if cuda:
                torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 (on CUDA: a compile that fails, an Inductor bug)
            if not cuda:
                raise
            compile_error = f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0][:300]}"
            torch._dynamo.reset()  # an eager row that says so, not a gap
            opt.zero_grad(set_to_none=True)
            fwd = m
    compile_s = round(time.perf_counter() - t0, 1) if cuda else None
    row = measure_row(step, cfg, profile_calls=1)
    row["compile_s"] = compile_s  # the first step, compile included (a failed compile: its time to fail)
    if compile_error:
        row.update(status="eager", reason=f"torch.compile failed ({compile_error}); measured eager")
    row.update(tokens=B * T_, tokens_per_s=B * T_ / (row["ms"] / 1e3), compiled=cuda and not compile_error,
               tssa_impl=impl if arch == "tost" else None, preset="tiny" if cfg.quick else PRESETS[arch],
               params_m=round(m.get_num_params() / 1e6, 2))
    if cuda:
        row["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20  # everything: weights, Adam, activations
    row["peak_is"] = "all allocated at the step's peak" if cuda else "growth during the step (CPU, sampled)"
    if arch == "gpt2":
        row.update(backend_ran=attention_ran(row.get("top_kernels")), sdp_enabled=flags)
    if arch == "tost" and impl == "auto":
        row["auto_said"] = " | ".join(line for line in said if "tssa_impl" in line)[:600] or None
    note = fallback_note(impl) if arch == "tost" else ""
    if note and row.get("status", "ok") == "ok":
        row.update(status="fell_back", reason=note)
    return row

