"""
Tests of the fused kernels (kernels/): every fused path, selected through tssa_impl, against
model.py's readable reference, for outputs, Pi and every gradient (w, temperature, position
bias); odd shapes; masks; zero and near-zero input; the guards model.py passes; the fused
decoding step; the fallback to the reference (one warning) when kernels cannot be built or
launched, each failure simulated; the hand-derived backward by gradcheck in float64 (its
PyTorch statement, TorchKernels below, is the oracle); the Triton kernels under
TRITON_INTERPRET=1 (in a subprocess: Triton fixes interpreter mode at import), under
torch.compile, and on a CUDA GPU when there is one (tests/test_triton_builds.py builds them as
the GPU machines' JIT does).

    python -m pytest -q tests/test_kernels.py
"""

import contextlib
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import background

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import model  # noqa: E402
import kernels  # noqa: E402
from kernels import cpu, fused  # noqa: E402
from kernels.cpu import CKernels  # noqa: E402

torch.set_num_threads(2)
# a fallback warning inside these tests is a failure, except where a test asks for one
pytestmark = pytest.mark.filterwarnings("error:tssa_impl")


def _has_c():
    try:
        cpu.c_library()
        return True
    except cpu.KernelUnavailable:
        return False


HAS_C = _has_c()
needs_c = pytest.mark.skipif(not HAS_C, reason="no C compiler built kernels/tssa_cpu.c (install gcc)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU: the Triton kernels are checked under the interpreter instead")
FUSED = [pytest.param("cpu", "cpu", marks=needs_c), pytest.param("triton", "cuda", marks=needs_cuda)]

