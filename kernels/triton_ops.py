"""
The Triton forward and backward registered as PyTorch custom operators
(torch.library.custom_op), so that torch.compile keeps a model with tssa_impl="triton" in
one graph: Dynamo sees two opaque operators with known output shapes (register_fake) and
a known derivative (register_autograd) instead of Python it must not trace. Eager code
(kernels/fused.py's FusedTSSA) calls the same TritonKernels directly.

    torch.ops.nanotost.tssa_fwd(w, temp, bias, mask, causal, sq_floor, stat_eps)
        -> out (B, H, T, p), pi (B, H, T), u (B, H, T), cS, cMN (per-chunk carries)
    torch.ops.nanotost.tssa_bwd(w, g, temp, pi, u, mask, cS, cMN, causal, sq_floor, stat_eps)
        -> dw, dtemp (H,), dbias (H, T) (an empty tensor for the non-causal form)
"""

from typing import Optional

import torch
from torch import Tensor

from kernels.fused import on_device, masked
from kernels.triton_tssa import TritonKernels


@torch.library.custom_op("nanotost::tssa_fwd", mutates_args=())
def tssa_fwd(w: Tensor, temp: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], causal: bool,
             sq_floor: float, stat_eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    with on_device(w):
        out, pi, u, (cS, cMN) = TritonKernels.forward(masked(w, mask), temp, bias, mask, causal, (sq_floor, stat_eps))
    return out, pi, u, cS, cMN


@tssa_fwd.register_fake
def _(w, temp, bias, mask, causal, sq_floor, stat_eps):
    wk = TritonKernels.prepare(masked(w, mask))
    B, H, T, p = wk.shape
    nC = -(-T // TritonKernels.meta(p)["BT"])
    f32 = dict(device=w.device, dtype=torch.float32)
    return (torch.empty_like(wk, dtype=w.dtype), torch.empty(B, H, T, **f32), torch.empty(B, H, T, **f32),
            torch.empty(B * H, nC, p, **f32), torch.empty(B * H, nC, p + 1, **f32))


@torch.library.custom_op("nanotost::tssa_bwd", mutates_args=())
def tssa_bwd(w: Tensor, g: Tensor, temp: Tensor, pi: Tensor, u: Tensor, mask: Optional[Tensor], cS: Tensor,
             cMN: Tensor, causal: bool, sq_floor: float, stat_eps: float) -> tuple[Tensor, Tensor, Tensor]:
    with on_device(w):
        gw, gtemp, gbias = TritonKernels.backward(masked(w, mask), g, temp, pi, u, mask, (cS, cMN), causal,
                                                  (sq_floor, stat_eps))
    gw = masked(gw, mask)
    return gw, gtemp, (gbias if causal else temp.new_empty(0, dtype=torch.float32))


@tssa_bwd.register_fake
def _(w, g, temp, pi, u, mask, cS, cMN, causal, sq_floor, stat_eps):
    _, H, T, _ = w.shape
    gw = masked(torch.empty_like(TritonKernels.prepare(masked(w, mask)), dtype=w.dtype), mask)
    f32 = dict(device=w.device, dtype=torch.float32)
    return gw, torch.empty(H, **f32), torch.empty(H, T, **f32) if causal else torch.empty(0, **f32)


def _setup_context(ctx, inputs, output):
    w, temp, bias, mask, causal, sq_floor, stat_eps = inputs
    out, pi, u, cS, cMN = output
    ctx.save_for_backward(w, temp, mask, pi, u, cS, cMN)
    ctx.causal, ctx.eps, ctx.has_bias = causal, (sq_floor, stat_eps), bias is not None
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.mark_non_differentiable(pi, u, cS, cMN)


def _backward(ctx, g_out, *_unused):  # pi, u and the carries are not differentiated
    w, temp, mask, pi, u, cS, cMN = ctx.saved_tensors
    gw, gtemp, gbias = tssa_bwd(w, g_out, temp, pi, u, mask, cS, cMN, ctx.causal, *ctx.eps)
    gbias = gbias.to(ctx.bias_dtype) if ctx.has_bias else None
    return gw.to(w.dtype), gtemp.to(temp.dtype), gbias, None, None, None, None


tssa_fwd.register_autograd(_backward, setup_context=_setup_context)
