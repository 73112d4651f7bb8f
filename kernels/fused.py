"""
The autograd glue of the fused kernels, and the operator functions tssa_impl="cpu" / "triton"
hands to model.TSSA (fused_ops). Each has the signature of its model.py twin and falls back
to it where the kernels do not apply or cannot run:
  - silently, by design: float64 inputs, a Pi mode other than softmax (kernels.use refuses it
    for "cpu" and "triton"), a decoding step that needs gradients (the kernels are fp32
    statistics with a softmax Pi, the step has no backward);
  - with ONE warning per implementation and process, naming the cause: the kernels cannot be
    built or imported (no C compiler, no Triton), the tensor's device is not theirs, or a
    launch raised (e.g. a Triton compile error; then the reference for the rest of the run).
    A failing backward recomputes the gradients through the reference instead.
Every warning of the package is one line (warn), attributed to the line that ran the model.
BACKENDS also holds "triton_retiled" (kernels/triton_retiled.py, the causal kernels re-tiled, on
trial until a GPU measures them): fused_ops("triton_retiled") runs them, eagerly (under
torch.compile behind a graph break); no script's tssa_impl selects them.
"""

import importlib
import sys

import torch

import model
from nanotost.cli import UserError
from kernels.said import warn  # noqa: F401  (the package's one line: kernels.fused.warn too)

BACKENDS = {"cpu": ("kernels.cpu", "CKernels"), "triton": ("kernels.triton_tssa", "TritonKernels"),
            # the causal kernels re-tiled (issue 52): by name only (fused_ops), not a tssa_impl of any script
            "triton_retiled": ("kernels.triton_retiled", "RetiledKernels")}
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FUSED_PI_MODES = ("softmax",)  # the Pi modes (model.PI_MODES) the kernels compute
PROBE_ON_CPU = False  # tests: also probe the custom operators under TRITON_INTERPRET=1
_MARKS = []  # [(function, torch.compiler's mark)]: applied by marks_applied() once a fused path is built


def compiler_mark(name):
    """torch.compiler.<name> (disable, assume_constant_result) for a fused path, applied when a
    fused implementation is first asked for (marks_applied), not at import: the decorators import
    Dynamo, about 1.3 s of every process's start, which a run of model.py's maths never needs."""
    def later(fn):
        _MARKS.append((fn, name))
        return fn
    return later


def marks_applied():
    """Replace each function compiler_mark noted (a method by its class, a function by its
    module, looked up at call time) by its marked form; once per process."""
    while _MARKS:
        fn, name = _MARKS.pop()
        *path, attr = fn.__qualname__.split(".")
        owner = sys.modules[fn.__module__]
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, attr, getattr(torch.compiler, name)(fn))


def masked(w, mask):
    """w with the padded tokens zeroed (mask (B, T) bool or float, or None: w itself)."""
    return w if mask is None else w * mask[:, None, :, None].to(w.dtype)


def raw_inputs(kernels):
    """Whether kernels take w unmasked with the padding mask, and the whole position bias
    (H, T_max) whose whole gradient they return (the Triton kernels: no PyTorch op around
    them). Otherwise (the C kernels) w and dw are masked here and the bias is cut to T."""
    return getattr(kernels, "raw_inputs", False)


def guards(causal):
    """(sq_floor, stat_eps) from model.py, read at call time. The floor on the sum of squares
    inside Pi: causal max(S, PI_NORM_EPS); non-causal F.normalize's max(||w||, PI_NORM_EPS),
    i.e. max(S, PI_NORM_EPS^2) on the square."""
    return (model.PI_NORM_EPS if causal else model.PI_NORM_EPS ** 2), model.STAT_EPS