# Relative RMS bounds. fp32: the fused kernels sum in a different order than torch's cumsum
# (chunks, carries, head-at-a-time), so results differ by fp32 rounding accumulated over at
# most a few hundred terms: ~1e-6 relative; 2e-5 leaves headroom and still fails on any
# wrong term (a wrong gradient term is O(1) relative). bf16: one output ulp is 2^-8 = 3.9e-3.
FP32_TOL = 2e-5
BF16_TOL = 8e-3
NAMES = ["out", "pi", "dw", "dtemp", "dpos_bias"]


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make_inputs(B, H, T, p, dtype=torch.float32, seed=0, tiny=False):
    """w in the layout model.py makes ((B, T, H, p) memory viewed as (B, H, T, p)), a
    temperature per head, a position bias longer than T, and dL/dout in the same layout.
    tiny: a quarter of the features are ~1e-7 for the first half of the tokens, so their
    running sums of squares stay under the causal floor PI_NORM_EPS (the clamp's branch)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H * p, generator=g)
    if tiny:
        x[:, :T // 2, ::4] *= 1e-7
    x = x.to(dtype)
    w = x.view(B, T, H, p).transpose(1, 2).detach().requires_grad_()
    temp = (0.5 + torch.rand(H, generator=g)).requires_grad_()
    pos_bias = (0.3 * torch.randn(H, T + 5, generator=g)).requires_grad_()
    grad_out = torch.randn(B, T, H * p, generator=g).to(dtype).view(B, T, H, p).transpose(1, 2)
    return w, temp, pos_bias, grad_out


def outputs_and_grads(fn, w, temp, pos_bias, grad_out, with_bias=True):
    """[out, Pi, dw, dtemp(, dpos_bias)] of fn() and the gradients of sum(out * grad_out)."""
    out, pi = fn()
    leaves = [w, temp] + ([pos_bias] if with_bias else [])
    return [out, pi, *torch.autograd.grad(out, leaves, grad_out)], out.grad_fn.name()


def compare(impl, w, temp, pos_bias, g, causal=True, mask=None, tol=FP32_TOL):
    """The fused path of tssa_impl=impl against tssa_impl="torch": every result within tol,
    and the fused path really ran (its autograd node)."""
    fast_ops, ref_ops = kernels.ops_for(impl), kernels.ops_for("torch")
    if causal:
        call = lambda ops: lambda: ops.causal_tssa(w, temp, pos_bias, return_pi=True)
    else:
        call = lambda ops: lambda: ops.tssa(w, temp, return_pi=True, mask=mask)
    fast, node = outputs_and_grads(call(fast_ops), w, temp, pos_bias, g, causal)
    ref, _ = outputs_and_grads(call(ref_ops), w, temp, pos_bias, g, causal)
    assert node == "FusedTSSABackward"
    errors = {n: rel_rms(f, r) for n, f, r in zip(NAMES, fast, ref)}
    assert all(e < tol for e in errors.values()), errors
    return fast


# -----------------------------------------------------------------------------
# the C kernels (CPU)

def force_sequential(monkeypatch, sequential):
    """The one-pass causal kernels (sequential=True) or the chunked ones, whatever B and threads."""
    monkeypatch.setattr(CKernels, "sequential", staticmethod(lambda B, causal, mask=None: causal and sequential))


ODD_SHAPES = [(1, 3, 150, 24),  # T not a multiple of the chunk, p not a power of two, B*H odd
              (2, 5, 67, 7),  # several batch rows, tiny odd p
              (1, 2, 1, 5),  # a single token
              (3, 4, 300, 16)]  # more chunks than threads


@needs_c
@pytest.mark.parametrize("sequential", [True, False], ids=["one-pass", "chunked"])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_cpu_causal_matches_reference(shape, sequential, monkeypatch):
    force_sequential(monkeypatch, sequential)
    compare("cpu", *make_inputs(*shape))


@needs_c
@pytest.mark.parametrize("sequential", [True, False], ids=["one-pass", "chunked"])
def test_cpu_near_zero_features_follow_the_clamp(sequential, monkeypatch):
    """Features whose running sum of squares is below the floor: the clamp's forward and its
    zero gradient, as the reference (an added epsilon differed here)."""
    force_sequential(monkeypatch, sequential)
    compare("cpu", *make_inputs(2, 3, 150, 16, tiny=True))
    w, temp, _, g = make_inputs(2, 3, 40, 8, tiny=True)
    compare("cpu", w, temp, None, g, causal=False)


@needs_c
@pytest.mark.parametrize("shape", [(1, 3, 150, 24), (2, 5, 67, 7)], ids=str)
def test_cpu_noncausal_with_mask_matches_reference(shape):
    w, temp, _, g = make_inputs(*shape)
    B, T = shape[0], shape[2]
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, T // 3:] = False  # the first row is padded after a third of its tokens
    compare("cpu", w, temp, None, g, causal=False)
    out, pi, dw, _ = compare("cpu", w, temp, None, g, causal=False, mask=mask)
    assert out[0, :, T // 3:].abs().max() == 0 and pi[0, :, T // 3:].abs().max() == 0  # padding takes no part
    assert dw[0, :, T // 3:].abs().max() == 0


@needs_c
def test_cpu_bf16_matches_reference():
    # statistics are fp32 on both sides; only the bf16 rounding of out and dw can differ
    compare("cpu", *make_inputs(2, 3, 100, 16, dtype=torch.bfloat16), tol=BF16_TOL)


@needs_c
@pytest.mark.parametrize("sequential", [True, False], ids=["one-pass", "chunked"])
def test_cpu_kernels_use_the_guards_model_passes(sequential, monkeypatch):
    """model.PI_NORM_EPS and STAT_EPS are the only copies: made large here (the floor then
    holds for the first tokens, and the count guard moves s), the kernels follow them."""
    force_sequential(monkeypatch, sequential)
    inputs = make_inputs(2, 3, 40, 8)
    before = compare("cpu", *inputs)
    monkeypatch.setattr(model, "PI_NORM_EPS", 3.0)
    monkeypatch.setattr(model, "STAT_EPS", 0.5)
    after = compare("cpu", *inputs)
    assert all(rel_rms(a, b) > 1e-3 for a, b in zip(after, before))  # the guards matter here
    w, temp, _, g = make_inputs(1, 3, 4, 8)  # non-causal floor 3^2 = 9 > a sum of 4 squares
    compare("cpu", w, temp, None, g, causal=False)


@needs_c
def test_cpu_kernels_ignore_a_float64_default_dtype():
    # the C kernels write fp32 through raw pointers: their buffers must not follow the default dtype
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        compare("cpu", *make_inputs(1, 3, 150, 24))
        compare("cpu", *make_inputs(3, 2, 40, 8))  # the one-pass path (B >= threads)
    finally:
        torch.set_default_dtype(prev)


# -----------------------------------------------------------------------------
# the hand-derived backward in float64: its PyTorch statement (the oracle) by gradcheck


def _scan(x, causal):  # prefix sums over tokens (dim 2), or the total broadcast to every token
    return x.cumsum(2) if causal else x.sum(2, keepdim=True)


def _rscan(x, causal):  # suffix sums over tokens, or the total
    return x.flip(2).cumsum(2).flip(2) if causal else x.sum(2, keepdim=True)


class TorchKernels:
    """The kernels' forward and backward (kernels/__init__.py) as whole-tensor PyTorch ops, any
    dtype: the executable statement of the hand-derived backward the C and Triton kernels
    implement, checked by gradcheck."""

    name = "torch"

    @staticmethod
    def unsupported(w):
        return None

    @classmethod
    def forward(cls, w, temp, bias, mask, causal, eps):
        H, p = w.shape[1], w.shape[3]
        floor, stat_eps = eps
        q = w.square()
        u = (q / _scan(q, causal).clamp_min(floor)).sum(-1)  # (B, H, T)
        if bias is not None:
            u = u + p * bias
        pi = (temp.view(1, H, 1) * u).softmax(dim=1)
        if mask is not None:
            pi = pi * mask[:, None, :]
        P = pi.unsqueeze(-1)
        s = _scan(P * q, causal) / (_scan(P, causal) + stat_eps)
        return -P * w / (1.0 + s), pi, u, ()

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps):
        H, p = w.shape[1], w.shape[3]
        floor, stat_eps = eps
        P, q = pi.unsqueeze(-1), w.square()
        n = _scan(P, causal) + stat_eps
        s = _scan(P * q, causal) / n
        D = 1.0 / (1.0 + s)
        gM = g * P * w * D.square() / n
        G_M = _rscan(gM, causal)
        G_N = _rscan(-(gM * s).sum(-1, keepdim=True), causal)
        gpi = (-g * w * D + G_M * q).sum(-1) + G_N.squeeze(-1)
        if mask is not None:
            gpi = gpi * mask[:, None, :]
        gl = pi * (gpi - (pi * gpi).sum(1, keepdim=True))  # softmax backward across heads
        R = temp.view(1, H, 1, 1) * gl.unsqueeze(-1)
        S = _scan(q, causal)
        A = 1.0 / S.clamp_min(floor)
        G_S = _rscan(torch.where(S >= floor, -R * q * A.square(), 0.0), causal)
        gw = P * (2.0 * w * G_M - D * g) + 2.0 * w * (R * A + G_S)
        return gw, (gl * u).sum((0, 2)), p * temp.view(H, 1) * gl.sum(0)


class OracleOps(fused.FusedOps):
    """FusedOps running TorchKernels, with any fallback turned into a failure."""

    def __init__(self):
        super().__init__("cpu")
        self.kernels = TorchKernels

    def disable(self, cause):
        raise AssertionError(cause)


def test_backward_gradcheck_float64():
    """torch.autograd.gradcheck (finite differences, eps 1e-6, atol 1e-5, rtol 1e-3) of the
    hand-written backward shared by every back end, in its PyTorch form."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2, 3, 5, 3, dtype=torch.float64, generator=g).requires_grad_()
    temp = (0.5 + torch.rand(3, dtype=torch.float64, generator=g)).requires_grad_()
    bias = (0.3 * torch.randn(3, 5, dtype=torch.float64, generator=g)).requires_grad_()
    ops = OracleOps()
    causal = lambda w_, t_, b_: fused.FusedTSSA.apply(w_, t_, b_, None, True, ops)[0]
    assert torch.autograd.gradcheck(causal, (w, temp, bias))
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2], dtype=torch.float64)
    noncausal = lambda w_, t_: fused.FusedTSSA.apply(w_, t_, None, mask, False, ops)[0]
    assert torch.autograd.gradcheck(noncausal, (w, temp))


@pytest.mark.parametrize("tiny", [False, True], ids=["normal", "near-zero"])
def test_oracle_float64_equals_reference(tiny):
    # same maths in float64 on both sides, the clamp's branch included: only rounding differs
    w, temp, pos_bias, g = make_inputs(2, 3, 33, 6, dtype=torch.float64, tiny=tiny)
    with torch.no_grad():
        temp.data, pos_bias.data = temp.double(), pos_bias.double()
    ops = OracleOps()
    fast = lambda: fused.FusedTSSA.apply(w, temp, pos_bias[:, :33], None, True, ops)
    ref = lambda: model.causal_tssa(w, temp, pos_bias, return_pi=True)
    for f, r in zip(outputs_and_grads(fast, w, temp, pos_bias, g)[0], outputs_and_grads(ref, w, temp, pos_bias, g)[0]):
        assert rel_rms(f, r) < 1e-12


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_all_zero_input_is_finite(impl):
    """Zero features (the floor holds everywhere): zero output, uniform Pi, finite gradients;
    on the fused path where it runs here (the C kernels), else the reference."""
    if impl == "cpu" and not HAS_C:
        pytest.skip("no C compiler")
    w = torch.zeros(1, 3, 40, 8, requires_grad=True)
    temp = torch.ones(3, requires_grad=True)
    bias = torch.zeros(3, 40, requires_grad=True)
    ops = OracleOps() if impl == "triton" else kernels.ops_for(impl)  # Triton: its oracle here
    out, pi = ops.causal_tssa(w, temp, bias, return_pi=True)
    assert out.grad_fn.name() == "FusedTSSABackward"
    out.backward(torch.randn_like(out))
    assert out.abs().max() == 0
    assert torch.allclose(pi, torch.full_like(pi, 1 / 3))  # no evidence: uniform over heads
    for grad in (w.grad, temp.grad, bias.grad):
        assert torch.isfinite(grad).all()
    assert ops.tssa(w.detach(), temp.detach()).abs().max() == 0


