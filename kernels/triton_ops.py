"""
The Triton forward and backward registered as PyTorch custom operators
(torch.library.custom_op), so that torch.compile keeps a model with tssa_impl="triton" in
one graph: Dynamo sees two opaque operators with known output shapes (register_fake) and
a known derivative (register_autograd) instead of Python it must not trace. Eager code
(kernels/fused.py's FusedTSSA) calls the same TritonKernels directly. Imported by
kernels/fused.py when torch.compile first traces a Triton model; imports nothing of it.

    torch.ops.nanotost.tssa_fwd(w, temp, bias, mask, causal, sq_floor, stat_eps)
        -> out (B, H, T, p), pi (B, H, T), u (B, H, T), cS, cMN (per-chunk carries)
    torch.ops.nanotost.tssa_bwd(w, g, temp, pi, u, mask, cS, cMN, causal, sq_floor, stat_eps, bias_width)
        -> dw, dtemp (H,), dbias (H, bias_width) (an empty tensor for the non-causal form)
bias: the whole position bias (H, T_max) or None; mask: the (B, T) bool padding mask or None.
"""

from typing import Optional

import torch
from torch import Tensor

from kernels.triton_tssa import TritonKernels


@torch.library.custom_op("nanotost::tssa_fwd", mutates_args=())
def tssa_fwd(w: Tensor, temp: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], causal: bool,
             sq_floor: float, stat_eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # apart: Pi, u and the carries in allocations of their own (a custom operator's outputs share no storage)
    out, pi, u, (cS, cMN) = TritonKernels.forward(w, temp, bias, mask, causal, (sq_floor, stat_eps), apart=True)
    return out, pi, u, cS, cMN


@tssa_fwd.register_fake
def _(w, temp, bias, mask, causal, sq_floor, stat_eps):
    rows, cS_shape, cMN_shape = TritonKernels.shapes(w, causal)
    f32 = dict(device=w.device, dtype=torch.float32)
    out = torch.empty_like(TritonKernels.prepare(w), dtype=w.dtype)
    return out, torch.empty(rows, **f32), torch.empty(rows, **f32), torch.empty(cS_shape, **f32), \
        torch.empty(cMN_shape, **f32)


@torch.library.custom_op("nanotost::tssa_bwd", mutates_args=())
def tssa_bwd(w: Tensor, g: Tensor, temp: Tensor, pi: Tensor, u: Tensor, mask: Optional[Tensor], cS: Tensor,
             cMN: Tensor, causal: bool, sq_floor: float, stat_eps: float,
             bias_width: int) -> tuple[Tensor, Tensor, Tensor]:
    gw, gtemp, gbias = TritonKernels.backward(w, g, temp, pi, u, mask, (cS, cMN), causal, (sq_floor, stat_eps),
                                              bias_width)
    return gw, gtemp, (gbias if bias_width else temp.new_empty(0, dtype=torch.float32))


@tssa_bwd.register_fake
def _(w, g, temp, pi, u, mask, cS, cMN, causal, sq_floor, stat_eps, bias_width):
    H = w.shape[1]
    f32 = dict(device=w.device, dtype=torch.float32)
    gw = torch.empty_like(TritonKernels.prepare(w), dtype=w.dtype)
    return gw, torch.empty(H, **f32), torch.empty(H, bias_width, **f32) if bias_width else torch.empty(0, **f32)


def _setup_context(ctx, inputs, output):
    w, temp, bias, mask, causal, sq_floor, stat_eps = inputs
    out, pi, u, cS, cMN = output
    ctx.save_for_backward(w, temp, mask, pi, u, cS, cMN)
    ctx.causal, ctx.eps = causal, (sq_floor, stat_eps)
    ctx.bias_width = 0 if bias is None else bias.shape[1]
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.mark_non_differentiable(pi, u, cS, cMN)
    ctx.set_materialize_grads(False)  # no zeros for the outputs that are not differentiated


def _backward(ctx, g_out, *_unused):  # pi, u and the carries are not differentiated
    if g_out is None:
        return None, None, None, None, None, None, None
    w, temp, mask, pi, u, cS, cMN = ctx.saved_tensors
    gw, gtemp, gbias = tssa_bwd(w, g_out, temp, pi, u, mask, cS, cMN, ctx.causal, *ctx.eps, ctx.bias_width)
    gbias = gbias.to(ctx.bias_dtype) if ctx.bias_width else None
    return gw.to(w.dtype), gtemp.to(temp.dtype), gbias, None, None, None, None


tssa_fwd.register_autograd(_backward, setup_context=_setup_context)
