"""
kernels: opt-in fused TSSA kernels (same maths as model.py, fewer passes over memory).

model.py's functions are the reference and the default (tssa_impl="torch"); model.py imports
nothing of this package. A script swaps the operators of every TSSA module of a built model:
    model = kernels.use(GPT(config), "cpu")      # or "triton"; "torch" puts the reference back
  "cpu"     cpu.py + tssa_cpu.c: C kernels compiled once with the system C compiler, OpenMP
            over batch rows and chunks of tokens, all heads of a token together.
  "triton"  triton_tssa.py: Triton kernels over chunks of tokens (CUDA; TRITON_INTERPRET=1
            runs them on the CPU). Six launches each way and no PyTorch op around them: four
            chunk launches (a program per batch row, chunk and head reads its tiles once) and
            two scans that turn chunk totals into every chunk's carry (a fixed order, no
            atomics: the same bits in any program order); the heads meet only through
            per-token scalars (u forward, Pi dL/dPi backward) read as (tokens, heads) tiles;
            the padding mask and the sums over the batch (dtemp, the whole dpos_bias) are
            inside the kernels; launch_plan() states every launch's grid, bytes and time.
  "auto"    auto.py: "triton" where the Triton kernels pass a first-call check against the
            reference (a CUDA GPU) and are the faster at the run's shape class (GPU time,
            against the reference compiled when the run compiles), else the reference (the GPU
            configs' choice); the pick is kept per machine (auto_cache.py, $NANOTOST_CACHE), and
            NANOTOST_AUTO=triton|torch|measure forces it.
The check of the whole maths (every output and gradient, in the regimes a fork changes) that
"cpu", "triton" and "auto" run before their kernels do is nanotost/forks.py's (the home of every
fork check): a fork of model.py's operators is refused in one line, never run with the shipped
maths.
fused.py holds the autograd.Function both share and the fallback to the reference (one
warning) where a kernel cannot be built or run; triton_ops.py registers the Triton forward and
backward as torch.library custom operators, which torch.compile keeps inside its graph;
triton_launch.py keeps a Triton call's host side cheap (plans memoised per shape, one workspace
allocation for the intermediates, compiled kernels launched without the JIT's dispatch);
gpu_check.py checks the Triton kernels on a GPU (accuracy, determinism, > 2^31 elements,
compute-sanitizer, profile). Two more fast paths that are not TSSA: cross_entropy.py, the loss
without the (B, T, V) logits (kernels.use(..., chunked_loss=True) makes it a GPT's loss), and
cuda_graph.py, a decoding step replayed as a CUDA graph, op by op or compiled
(kernels.capture_steps(model, compiled=...)). Pi comes back detached, as from model.py;
gradients flow to w, gamma (Pi's temperature, temp below) and pos_bias. The kernels compute
Pi by a softmax over the heads (FUSED_PI_MODES): another of model.PI_MODES is refused by "cpu"
and "triton", and run by model.py's maths under "auto" with its one warning. The guards
PI_NORM_EPS and STAT_EPS are model.py's, passed to every kernel call.

    python -m pytest -q tests/test_kernels.py        # every fused path == the reference
    python bench.py --suites=op --impls=torch,cpu,sdpa --T=16384 --modes=fwdbwd

The maths (per batch row and head; w_t in R^p the features of token t, q_t = w_t^2; F = the
floor on the sum of squares, e = STAT_EPS):
  forward   S_t = sum_{u<=t} q_u                 (prefix; the total for the non-causal form)
            r_t = sum_i q_ti / max(S_ti, F)        u_t = r_t + p * bias_t    logit_t = temp * u_t
            Pi_t = softmax over heads of logit_t
            N_t = sum_{u<=t} Pi_u,  M_t = sum_{u<=t} Pi_u q_u,  n_t = N_t + e,  s_t = M_t / n_t
            D_t = 1 / (1 + s_t),  out_t = -Pi_t w_t D_t
  backward  with g_t = dL/d out_t (suffix sums G_X_t = sum_{u>=t} X_u; totals if non-causal):
            gM_t = g_t Pi_t w_t D_t^2 / n_t          gN_t = -sum_i gM_ti s_ti
            gPi_t = sum_i (-g_ti w_ti D_ti + G_M_ti q_ti) + G_N_t
            gl = Pi * (gPi - sum_heads Pi gPi)     (softmax backward, across heads)
            dtemp = sum gl * u     dbias_t = p * temp * sum_batch gl_t     R_t = temp * gl_t
            A_t = 1 / max(S_t, F);  gS_t = -R_t q_t A_t^2 where S_t >= F, else 0
            dw_t = -Pi_t D_t g_t + 2 w_t (Pi_t G_M_t + R_t A_t + G_S_t)
The softmax across heads couples the heads: a kernel that computes Pi (or dL/dlogit) must see
every head of a token. The CPU kernels own every head of a token; the Triton kernels F3 and B3
read every head's per-token scalar (u, or Pi dL/dPi) for the tokens of their head's chunk
(F1 S F2 F3 S F4 forward, B1 S B2 B3 S B4 backward: triton_tssa.py).
"""