# -----------------------------------------------------------------------------
# the setting: what runs where


def tiny_gpt(tssa_impl="torch", **kw):
    torch.manual_seed(0)
    cfg = model.GPTConfig(block_size=64, vocab_size=97, n_layer=2, n_head=3, n_embd=48, layer_scale_init=0.5, **kw)
    return kernels.use(model.GPT(cfg), tssa_impl)


@needs_c
def test_setting_picks_the_implementation_and_the_reference_where_kernels_do_not_apply():
    assert tiny_gpt().blocks[0].attn.operators is model.REFERENCE_OPERATORS  # the default: model.py's maths
    ops = tiny_gpt(tssa_impl="cpu").blocks[0].attn.operators
    assert ops.causal_tssa.__self__ is fused._OPS["cpu"]
    with pytest.raises(ValueError, match="tssa_impl must be one of"):
        tiny_gpt(tssa_impl="fast")
    w, temp, pos_bias, g = make_inputs(1, 3, 20, 8)
    assert ops.causal_tssa(w, temp, pos_bias).grad_fn.name() == "FusedTSSABackward"
    # by design, without a warning: the uniform-Pi ablation and float64 run the reference
    assert ops.causal_tssa(w, temp, pos_bias, pi_mode="uniform").grad_fn.name() != "FusedTSSABackward"
    assert ops.causal_tssa(w.double(), temp, pos_bias).grad_fn.name() != "FusedTSSABackward"


@pytest.mark.parametrize("impl", ["torch", pytest.param("cpu", marks=needs_c)])
def test_pi_comes_back_detached_from_every_implementation(impl):
    """Pi is an estimate held fixed (MATH.md §2.4): returned without a gradient path by every
    implementation (the Triton kernels: see the interpreter cases); out keeps its gradients."""
    ops = kernels.ops_for(impl)
    w, temp, pos_bias, _ = make_inputs(1, 3, 20, 8)
    for out, pi in (ops.causal_tssa(w, temp, pos_bias, return_pi=True), ops.tssa(w, temp, return_pi=True)):
        assert out.requires_grad and not pi.requires_grad


@pytest.mark.parametrize("impl,device", FUSED)
def test_whole_model_gradients_match_reference(impl, device):
    """A training step's loss and every parameter gradient are the same with tssa_impl=impl
    as with the reference (the operator sits between real projections here)."""
    ref_model = tiny_gpt().to(device)
    fast_model = tiny_gpt(tssa_impl=impl).to(device)
    fast_model.load_state_dict(ref_model.state_dict())
    idx = torch.randint(0, 97, (2, 50), generator=torch.Generator().manual_seed(0)).to(device)
    losses, grads = [], []
    for m in (fast_model, ref_model):
        _, loss = m(idx, idx)
        losses.append(loss.item())
        grads.append(torch.autograd.grad(loss, list(m.parameters())))
    assert abs(losses[0] - losses[1]) < 1e-6  # fp32 loss ~4.6: a few ulps
    for (name, _), gf, gr in zip(ref_model.named_parameters(), *grads):
        if gr.norm() > 0:
            assert rel_rms(gf, gr) < 1e-4, name  # through 2 layers of matmuls, still fp32 rounding


@needs_c
def test_vit_with_cpu_kernels_matches_reference(monkeypatch):
    """ViTConfig(tssa_impl="cpu"): the non-causal fused path inside a whole ViT, logits and
    every parameter gradient as with the reference."""
    cfg = dict(patch_size=8, n_layer=2, n_head=2, n_embd=16, num_classes=5)
    torch.manual_seed(0)
    ref_model = model.ToSTViT(model.ViTConfig(**cfg))
    fast_model = kernels.use(model.ToSTViT(model.ViTConfig(**cfg)), "cpu")
    fast_model.load_state_dict(ref_model.state_dict())
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    calls, forward = [], CKernels.forward
    monkeypatch.setattr(CKernels, "forward", staticmethod(lambda *a: calls.append(1) or forward(*a)))
    results = []
    for m in (fast_model, ref_model):
        logits = m(images)
        results.append((logits, torch.autograd.grad(logits.square().sum(), list(m.parameters()))))
    (lf, gf), (lr, gr) = results
    assert len(calls) == 2  # the C kernels ran in both ToST blocks of the fused model
    assert rel_rms(lf, lr) < 1e-5  # fp32 rounding through a few layers
    for (name, _), a, b in zip(ref_model.named_parameters(), gf, gr):
        if b.norm() > 0:
            assert rel_rms(a, b) < 1e-4, name


@needs_c
def test_fused_step_equals_reference_step():
    B, H, p, T_bias = 2, 3, 24, 5
    g = torch.Generator().manual_seed(0)
    temp, pos_bias = 0.5 + torch.rand(H, generator=g), torch.randn(H, T_bias, generator=g)
    fused_state, ref_state = model.TSSAState.zeros(B, H, p), model.TSSAState.zeros(B, H, p)
    step = kernels.ops_for("cpu").causal_tssa_step
    for t in range(T_bias + 3):  # past the end of the bias: the last one is reused
        w_t = torch.randn(B, H, p, generator=g)
        w_t[0, 0, :5] *= 1e-7 if t < 2 else 1.0  # sums of squares under the floor at first
        bias_t = pos_bias[:, min(t, T_bias - 1)]
        pi_f, pi_r = -fused_state.sum_pi.clone(), -ref_state.sum_pi.clone()  # Pi: what the step adds
        out_f = step(w_t, temp, bias_t, fused_state)
        out_r = model.causal_tssa_step(w_t, temp, bias_t, ref_state)
        pi_f, pi_r = pi_f + fused_state.sum_pi, pi_r + ref_state.sum_pi
        assert rel_rms(out_f, out_r) < FP32_TOL and rel_rms(pi_f, pi_r) < FP32_TOL
    for a, b in zip((fused_state.sum_sq, fused_state.sum_pi_sq, fused_state.sum_pi),
                    (ref_state.sum_sq, ref_state.sum_pi_sq, ref_state.sum_pi)):
        assert rel_rms(a, b) < FP32_TOL


@pytest.mark.parametrize("impl,device", FUSED)
def test_generation_same_tokens_fused_and_reference(impl, device):
    ref_model = tiny_gpt().eval().to(device)
    fast_model = tiny_gpt(tssa_impl=impl).eval().to(device)
    fast_model.load_state_dict(ref_model.state_dict())
    prompt = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1)).to(device)
    assert torch.equal(fast_model.generate(prompt, 12, temperature=0), ref_model.generate(prompt, 12, temperature=0))