class FusedTSSA(torch.autograd.Function):
    """out, Pi = TSSA(w) with the hand-derived backward of kernels/__init__.py. Saves w, Pi
    and u (B, H, T) and per-chunk carries, about 1/p of w besides w itself, where autograd
    through the reference keeps ~10 tensors the size of w. bias: the position bias or None
    (the whole (H, T_max) for raw_inputs kernels, else (H, T)); mask (B, T) or None
    (non-causal only); ops: the FusedOps whose kernels run. Pi is returned detached, as
    model.py returns it, and autograd makes no zero gradient for it (materialize_grads off)."""

    @staticmethod
    def forward(ctx, w, temp, bias, mask, causal, ops):
        eps, kernels = guards(causal), ops.kernels
        with torch.autocast(w.device.type, enabled=False):
            x = w if raw_inputs(kernels) else masked(w, mask)
            out, pi, u, saved = kernels.forward(x, temp, bias, mask, causal, eps)
        ctx.causal, ctx.ops, ctx.eps, ctx.n_saved = causal, ops, eps, len(saved)
        ctx.save_for_backward(w, temp, bias, mask, pi, u, *saved)
        ctx.mark_non_differentiable(pi)
        ctx.set_materialize_grads(False)
        return out, pi

    @staticmethod
    def backward(ctx, g_out, _g_pi):  # _g_pi is None: Pi is returned detached
        if g_out is None:  # out took no part in what is differentiated
            return None, None, None, None, None, None
        w, temp, bias, mask, pi, u, *saved = ctx.saved_tensors
        try:
            with torch.autocast(w.device.type, enabled=False):
                gw, gtemp, gbias = _kernel_grads(ctx.ops.kernels, w, g_out, temp, bias, pi, u, mask, saved,
                                                 ctx.causal, ctx.eps)
        except Exception as e:  # e.g. the backward kernels failed to compile: the reference's gradients
            ctx.ops.disable(f"the backward kernels raised {type(e).__name__}: {e}")
            gw, gtemp, gbias = _reference_grads(w, temp, bias, mask, g_out, ctx.causal)
        gbias = None if bias is None else gbias.to(bias.dtype)
        return gw.to(w.dtype), gtemp.to(temp.dtype), gbias, None, None, None


def _kernel_grads(kernels, w, g_out, temp, bias, pi, u, mask, saved, causal, eps):
    """(dw, dtemp, dbias) from the backward kernels."""
    if raw_inputs(kernels):
        width = 0 if bias is None else bias.shape[1]
        return kernels.backward(w, g_out, temp, pi, u, mask, saved, causal, eps, width)
    gw, gtemp, gbias = kernels.backward(masked(w, mask), g_out, temp, pi, u, mask, saved, causal, eps)
    return masked(gw, mask), gtemp, gbias