import os
from types import MethodType

import torch

import model
from nanotost import forks
from nanotost.cli import ConfigError
from kernels import auto
from kernels.auto import AUTO_OPS
from kernels.cross_entropy import gpt_loss
from kernels.cuda_graph import CAPTURES, CapturedStep, CompiledStep, capture_steps  # noqa: F401  (sample.py, bench.py)
from kernels.fused import BACKENDS, FUSED_PI_MODES, built_impls, case_size, fused_ops, marks_applied, warn

IMPLS = ("torch", "cpu", "triton", "auto")  # the values of every script's tssa_impl setting


def ops_for(impl):
    """The operator functions (model.TSSAOperators: tssa, causal_tssa, causal_tssa_step) of impl."""
    if impl not in IMPLS:
        raise ValueError(f"tssa_impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "auto":
        auto.forced()  # (a wrong NANOTOST_AUTO: one line now)
        marks_applied()  # (auto's own torch.compiler marks)
        return AUTO_OPS
    return model.REFERENCE_OPERATORS if impl == "torch" else fused_ops(impl)


def owned(ops):
    """Whether ops are model.py's reference or fused kernels of this package: the operators use()
    may replace. A module with any other (a forker's subclass, its own functions) keeps them."""
    return ops in (model.REFERENCE_OPERATORS, AUTO_OPS) or any(ops == fused_ops(impl) for impl in built_impls())


def check_f_prime(impl):
    """The fused kernels compute f'(s) = 1 / (1 + s), f = log(1 + x) (MATH.md §2.2): refuse them,
    in one line, when model.f_prime is another function (a forker's f)."""
    s = torch.tensor([0.0, 0.5, 3.0, 1e3], dtype=torch.float64)
    if not torch.allclose(model.f_prime(s).double(), 1.0 / (1.0 + s), rtol=1e-12, atol=0):
        raise ConfigError(f"tssa_impl={impl} computes f'(s) = 1 / (1 + s) (f = log(1 + x)), but model.f_prime "
                          f"is another function: use tssa_impl=torch, which runs model.py's maths")


def shipped_maths_here(impl):
    """(device, kernels) that check_maths runs as the shipped maths for impl: the C kernels on the
    CPU wherever they build (a fraction of a second, before any work), else the Triton kernels
    where they run (CUDA, or TRITON_INTERPRET=1); None where neither can (impl then falls back
    to model.py's maths itself, with its one warning)."""
    from kernels.cpu import KernelUnavailable, c_library
    try:
        c_library()
        return "cpu", "cpu"
    except KernelUnavailable:
        pass
    if impl == "triton":
        if torch.cuda.is_available():
            return "cuda", "triton"
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "cpu", "triton"
    return None


def check_maths(impl):
    """Refuse impl (cpu, triton), in one line, when model.py's operators as they are now (a fork's
    edit to Pi, the statistic, the step, one form and not the other) differ from the shipped maths
    the kernels compute (nanotost/forks.py: every output and gradient). Runs under any grad mode,
    inference mode or autocast (evaluate.py's no_grad main)."""
    here = shipped_maths_here(impl)
    if here is not None:
        device, kernels = here
        cause = forks.mismatch(impl, forks.kernel_differences(fused_ops(kernels), device, *case_size(kernels)))
        if cause:
            raise ConfigError(cause)


def use(module, impl, chunked_loss=False, timed_at=None):
    """Run every model.TSSA inside `module` (a GPT, a ToSTViT, an LRA classifier, ...) with the
    operators of impl; with chunked_loss, every model.GPT computes its loss CE_CHUNK tokens at a
    time (kernels/cross_entropy.py; otherwise model.GPT.loss). Returns the module.
    timed_at: (B, T, dtype, compiled), the batches the module (on its device) will run: "auto"
    then decides its causal TSSAs' pick now, in this process (auto.decide_before_compile).
    Only operators this package owns are replaced: a TSSA with its own (a subclass, a forker's
    functions) keeps them under "torch" and "auto", and "cpu" or "triton" refuses it, as they
    refuse another f, model.py's operators edited (check_maths), a Pi mode the kernels do not
    compute and a TSSA whose own forward calls none of its operators (it would run no kernel:
    forks.operators_unused). "auto" finds an edit on its first call, and runs the reference with
    a warning, as it does for a Pi mode the kernels do not compute and says of a forward of its
    own (here, once).
    Pick them before torch.compile."""
    ops = ops_for(impl)
    if impl in BACKENDS:
        check_f_prime(impl)
        check_maths(impl)
    reference_only, own_maths, probed = set(), set(), {}  # what "auto" runs by model.py alone; own forwards
    for name, m in module.named_modules():
        where = f"{name or 'the model'} ({type(m).__qualname__})"
        if isinstance(m, model.TSSA) and impl != "torch" and type(m) not in probed:
            probed[type(m)] = forks.operators_unused(m)  # its own forward, which calls none of its operators
        if isinstance(m, model.TSSA) and impl != "torch" and probed[type(m)]:
            if impl in BACKENDS:
                raise ConfigError(f"tssa_impl={impl} would run no kernel: {where} has a forward of its own that "
                                  "calls none of its operators (its own maths): use tssa_impl=torch")
            own_maths.add(type(m).__qualname__)
        elif isinstance(m, model.TSSA) and not owned(m.operators):
            if impl in BACKENDS:
                raise ConfigError(f"tssa_impl={impl} runs the shipped TSSA only; {where} has its own operators: "
                                  "use tssa_impl=torch")
        elif isinstance(m, model.TSSA):
            if impl != "torch" and m.pi_mode not in FUSED_PI_MODES:
                if impl in BACKENDS:
                    runs = (f"model.PI_MODES[{m.pi_mode!r}]" if isinstance(m.pi_mode, str) else "it")
                    raise ConfigError(f"tssa_impl={impl} computes Pi by a softmax over the heads, and {where} "
                                      f"takes {forks.pi_named(m.pi_mode)}: use tssa_impl=torch, which runs {runs}")
                reference_only.add(forks.pi_named(m.pi_mode))
            m.operators = ops
        if isinstance(m, model.GPT):
            m.__dict__.pop("loss", None)  # model.GPT.loss, or the chunked one
            if chunked_loss:
                m.loss = MethodType(gpt_loss, m)
    if reference_only:
        warn(f"tssa_impl='auto': {', '.join(sorted(reference_only))} is model.py's alone (the Triton "
             "kernels compute a softmax Pi); running model.py's reference maths")
    if own_maths:
        warn(f"tssa_impl='auto': {', '.join(sorted(own_maths))} has a forward of its own that calls none of its "
             "operators: it runs its own maths, no kernel")
    if impl == "auto" and timed_at is not None:
        auto.decide_before_compile(module, *timed_at)
    return module