# -----------------------------------------------------------------------------
# an opt-in fast path never kills a run: each failure simulated, one warning, the reference


def fresh_ops(monkeypatch, impl):
    """The ops of a process that has not tried impl's kernels yet."""
    monkeypatch.setattr(fused, "_OPS", {})
    return kernels.ops_for(impl)


def check_fallback(ops, match, calls=2):
    """Run a causal forward and backward `calls` times through ops: exactly one warning
    matching `match`, and the reference's results."""
    w, temp, pos_bias, g = make_inputs(1, 3, 30, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            call = lambda: ops.causal_tssa(w, temp, pos_bias, return_pi=True)
            got, node = outputs_and_grads(call, w, temp, pos_bias, g)
    msgs = [str(c.message) for c in caught if "tssa_impl" in str(c.message)]
    assert len(msgs) == 1 and match in msgs[0] and "reference" in msgs[0], msgs
    want, _ = outputs_and_grads(lambda: model.causal_tssa(w, temp, pos_bias, return_pi=True), w, temp, pos_bias, g)
    for f, r in zip(got, want):
        assert rel_rms(f, r) < FP32_TOL
    return node, msgs[0]


def test_no_c_compiler_falls_back_to_the_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("NANOTOST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NANOTOST_NO_C", raising=False)
    monkeypatch.setattr(cpu, "_c_lib_cache", [])  # forget the library this process built
    node, msg = check_fallback(fresh_ops(monkeypatch, "cpu"), "could not build the C kernels")
    assert node != "FusedTSSABackward"
    assert not list((tmp_path / "cache").iterdir())  # nothing half-built left behind
    m = tiny_gpt(tssa_impl="cpu").eval()  # decoding too: the reference step, no second warning
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "tssa_impl")
        assert m.generate(torch.zeros(1, 4, dtype=torch.long), 3, temperature=0).shape == (1, 7)


def test_no_triton_falls_back_to_the_reference(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "kernels.triton_tssa", raising=False)
    check_fallback(fresh_ops(monkeypatch, "triton"), "import of triton")


def test_triton_on_cpu_tensors_falls_back_to_the_reference(monkeypatch):
    pytest.importorskip("triton")
    from kernels import triton_tssa
    monkeypatch.setattr(triton_tssa, "INTERPRET", False)
    check_fallback(fresh_ops(monkeypatch, "triton"), "take CUDA tensors")


def test_triton_launch_error_falls_back_to_the_reference(monkeypatch):
    """A launch that raises (here a real one: CPU tensors handed to the compiled kernels, as
    a compile error or an unsupported GPU would) disables the kernels for the run."""
    pytest.importorskip("triton")
    from kernels import triton_tssa
    if triton_tssa.INTERPRET:
        pytest.skip("under TRITON_INTERPRET=1 the launch on CPU tensors works")
    monkeypatch.setattr(triton_tssa.TritonKernels, "unsupported", staticmethod(lambda w: None))
    ops = fresh_ops(monkeypatch, "triton")
    check_fallback(ops, "the kernels raised")
    assert fused._OPS["triton"].failure is not None


@needs_c
def test_backward_failure_falls_back_to_reference_gradients(monkeypatch):
    def broken(*args):
        raise RuntimeError("simulated: the backward kernels do not build")
    monkeypatch.setattr(CKernels, "backward", staticmethod(broken))
    node, _ = check_fallback(fresh_ops(monkeypatch, "cpu"), "simulated", calls=1)
    assert node == "FusedTSSABackward"  # the forward ran fused; its gradients came from the reference


@needs_c
def test_decoding_step_failure_falls_back_to_the_reference_step(monkeypatch):
    def broken(*args):
        raise RuntimeError("simulated step failure")
    monkeypatch.setattr(CKernels, "step", staticmethod(broken))
    step = fresh_ops(monkeypatch, "cpu").causal_tssa_step
    g = torch.Generator().manual_seed(3)
    temp, bias_t, w_t = torch.ones(3), torch.zeros(3), torch.randn(2, 3, 8, generator=g)
    s1, s2 = model.TSSAState.zeros(2, 3, 8), model.TSSAState.zeros(2, 3, 8)
    with pytest.warns(RuntimeWarning, match="simulated step failure"):
        out = step(w_t, temp, bias_t, s1)
    ref = model.causal_tssa_step(w_t, temp, bias_t, s2)
    assert torch.equal(out, ref) and torch.equal(s1.sum_sq, s2.sum_sq)


BUILD_SCRIPT = "from kernels import cpu; print(cpu.c_library()._name)"


@needs_c
def test_c_build_concurrent_and_cache_folder_fallback(tmp_path):
    """Two processes building at once into an empty cache (as torchrun ranks do) both load a
    whole library and leave one file; an unusable default cache folder (a read-only home: here
    $XDG_CACHE_HOME under a plain file) falls back to a per-user folder in the temp dir. (A
    $NANOTOST_CACHE the user gave is never passed over: tests/test_hostile.py, class 5.)"""
    (tmp_path / "file").write_text("")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "file" / "cache"), TMPDIR=str(tmpdir),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    env.pop("NANOTOST_NO_C", None)
    env.pop("NANOTOST_CACHE", None)
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and paths.pop().startswith(str(tmpdir / "nanotost-"))
    cache = next(tmpdir.glob("nanotost-*"))
    assert [f.suffix for f in cache.iterdir()] == [".so"]  # no temp files left behind


# -----------------------------------------------------------------------------
# Triton kernels: under the interpreter on CPU (in a subprocess: Triton fixes interpreter mode
# at import), and on a CUDA GPU when there is one. Both run the same cases through
# run_triton_case and check them with check_triton_case against the reference on the CPU.