def _reference_grads(w, temp, bias, mask, g_out, causal):
    """Gradients of sum(out * g_out) w.r.t. w, temp, bias through model.py's maths."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (w, temp, bias) if t is not None]
        if causal:
            out = model.causal_tssa(leaves[0], leaves[1], leaves[2])
        else:
            out = model.tssa(leaves[0], leaves[1], mask=None if mask is None else mask.bool())
        grads = torch.autograd.grad(out, leaves, g_out)
    return grads if causal else (*grads, None)


def keep_sums(state, w, pi):
    """A prompt's running sums at its last token into a decoding state (or None), as model.causal_tssa
    writes them for the shipped maths, which the kernels compute: w (B, H, T, p), Pi (B, H, T)."""
    if state is not None:
        w_sq = w.to(state.sum_sq.dtype).square()
        state.sum_sq.copy_(w_sq.sum(2))
        state.sum_pi_sq.copy_((pi.unsqueeze(-1) * w_sq).sum(2))
        state.sum_pi.copy_(pi.sum(2))


class FusedOps:
    """tssa, causal_tssa, causal_tssa_step of model.py, run by the "cpu" or "triton" kernels
    where they apply (see the module docstring for where they do not)."""

    def __init__(self, impl):
        self.impl, self.kernels = impl, None
        self.failure = None  # why the kernels are off for the rest of the run, if they are
        self.fallback = None  # the cause of the one warning, once given

    def disable(self, cause):
        """Run the reference from now on, and say why (once)."""
        self.failure = cause
        self.warn(cause)

    def warn(self, cause):
        if self.fallback is None:
            self.fallback = cause
            warn(f"tssa_impl={self.impl!r}: {cause}; running model.py's reference maths instead")

    def kernels_for(self, w, pi_mode="softmax"):
        """The kernel class that runs w, or None for the reference."""
        if pi_mode not in FUSED_PI_MODES or w.dtype not in FUSED_DTYPES:
            return None
        if self.failure is None and self.kernels is None:
            module, name = BACKENDS[self.impl]
            try:
                kernels = getattr(importlib.import_module(module), name)
                kernels.load()
                self.kernels = kernels
            except UserError:  # a setting of the user's that cannot be followed ($NANOTOST_CACHE): refused
                raise
            except Exception as e:  # ImportError (no Triton), KernelUnavailable (no C compiler), ...
                self.disable(f"{type(e).__name__}: {e}")
        if self.failure is not None:
            return None
        cause = self.kernels.unsupported(w)
        if cause:
            self.warn(cause)
            return None
        return self.kernels

    def _apply(self, w, temp, bias, mask, causal):
        """FusedTSSA, or None if the launch raised (then the caller runs the reference)."""
        try:
            return FusedTSSA.apply(w, temp, bias, mask, causal, self)
        except Exception as e:
            self.disable(f"the kernels raised {type(e).__name__}: {e}")
            return None

    # Under torch.compile the Triton kernels run as custom operators inside the graph
    # (_traced); the C kernels run between graphs (_tssa / _causal_tssa are compiler.disable'd).
    def tssa(self, w, temp, return_pi=False, mask=None, pi_mode="softmax"):
        if self.impl == "triton" and torch.compiler.is_compiling():
            return self._traced(w, temp, None, mask, False, return_pi, pi_mode)
        return self._tssa(w, temp, return_pi, mask, pi_mode)

    def causal_tssa(self, w, temp, pos_bias, return_pi=False, pi_mode="softmax", state=None):
        if self.impl == "triton" and torch.compiler.is_compiling():
            return self._traced(w, temp, pos_bias, None, True, return_pi, pi_mode, state)
        return self._causal_tssa(w, temp, pos_bias, return_pi, pi_mode, state)

    def _traced(self, w, temp, pos_bias, mask, causal, return_pi, pi_mode, state=None):
        """The Triton custom operators (kernels/triton_ops.py), traced into the graph; the
        reference maths where they do not apply or did not pass the start-up probe."""
        if pi_mode not in FUSED_PI_MODES or w.dtype not in FUSED_DTYPES or not _triton_ready(w.device.type):
            return (model.causal_tssa(w, temp, pos_bias, return_pi, pi_mode, state=state) if causal
                    else model.tssa(w, temp, return_pi, mask, pi_mode))
        model.check_shapes(w, temp)
        B, H, T, p = w.shape
        bias = model.check_pos_bias(pos_bias, H, T, w.dtype) if causal else None  # (H, T_max)
        out, pi, *_ = torch.ops.nanotost.tssa_fwd(w, temp.reshape(H).float(), bias, mask, causal, *guards(causal))
        keep_sums(state, w, pi)
        return (out, pi) if return_pi else out

    @compiler_mark("disable")  # Dynamo must not trace into ctypes calls or Triton launches
    def _tssa(self, w, temp, return_pi=False, mask=None, pi_mode="softmax"):
        model.check_shapes(w, temp, mask)
        res = None
        if self.kernels_for(w, pi_mode) is not None:
            res = self._apply(w, temp.reshape(-1), None, mask, False)
        if res is None:
            return model.tssa(w, temp, return_pi, mask, pi_mode)
        return res if return_pi else res[0]

    @compiler_mark("disable")
    def _causal_tssa(self, w, temp, pos_bias, return_pi=False, pi_mode="softmax", state=None):
        model.check_shapes(w, temp)
        B, H, T, p = w.shape
        res = None
        if self.kernels_for(w, pi_mode) is not None:
            bias = model.check_pos_bias(pos_bias, H, T, w.dtype)  # (H, T_max)
            res = self._apply(w, temp.reshape(H), bias if raw_inputs(self.kernels) else bias[:, :T], None, True)
        if res is None:
            return model.causal_tssa(w, temp, pos_bias, return_pi, pi_mode, state=state)
        keep_sums(state, w, res[1])
        return res if return_pi else res[0]

    @compiler_mark("disable")
    def causal_tssa_step(self, w_t, temp, bias_t, state, pi_mode="softmax"):
        """The fused step runs when decoding (no gradient wanted) from an fp32 contiguous
        state on w_t's device; otherwise model.causal_tssa_step. bias_t (H,): this token's
        position bias. The state's sums advance in place."""
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (w_t, temp, bias_t))
        stats = (state.sum_sq, state.sum_pi_sq, state.sum_pi)
        fits = all(t.dtype == torch.float32 and t.is_contiguous() and t.device == w_t.device for t in stats)
        kernels = None if needs_grad or not fits or w_t.dim() != 3 else self.kernels_for(w_t, pi_mode)
        if kernels is not None:
            H = w_t.shape[1]
            try:  # a launch that raises (a compile error) has not touched the state
                with torch.no_grad():
                    out, _ = kernels.step(w_t, temp.reshape(H), bias_t.reshape(H).float(), state, guards(True))
                return out
            except Exception as e:
                self.disable(f"the decoding kernel raised {type(e).__name__}: {e}")
        return model.causal_tssa_step(w_t, temp, bias_t, state, pi_mode)


