"""
results/benchkit/op.py: the report's section op: the TSSA operator, forward and backward, causal, at
(B, H, T, p), by implementation (the Triton kernels, today's and the re-tiled ones of
kernels/triton_retiled.py, model.py's maths compiled and eager, the C kernels on a CPU) against SDPA forced to FlashAttention-2 and to cuDNN attention: wall and
GPU busy ms per call, kernels launched, peak memory. The targets' shapes come first.
"""

from functools import partial

import torch
import torch.nn.functional as F

import kernels
import model
from kernels import fused
from nanotost import devices
from results.benchkit.part import fallback_note, why_not
from results.benchkit.settings import TRAINING_SHAPE, plan_lengths
from results.benchkit.timing import attention_ran, forced, measure_row

RETILED = ("triton_retiled",)  # the re-tiled kernels (not a tssa_impl yet: measured beside today's first)
TARGET_SHAPES = [(1, 16384), TRAINING_SHAPE]  # (B, T) with targets: measured first, so a cut section keeps them


def op_shapes(cfg):
    """(B, T) of every operator row: B at each T of the settings and the training shape (a quick
    run: B=4 at its first T), the targets' shapes first."""
    lengths = plan_lengths(cfg.T, [])
    shapes = [(cfg.B, t) for t in lengths] + ([TRAINING_SHAPE] if not cfg.quick else [(4, lengths[0])])
    if not cfg.quick:
        shapes = [s for s in TARGET_SHAPES if s in shapes] + [s for s in shapes if s not in TARGET_SHAPES]
    return shapes


def op_closure(cfg, impl, B, T_):
    """fwd+bwd of one operator call at (B, H, T_, p): TSSA by impl, or SDPA with a forced backend."""
    H, width = cfg.H, cfg.H * cfg.p
    kw = dict(device=cfg.device, dtype=devices.DTYPES[cfg.dtype])
    heads = lambda x: model.split_heads(x, H)  # noqa: E731 (the (B, H, T, p) views model.py hands over)
    g = heads(torch.randn(B, T_, width, **kw))  # dL/dout, as it comes back through the output projection
    if impl.startswith("sdpa"):
        backend = impl.split("_", 1)[1] if "_" in impl else "default"
        qkv = torch.randn(B, T_, 3 * width, **kw, requires_grad=True)  # c_attn's output
        q, k, v = (heads(t) for t in qkv.chunk(3, dim=-1))

        def run():
            qkv.grad = None
            with forced(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        return run
    x = torch.randn(B, T_, width, **kw, requires_grad=True)  # c_in's output
    w = heads(x)
    temp = torch.ones(H, device=cfg.device, requires_grad=True)
    bias = (0.01 * torch.randn(H, T_, device=cfg.device)).requires_grad_()
    ops = fused.fused_ops(impl) if impl in RETILED else kernels.ops_for("torch" if impl == "compiled" else impl)
    fn = ops.causal_tssa
    if impl == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(lambda w_, t_, b_: ops.causal_tssa(w_, t_, b_), dynamic=False)

    def run():
        x.grad = temp.grad = bias.grad = None
        fn(w, temp, bias).backward(g)
    return run


def op_rows(cfg, cuda):
    """The identifying fields of every row, shape by shape (op_shapes), each implementation."""
    impls = ["triton", *RETILED, "compiled", "torch", "sdpa_flash", "sdpa_cudnn"] if cuda else \
        ["cpu", "torch", "sdpa", "triton", *RETILED, "compiled", "sdpa_flash", "sdpa_cudnn"]
    return [dict(impl=impl, B=B, T=T_) for B, T_ in op_shapes(cfg) for impl in impls]


def section_op(S):
    cfg = S.cfg
    S.data.update(H=cfg.H, p=cfg.p, dtype=cfg.dtype, mode="fwdbwd", causal=True)
    for key in op_rows(cfg, S.cuda):
        why = why_not(S, "triton" if key["impl"] in RETILED else key["impl"].replace("sdpa_", ""))
        if why:
            S.row(**key, status="skipped", reason=why)
            continue
        S.attempt(key, partial(op_row, cfg, key["impl"], key["B"], key["T"]))


def op_row(cfg, impl, B, T_):
    """One row's measurements: fwd+bwd of the operator (measure_row), the SDPA kernel that ran, a
    fused implementation's fallback."""
    row = measure_row(op_closure(cfg, impl, B, T_), cfg)
    if impl.startswith("sdpa"):
        row["backend_ran"] = attention_ran(row.get("top_kernels"))
    if impl in ("cpu", "triton", *RETILED):
        note = fallback_note(impl)
        if note:
            row.update(status="fell_back", reason=note)
    return row