TRITON_CASES = dict(  # small enough for the interpreter
    causal_fp32_odd=dict(B=1, H=3, T=150, p=24, dtype=torch.float32, causal=True, seed=0),  # T % 64 != 0, p not 2^k
    causal_fp32_batch=dict(B=2, H=2, T=64, p=16, dtype=torch.float32, causal=True, seed=1),  # T exactly one chunk
    causal_bf16=dict(B=1, H=2, T=70, p=16, dtype=torch.bfloat16, causal=True, seed=2),
    causal_fp16=dict(B=1, H=2, T=40, p=8, dtype=torch.float16, causal=True, seed=3),
    noncausal_mask=dict(B=2, H=3, T=90, p=12, dtype=torch.float32, causal=False, masked=True, seed=4),
    causal_big_p=dict(B=1, H=2, T=40, p=300, dtype=torch.float32, causal=True, seed=6),  # P = 512: 16-token tiles
    causal_layouts=dict(B=2, H=1, T=100, p=10, dtype=torch.float32, causal=True, seed=7, layout="contiguous"),
    # 18 chunks of 16 tokens (10 non-causal), their carries scanned 2 chunk totals a step; dL/dw in blocks of 2
    # of the 4 columns. A small first token makes the first chunk's total of dL/dS huge: a
    # carry computed as (inclusive - own total) would lose the later chunks' (an earlier
    # version's dw was off by 4e-3, not 3e-6)
    causal_many_chunks=dict(B=1, H=2, T=280, p=4, dtype=torch.float32, causal=True, seed=8, block_t=16,
                            first_scale=0.01, scan_chunks=2, feature_block=2),
    noncausal_many_chunks=dict(B=1, H=3, T=150, p=4, dtype=torch.float32, causal=False, masked=True, seed=9,
                               block_t=16, scan_chunks=2),
    # running sums of squares under the floor: the clamp's forward and its zero gradient
    causal_near_zero=dict(B=1, H=3, T=100, p=16, dtype=torch.float32, causal=True, seed=14, tiny=True),
    noncausal_near_zero=dict(B=2, H=3, T=40, p=8, dtype=torch.float32, causal=False, seed=15, tiny=True),
    # model.py's guards, made large, reach the kernels (the floor holds for the first tokens)
    causal_guards=dict(B=1, H=3, T=40, p=8, dtype=torch.float32, causal=True, seed=16, guards=(3.0, 0.5)),
    noncausal_guards=dict(B=1, H=3, T=4, p=8, dtype=torch.float32, causal=False, seed=17, guards=(3.0, 0.5)),
    # head counts 1, 5, 12, 17 (HP = 1, 8, 16, 32 heads in the (tokens, heads) tiles of
    # per-token scalars); T = 1, one chunk - 1, one chunk + 1 (chunks of 16 tokens here; one
    # chunk exactly: causal_fp32_batch); H = 17 in two groups of one chunk
    causal_h1_t1=dict(B=1, H=1, T=1, p=8, dtype=torch.float32, causal=True, seed=18),
    causal_h5_chunk_minus_1=dict(B=2, H=5, T=15, p=4, dtype=torch.float32, causal=True, seed=19, block_t=16),
    causal_h12_chunk_plus_1_bf16=dict(B=1, H=12, T=17, p=24, dtype=torch.bfloat16, causal=True, seed=20,
                                      block_t=16),
    noncausal_h17_mask=dict(B=1, H=17, T=16, p=4, dtype=torch.float32, causal=False, masked=True, seed=21,
                            block_t=16),
    causal_h17_bf16=dict(B=1, H=17, T=20, p=16, dtype=torch.bfloat16, causal=True, seed=22, block_t=16,
                         feature_block=8),
    # T = 1 with a mask: batch row 0 is all padding (every statistic of the row empty)
    noncausal_h5_t1_mask=dict(B=2, H=5, T=1, p=8, dtype=torch.float32, causal=False, masked=True, seed=23),
    noncausal_h12_bf16_mask=dict(B=2, H=12, T=7, p=4, dtype=torch.bfloat16, causal=False, masked=True, seed=24),
    # three batch rows summed into dpos_bias two at a time, dtemp's partials two chunks at a
    # time; its 40 columns past T zeros; carries scanned 2 chunks a step
    causal_long_bias=dict(B=3, H=2, T=33, p=4, dtype=torch.float32, causal=True, seed=25, block_t=16, bias_extra=40,
                          scan_chunks=2, batch_block=2, partial_block=2),
    # 7 chunks scanned 2 a step (bf16), dL/dw in column blocks of 4 of p = 8; p = 6 in blocks of
    # 4 (the last block half empty), 4 chunks a step; a padding mask that ends inside a chunk
    causal_blocks_bf16=dict(B=1, H=3, T=100, p=8, dtype=torch.bfloat16, causal=True, seed=26, block_t=16,
                            scan_chunks=2, feature_block=4, first_scale=0.01),
    causal_odd_blocks=dict(B=2, H=2, T=70, p=6, dtype=torch.float32, causal=True, seed=27, block_t=16,
                           scan_chunks=4, feature_block=4),
    noncausal_blocks_mask=dict(B=2, H=2, T=50, p=4, dtype=torch.float32, causal=False, masked=True, seed=28,
                               block_t=16, scan_chunks=2, feature_block=2, batch_block=1),
    # heads of 64 as shipped: chunks of 32 tokens, dL/dw one program over the 64 columns; T past
    # two chunks ending inside a third (bf16, two batch rows summed into dpos_bias; non-causal
    # with a mask); T = 1 at three batch rows (one chunk, the scans one total a step)
    causal_head64_bf16=dict(B=2, H=2, T=70, p=64, dtype=torch.bfloat16, causal=True, seed=29),
    noncausal_head64_mask=dict(B=2, H=2, T=40, p=64, dtype=torch.float32, causal=False, masked=True, seed=30),
    causal_t1_b3=dict(B=3, H=3, T=1, p=8, dtype=torch.float32, causal=True, seed=35),
    # 9 chunks of 16 tokens scanned 4 a step (3 steps, the last part-filled), suffix and prefix
    # carries at B = 2 with a near-zero start; the whole head in one dL/dw program
    causal_scan_steps=dict(B=2, H=2, T=140, p=4, dtype=torch.float32, causal=True, seed=32, block_t=16,
                           scan_chunks=4, first_scale=0.01),
    # p a multiple of dL/dw's 16 columns but not a power of two: three column blocks, none past p
    # (a fourth, past the head, wrote into the next head's dw or out of the tensor)
    causal_p48=dict(B=1, H=5, T=30, p=48, dtype=torch.float32, causal=True, seed=36),
)
# Run again, and again with the programs of every launch in reverse order (the interpreter
# runs them first to last): the results must be the same bits. Both scan several steps a row.
REPEATED_CASES = ("causal_long_bias", "noncausal_blocks_mask")
CUDA_CASES = dict(  # model-sized, on a GPU only
    causal_bf16_base=dict(B=2, H=12, T=4100, p=64, dtype=torch.bfloat16, causal=True, seed=10),
    causal_fp32_base=dict(B=1, H=12, T=2050, p=64, dtype=torch.float32, causal=True, seed=11),
    noncausal_mask_fp16=dict(B=2, H=6, T=3000, p=64, dtype=torch.float16, causal=False, masked=True, seed=12),
    causal_bf16_p128=dict(B=1, H=4, T=1000, p=128, dtype=torch.bfloat16, causal=True, seed=13),
)