_OPS = {}  # impl -> FusedOps: one per process, so each warns at most once


@compiler_mark("assume_constant_result")  # asked once while Dynamo traces, then a constant of the graph
def _triton_ready(device_type):
    """Whether the Triton custom operators can run on device_type: Triton imports, the
    operators are registered, and (on a GPU) a small forward and backward runs. Otherwise the
    compiled graph holds the reference maths, with FusedOps' one warning."""
    ops = _OPS["triton"]
    probe = torch.zeros(1, 1, 1, 1, device=device_type)
    if ops.kernels_for(probe) is None:
        return False
    try:
        import kernels.triton_ops  # noqa: F401  (registers torch.ops.nanotost.*)

        if device_type == "cuda" or PROBE_ON_CPU:  # a compile error shows here, not in a compiled step
            w = torch.randn(1, 2, 16, 8, device=device_type)
            temp, bias = torch.ones(2, device=device_type), torch.zeros(2, 16, device=device_type)
            out, pi, u, cS, cMN = torch.ops.nanotost.tssa_fwd(w, temp, bias, None, True, *guards(True))
            torch.ops.nanotost.tssa_bwd(w, torch.ones_like(out), temp, pi, u, None, cS, cMN, True, *guards(True), 16)
            if device_type == "cuda":
                torch.cuda.synchronize()
    except Exception as e:
        ops.disable(f"the Triton custom operators raised {type(e).__name__}: {e}")
        return False
    return True


def failure_of(impl):
    """Why the kernels of impl are off for the rest of the run, or None (on, or never asked)."""
    return _OPS[impl].failure if impl in _OPS else None


def built_impls():
    """The fused implementations this process has built operators for (fused_ops)."""
    return list(_OPS)


def fused_ops(impl):
    """model.TSSAOperators of the fused kernels of impl ("cpu", "triton", or "triton_retiled": the
    re-tiled causal kernels of kernels/triton_retiled.py, eager only, which no tssa_impl names)."""
    if impl not in BACKENDS:
        raise ValueError(f"fused kernels exist for {sorted(BACKENDS)}, not {impl!r}")
    if impl not in _OPS:
        marks_applied()
        _OPS[impl] = FusedOps(impl)
    ops = _OPS[impl]
    return model.TSSAOperators(ops.tssa, ops.causal_tssa, ops.causal_tssa_step)


def case_size(impl):
    """(T, p) of the cases of the fork check (forks.kernel_differences) for impl's kernels: T past two of their steps over chunks, ending
    inside a chunk; for the Triton kernels, p over two of dL/dw's column blocks, the second part-filled."""
    if impl == "triton":
        import kernels.triton_tssa as triton_tssa  # (imports Triton: asked only where the Triton kernels are checked)
        chunk, step = triton_tssa.BLOCK_T, triton_tssa.BLOCK_T * triton_tssa.SCAN_CHUNKS
        p = triton_tssa.FEATURE_BLOCK + max(1, triton_tssa.FEATURE_BLOCK // 2)
    else:
        from kernels.cpu import CKernels
        chunk = step = CKernels.L
        p = 8
    return 2 * step + chunk // 2 + 3, p
