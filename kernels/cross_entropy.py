"""
The language-modelling loss without the (N, V) logits: model.GPT.loss's maths (the mean
cross-entropy of x @ weight^T against the targets, -1 not scored), CE_CHUNK tokens at a time,
each chunk's gradients made as the forward goes. Opt-in, for long contexts (gpt_loss becomes the
GPT's loss):
    kernels.use(model, impl, chunked_loss=True)      # train.py: --chunked_loss=True
torch >= 2.13 has F.linear_cross_entropy with a chunked path, but (2.13, CPU) it computes the
logits in fp32 under bf16 autocast and falls back to eager inside torch.compile; this one keeps
the logits in the autocast dtype and compiles.

    python -m pytest -q tests/test_decode.py -k cross_entropy     # == model.GPT.loss
"""

import torch

CE_CHUNK = 4096  # rows of logits (tokens) per chunk


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits = x @ weight^T (x (N, C), weight (V, C)) against targets
    (N,) (-1: not counted), without ever holding the (N, V) logits: CE_CHUNK rows at a time,
    each chunk's gradients computed as the forward goes (softmax - one-hot), so only (N, C) and
    (V, C) gradients are kept. Logits in the autocast dtype, softmax and sums in fp32. The
    same for every model: a 64K-token step of a 50K vocabulary needs no 13 GB of logits."""


    @staticmethod
    def forward(ctx, x, weight, targets):
        dev = x.device.type
        compute = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        acc = torch.promote_types(compute, torch.float32)  # softmax and sums: fp32 (fp64 for fp64 inputs)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.autocast(dev, enabled=False):
            xc, wc = x.to(compute), weight.to(compute)
            valid = (targets != -1).to(acc)  # (N,)
            n_valid = valid.sum().clamp_min(1.0)
            loss = torch.zeros((), device=x.device, dtype=acc)
            grad_x = torch.empty_like(x) if need_grad else None  # (N, C)
            grad_w = torch.zeros(weight.shape, device=x.device, dtype=acc) if need_grad else None  # (V, C)
            for i in range(0, x.shape[0], CE_CHUNK):
                rows = slice(i, i + CE_CHUNK)
                logits = (xc[rows] @ wc.t()).to(acc)  # (n, V)
                target = targets[rows].clamp_min(0)[:, None]  # (n, 1); ignored rows weigh 0 below
                lse = logits.logsumexp(-1)  # (n,)
                loss += ((lse - logits.gather(1, target).squeeze(1)) * valid[rows]).sum()
                if need_grad:
                    g = (logits - lse[:, None]).exp_()  # softmax (n, V)
                    g.scatter_add_(1, target, -torch.ones_like(g[:, :1]))
                    g = (g * (valid[rows] / n_valid)[:, None]).to(compute)
                    grad_x[rows] = g @ wc
                    grad_w += (g.t() @ xc[rows]).to(acc)
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss / n_valid

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad_loss.to(grad_x.dtype), (grad_w * grad_loss).to(ctx.weight_dtype), None


def chunked_cross_entropy(x, weight, targets):
    """F.cross_entropy(x @ weight^T, targets), chunked: x (N, C), weight (V, C), targets (N,) -> the mean loss."""
    return LinearCrossEntropy.apply(x, weight, targets)


def gpt_loss(gpt, x, targets):
    """model.GPT.loss, chunked (the GPT's loss once kernels.use(..., chunked_loss=True) binds it):
    x (B, T, C) before the tied head, targets (B, T) -> the mean loss."""
    return chunked_cross_entropy(x.flatten(0, 1), gpt.lm_head.weight, targets.flatten())