def run_triton_case(B, H, T, p, dtype, causal, seed, masked=False, layout="model", block_t=None, first_scale=1.0,
                    tiny=False, guards=None, bias_extra=5, scan_chunks=None, feature_block=None, batch_block=None,
                    partial_block=None, device="cpu"):
    """Inputs, output, Pi and gradients of one call through tssa_impl="triton" on device (on
    the CPU only under TRITON_INTERPRET=1); everything returned on the CPU. tiny: features
    under the floor (make_inputs); guards: (PI_NORM_EPS, STAT_EPS) set in model.py for the
    call; bias_extra: position bias columns past T; block_t, scan_chunks, feature_block,
    batch_block, partial_block: the kernels' BLOCK_T, SCAN_CHUNKS, FEATURE_BLOCK, BATCH_BLOCK
    and PARTIAL_BLOCK for the call (lowered, a small case crosses their steps; None: as shipped)."""
    from kernels import triton_tssa
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H * p, generator=g)
    x[:, 0] *= first_scale
    if tiny:
        x[:, :T // 2, ::4] *= 1e-7
    x = x.to(dtype)
    w = x.view(B, T, H, p).transpose(1, 2)  # the layout model.py makes
    temp = 0.5 + torch.rand(H, generator=g)
    bias = 0.3 * torch.randn(H, T + bias_extra, generator=g)
    gout = torch.randn(B, T, H * p, generator=g).to(dtype).view(B, T, H, p).transpose(1, 2)
    if layout == "contiguous":  # w contiguous as (B, H, T, p); dL/dout with stride 0 everywhere
        w = w.contiguous()
        gout = torch.randn((), generator=g).to(dtype).expand(B, H, T, p)
    mask = None
    if masked:
        mask = torch.ones(B, T, dtype=torch.bool)
        mask[0, T // 2:] = False
    leaves = [t.to(device).requires_grad_() for t in (w, temp, bias)]
    ops = kernels.ops_for("triton")
    knobs = ("BLOCK_T", "SCAN_CHUNKS", "FEATURE_BLOCK", "BATCH_BLOCK", "PARTIAL_BLOCK")
    saved = [getattr(triton_tssa, k) for k in knobs], model.PI_NORM_EPS, model.STAT_EPS
    for k, v in zip(knobs, (block_t, scan_chunks, feature_block, batch_block, partial_block)):
        setattr(triton_tssa, k, getattr(triton_tssa, k) if v is None else v)
    model.PI_NORM_EPS, model.STAT_EPS = guards or saved[1:]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "tssa_impl")  # a fallback to the reference would warn
            if causal:
                out, pi = ops.causal_tssa(leaves[0], leaves[1], leaves[2], return_pi=True)
            else:
                out, pi = ops.tssa(leaves[0], leaves[1], return_pi=True, mask=None if mask is None else mask.to(device))
            grads = torch.autograd.grad(out, leaves if causal else leaves[:2], gout.to(device))
    finally:
        for k, v in zip(knobs, saved[0]):
            setattr(triton_tssa, k, v)
        model.PI_NORM_EPS, model.STAT_EPS = saved[1:]
    to_cpu = lambda t: t.detach().cpu()
    return dict(w=w, temp=temp, bias=bias, gout=gout, mask=mask, causal=causal, guards=guards, out=to_cpu(out),
                pi=to_cpu(pi), grads=[to_cpu(t) for t in grads], node=out.grad_fn.name(), pi_grad=pi.requires_grad)


def check_triton_case(r):
    """The case's output, Pi and every gradient (dpos_bias over its whole width) against
    model.py's reference on the CPU. Returns the relative RMS errors."""
    assert r["node"] == "FusedTSSABackward" and not r["pi_grad"]  # the kernels ran; Pi detached
    w, temp, bias = (r[k].clone().requires_grad_() for k in ("w", "temp", "bias"))
    saved = model.PI_NORM_EPS, model.STAT_EPS
    model.PI_NORM_EPS, model.STAT_EPS = r["guards"] or saved
    try:
        if r["causal"]:
            out, pi = model.causal_tssa(w, temp, bias, return_pi=True)
            grads = torch.autograd.grad(out, [w, temp, bias], r["gout"])
        else:
            out, pi = model.tssa(w, temp, return_pi=True, mask=r["mask"])
            grads = torch.autograd.grad(out, [w, temp], r["gout"])
    finally:
        model.PI_NORM_EPS, model.STAT_EPS = saved
    # fp32: as FP32_TOL. bf16/fp16 outputs: one ulp (2^-8 for bf16) away from the reference's
    # rounding; the interpreter also rounds fp32 -> bf16 by truncation, not to nearest.
    errors = {}
    for name, got, want in zip(NAMES, [r["out"], r["pi"], *r["grads"]], [out, pi, *grads]):
        assert got.shape == want.shape and got.dtype == want.dtype
        errors[name] = rel_rms(got, want)
        assert errors[name] < (FP32_TOL if want.dtype == torch.float32 else BF16_TOL), (name, errors[name])
    if r["causal"]:  # past T the position bias has no gradient: zeros, as the reference's
        assert torch.all(r["grads"][2][:, r["w"].shape[2]:] == 0)
    return errors


def run_triton_steps(device="cpu"):
    """Seven fused decoding steps through tssa_impl="triton"; inputs and results on the CPU."""
    g = torch.Generator().manual_seed(5)
    B, H, p = 2, 3, 24
    temp, pos_bias = 0.5 + torch.rand(H, generator=g), torch.randn(H, 4, generator=g)
    steps = [torch.randn(B, H, p, generator=g) for _ in range(7)]
    state = model.TSSAState.zeros(B, H, p, device=device)
    steps[1][0, 0, :5] *= 1e-7  # sums of squares under the floor for the first tokens
    steps[0][0, 0, :5] *= 1e-7
    step = kernels.ops_for("triton").causal_tssa_step
    outs, pis = [], []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "tssa_impl")  # a fallback to the reference would warn
        for t, w_t in enumerate(steps):
            before = state.sum_pi.clone()
            outs.append(step(w_t.to(device), temp.to(device), pos_bias[:, min(t, 3)].to(device), state).cpu())
            pis.append((state.sum_pi - before).cpu())  # Pi: what the step adds
    return dict(temp=temp, pos_bias=pos_bias, steps=steps, out=outs, pi=pis,
                state=(state.sum_sq.cpu(), state.sum_pi_sq.cpu(), state.sum_pi.cpu()))


def check_triton_steps(r):
    B, H, p = r["steps"][0].shape
    state = model.TSSAState.zeros(B, H, p)
    for t, (w_t, out_f, pi_f) in enumerate(zip(r["steps"], r["out"], r["pi"])):
        before = state.sum_pi.clone()
        out_r = model.causal_tssa_step(w_t, r["temp"], r["pos_bias"][:, min(t, 3)], state)
        assert rel_rms(out_f, out_r) < FP32_TOL and rel_rms(pi_f, state.sum_pi - before) < FP32_TOL
    for got, want in zip(r["state"], (state.sum_sq, state.sum_pi_sq, state.sum_pi)):
        assert rel_rms(got, want) < FP32_TOL


TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch
    import test_kernels as t
    from kernels import triton_tssa
    assert triton_tssa.INTERPRET, "TRITON_INTERPRET=1 was not seen at import"
    results = {name: t.run_triton_case(**kw) for name, kw in t.TRITON_CASES.items()}
    for name in t.REPEATED_CASES:
        results[name + "/again"] = t.run_triton_case(**t.TRITON_CASES[name])
        with t.programs_in_reverse_order() as programs:
            results[name + "/reversed"] = t.run_triton_case(**t.TRITON_CASES[name])
        assert programs, "the interpreter's program order was not patched"
    results["step"] = t.run_triton_steps()
    results["counts"] = {kind: t.count_launches_and_ops(kind == "causal") for kind in ("causal", "noncausal")}
    torch.save(results, sys.argv[1])
""")


@contextlib.contextmanager
def programs_in_reverse_order():
    """Under TRITON_INTERPRET=1: run every launch's programs last to first. The interpreter
    walks the grid in order and asks its builder to set each program's index; this makes it
    hand out the mirrored index. Yields the list of indices it was asked for."""
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    asked = []

    def mirrored(x, y, z):
        asked.append(x)
        type(builder).set_grid_idx(builder, builder.grid_dim[0] - 1 - x, y, z)
    builder.set_grid_idx = mirrored
    try:
        yield asked
    finally:
        del builder.set_grid_idx


INTERPRETED = os.path.join(background.SCRATCH, "results.pt")  # TRITON_SCRIPT's results
USES_INTERPRETER = {"test_triton_kernels_match_reference", "test_triton_runs_are_bitwise_reproducible",
                    "test_triton_step_matches_reference", "test_triton_call_is_six_launches_each_way_and_nothing_else"}


def triton_missing():
    """Why the Triton tests cannot run here (None if they can)."""
    try:
        import triton  # noqa: F401  (only whether it imports)
    except ImportError:
        return "triton is not installed: `pip install triton` (its interpreter runs the kernels on CPU)"
    return None


def start_interpreter_job():
    path_var = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path_var)
    background.start("triton interpreter", [sys.executable, "-c", TRITON_SCRIPT, INTERPRETED], env=env, cwd=ROOT)


start_in_background = background.when_chosen(  # (the interpreter run, beside the other tests)
    USES_INTERPRETER, lambda: triton_missing() is None and start_interpreter_job())


@pytest.fixture(scope="module")
def triton_results():
    if triton_missing():
        pytest.skip(triton_missing())
    start_interpreter_job()  # a no-op where the session started it already
    background.succeeded("triton interpreter", timeout=600)
    return torch.load(INTERPRETED, weights_only=False)


@pytest.mark.parametrize("name", list(TRITON_CASES))
def test_triton_kernels_match_reference(triton_results, name):
    check_triton_case(triton_results[name])


@pytest.mark.parametrize("name", REPEATED_CASES)
def test_triton_runs_are_bitwise_reproducible(triton_results, name):
    """The same call twice, and with every launch's programs in reverse order: the same bits.
    No program reads what another program of its launch writes, and every sum is one
    program's, in an order fixed by the shapes."""
    first = triton_results[name]
    for again in (triton_results[name + "/again"], triton_results[name + "/reversed"]):
        for a, b in zip([first["out"], first["pi"], *first["grads"]], [again["out"], again["pi"], *again["grads"]]):
            assert torch.equal(a, b)


def test_triton_step_matches_reference(triton_results):
    check_triton_steps(triton_results["step"])


@needs_cuda
@pytest.mark.parametrize("name", list(TRITON_CASES) + list(CUDA_CASES))
def test_triton_on_cuda_matches_reference(name):
    check_triton_case(run_triton_case(**{**TRITON_CASES, **CUDA_CASES}[name], device="cuda"))


@needs_cuda
def test_triton_step_on_cuda_matches_reference():
    check_triton_steps(run_triton_steps("cuda"))


# What one TSSA call runs: Triton launches, and the PyTorch ops outside them that compute
# (views, torch.empty allocations, detach and ops that make no tensor, e.g. promote_types, do
# not). Counted under the interpreter with a
# TorchDispatchMode over aten ops; the interpreter's own copies of a launch's arguments
# happen inside the launch and are not counted.
ALLOCATIONS = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
               "aten::new_empty_strided", "aten::detach")


def count_launches_and_ops(causal):
    """{"forward" / "backward": (Triton launches as (kernel, grid), PyTorch compute ops outside
    them)} for one call of tssa_impl="triton" (B=2, H=3, T=40, p=8: three chunks of 16 tokens,
    a group each), after a first call; the launches triton_tssa.launch_plan states for that
    call ("plan"); and the ops the reference's forward runs under the same counting (the
    counting sees compute ops). dL/dw in column blocks of 4 (two a chunk here)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from kernels import triton_tssa

    class Counting(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.launches, self.ops, self.in_launch = [], [], False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            makes_tensors = any(isinstance(r, torch.Tensor) for r in torch.utils._pytree.tree_leaves(result))
            if makes_tensors and not self.in_launch and not func.is_view and func._schema.name not in ALLOCATIONS:
                self.ops.append(func._schema.name)
            return result

    counting = Counting()

    class Launcher:  # kernel[grid](...) through the kernel, recorded
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                counting.launches.append((self.name, tuple(grid)))
                counting.in_launch = True
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    counting.in_launch = False
            return launch

    kernels_ = {n: k for n, k in vars(triton_tssa).items() if n.startswith("_k_")}
    B, H, T, p = 2, 3, 40, 8
    w, temp, pos_bias, g = make_inputs(B, H, T, p)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 13:] = False
    leaves = [w, temp, pos_bias] if causal else [w, temp]
    ops = kernels.ops_for("triton")
    call = (lambda: ops.causal_tssa(w, temp, pos_bias, return_pi=True)) if causal else \
        (lambda: ops.tssa(w, temp, return_pi=True, mask=mask))
    saved = triton_tssa.BLOCK_T, triton_tssa.FEATURE_BLOCK
    triton_tssa.BLOCK_T, triton_tssa.FEATURE_BLOCK = 16, 4
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "tssa_impl")  # a fallback to the reference would warn
            call()
            for n, k in kernels_.items():
                setattr(triton_tssa, n, Launcher(n, k))
            counts = {}
            with counting:
                out, _ = call()
            counts["forward"], counting.launches, counting.ops = (counting.launches, counting.ops), [], []
            with counting:
                torch.autograd.grad(out, leaves, g)
            counts["backward"], counting.ops = (counting.launches, counting.ops), []
            with counting:
                model.causal_tssa(w, temp, pos_bias) if causal else model.tssa(w, temp, mask=mask)
            counts["reference"] = counting.ops
            plan = triton_tssa.launch_plan(B, H, T, p, w.dtype, causal, has_mask=not causal)
            counts["plan"] = [(launch["kernel"], (launch["grid"],)) for launch in plan]
    finally:
        triton_tssa.BLOCK_T, triton_tssa.FEATURE_BLOCK = saved
        for n, k in kernels_.items():
            setattr(triton_tssa, n, k)
    return counts


def test_triton_call_is_six_launches_each_way_and_nothing_else(triton_results):
    """One TSSA call through the Triton kernels, causal and non-causal (with a padding mask):
    six launches forward, six backward (two of each the scans of the carries), each over the
    grid launch_plan states (a chunk launch: a program per batch row, chunk and head, 2 x 3 x
    3 here; dL/dw's: per column block too, x 2; a scan: per row and 8 columns), and not one
    PyTorch op that computes around them (no carry scans, sums over the batch, mask copies,
    slice backward, or zeros for Pi's gradient; dpos_bias's zeros past T are an allocation)."""
    counts = triton_results["counts"]
    chunk, scan, pair_scan = (2 * 3 * 3,), (2 * 3 * 1,), (2 * 3 * 2,)  # totals of p = 8 or p + 1 columns
    for kind in ("causal", "noncausal"):
        (fwd, fwd_ops), (bwd, bwd_ops) = counts[kind]["forward"], counts[kind]["backward"]
        assert fwd == [("_k_sq_totals", chunk), ("_k_scan", scan), ("_k_u", chunk), ("_k_pi_totals", chunk),
                       ("_k_scan", pair_scan), ("_k_out", chunk)], (kind, fwd)
        assert bwd == [("_k_grad_totals", chunk), ("_k_scan", pair_scan), ("_k_pi_grad", chunk),
                       ("_k_logit_grad", chunk), ("_k_scan", scan), ("_k_grad_w", (2 * chunk[0],))], (kind, bwd)
        assert fwd + bwd == counts[kind]["plan"], kind
        assert fwd_ops == [] and bwd_ops == [], (kind, fwd_ops, bwd_ops)
        assert len(counts[kind]["reference"]) > 5  # the counting does see PyTorch's compute ops


COMPILE_MODEL_SCRIPT = textwrap.dedent("""
    import warnings
    import torch, torch._dynamo, model, kernels
    from kernels import fused, triton_tssa
    assert triton_tssa.INTERPRET
    fused.PROBE_ON_CPU = True  # the start-up probe of the custom operators runs too (T=16: not counted)
    warnings.filterwarnings("error", "tssa_impl")  # a fallback to the reference would warn
    calls = []
    forward = triton_tssa.TritonKernels.forward.__func__
    counted = lambda cls, *a, **kw: calls.append(a[0].shape[2] == 64) or forward(cls, *a, **kw)
    triton_tssa.TritonKernels.forward = classmethod(counted)
    torch.manual_seed(0)
    m = kernels.use(model.GPT(model.GPTConfig(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32)), "triton")
    idx = torch.randint(0, 50, (2, 64))
    _, loss = m(idx, idx)
    loss.backward()
    grads = [q.grad.clone() for q in m.parameters()]
    m.zero_grad()
    calls.clear()
    explained = torch._dynamo.explain(m)(idx, idx)  # the custom operators keep one graph
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    calls.clear()
    # aot_eager: Dynamo and AOTAutograd, which take the custom operators' fake and autograd
    # definitions, without Inductor's C++ build of the surrounding ops (20+ s on a CPU; on a GPU
    # the report's train_tost_triton rows compile the same model with Inductor)
    _, loss_c = torch.compile(m, backend="aot_eager")(idx, idx)
    loss_c.backward()
    assert sum(calls) == 2, f"the fused path ran {sum(calls)} times in the compiled forward, not once per layer"
    assert abs(loss_c.item() - loss.item()) < 1e-6, (loss_c.item(), loss.item())
    err = max((a - q.grad).abs().max().item() for a, q in zip(grads, m.parameters()))
    assert err < 1e-6, err  # the same kernels on both sides; compiled matmuls may round differently
    print("ok")
""")


def test_torch_compile_runs_the_fused_path(tmp_path):
    """torch.compile of a ToST model with tssa_impl="triton" runs the fused TSSA once per
    layer inside ONE graph (the kernels are custom operators: no graph break), with the
    loss and gradients of eager mode."""
    try:
        import triton  # noqa: F401
    except ImportError:
        pytest.skip("triton is not installed: `pip install triton` (its interpreter runs the kernels on CPU)")
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", COMPILE_MODEL_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@needs_cuda
def test_triton_custom_ops_pass_opcheck():
    """torch.library.opcheck: the registered schema, fake (meta) shapes and strides, autograd
    registration and AOT dispatch of the Triton custom operators that torch.compile uses."""
    import kernels.triton_ops  # noqa: F401  (registers torch.ops.nanotost.*)

    torch.manual_seed(0)
    w = torch.randn(2, 3, 70, 16, device="cuda").transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    temp = (0.5 + torch.rand(3, device="cuda")).requires_grad_()
    bias = (0.1 * torch.randn(3, 80, device="cuda")).requires_grad_()  # the whole position bias, past T
    mask = torch.arange(70, device="cuda") < torch.tensor([[70], [50]], device="cuda")  # (2, 70) bool
    op = torch.ops.nanotost.tssa_fwd.default
    torch.library.opcheck(op, (w, temp, bias, None, True, 1e-12, 1e-8))
    torch.library.opcheck(op, (w, temp, None, mask, False, 1e-24, 1e-8))
    with torch.no_grad():
        out, pi, u, cS, cMN = op(w, temp, bias, None, True, 1e-12, 1e-8)
    args = (w.detach(), torch.randn_like(out), temp.detach(), pi, u, None, cS, cMN, True, 1e-12, 1e-8, 80)
    torch.library.opcheck(torch.ops.nanotost.tssa_bwd.default, args)


MARKS_SCRIPT = r"""
import sys
import kernels
from nanotost import hub, loading, textdata, trainkit  # what the scripts import at their start
from kernels import auto, fused
kernels.owned(kernels.ops_for("torch"))  # a run of model.py's maths: nothing of Dynamo
assert "torch._dynamo" not in sys.modules, "Dynamo imported before any fused path was asked for"
assert not hasattr(fused.FusedOps._tssa, "_torchdynamo_disable")
kernels.ops_for("auto")  # the first fused path: every mark applied, as the decorators did
for fn in (fused.FusedOps._tssa, fused.FusedOps._causal_tssa, fused.FusedOps.causal_tssa_step):
    assert getattr(fn, "_torchdynamo_disable", False), fn
assert fused._triton_ready._dynamo_marked_constant and auto.triton_picked._dynamo_marked_constant
print("ok")
"""


def test_dynamo_is_imported_only_when_a_fused_path_is_asked_for():
    """torch.compiler's marks on the fused paths (disable, assume_constant_result) import Dynamo,
    1.3 s of a process's start: they are applied when tssa_impl asks for a fused path (cpu, triton,
    auto), so a script on the default maths starts without it, and every mark is in place before
    the first fused call (a fresh process: pytest has imported Dynamo)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", MARKS_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
