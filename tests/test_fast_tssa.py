"""
Tests of fast_tssa.py: every fused path against model.py's readable reference, for outputs,
Pi and every gradient (w, temperature, position bias); odd shapes; masks; zero input; the
fused decoding step; the hand-derived backward by gradcheck in float64; the Triton kernels
under TRITON_INTERPRET=1 (in a subprocess: Triton fixes interpreter mode at import), compiled
for sm_80 / sm_90 without a GPU, under torch.compile, and on a CUDA GPU when there is one (the
same cases plus model-sized ones; skipped, and reported as skipped, where there is none).

    python -m pytest -q tests/test_fast_tssa.py
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fast_tssa  # noqa: E402
import model  # noqa: E402
from fast_tssa import CKernels, TorchKernels  # noqa: E402

torch.set_num_threads(2)
HAS_C = fast_tssa.c_library() is not None
needs_c = pytest.mark.skipif(not HAS_C, reason="no C compiler with OpenMP built fast_tssa's CPU kernels (install gcc)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU: the Triton kernels are checked under the interpreter instead")
FUSED_DEVICES = [pytest.param("cpu", marks=needs_c), pytest.param("cuda", marks=needs_cuda)]  # C / Triton kernels

# Relative RMS bounds. fp32: the fused kernels sum in a different order than torch's cumsum
# (chunks, carries, head-at-a-time), so results differ by fp32 rounding accumulated over at
# most a few hundred terms: ~1e-6 relative; 2e-5 leaves headroom and still fails on any
# wrong term (a wrong gradient term is O(1) relative). bf16: one output ulp is 2^-8 = 3.9e-3.
FP32_TOL = 2e-5
BF16_TOL = 8e-3


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def make_inputs(B, H, T, p, dtype=torch.float32, seed=0):
    """w in the layout model.py makes ((B, T, H, p) memory viewed as (B, H, T, p)), a
    temperature per head, a position bias longer than T, and dL/dout in the same layout."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H * p, generator=g).to(dtype)
    w = x.view(B, T, H, p).transpose(1, 2).detach().requires_grad_()
    temp = (0.5 + torch.rand(H, generator=g)).requires_grad_()
    pos_bias = (0.3 * torch.randn(H, T + 5, generator=g)).requires_grad_()
    grad_out = torch.randn(B, T, H * p, generator=g).to(dtype).view(B, T, H, p).transpose(1, 2)
    return w, temp, pos_bias, grad_out


def run(fn, w, temp, pos_bias, grad_out, with_bias=True):
    """Output, Pi and the gradients of sum(out * grad_out) w.r.t. w, temp (and pos_bias)."""
    out, pi = fn()
    leaves = [w, temp] + ([pos_bias] if with_bias else [])
    grads = torch.autograd.grad(out, leaves, grad_out)
    return out, pi, grads


def check_causal(kernels, shape, dtype=torch.float32, tol=FP32_TOL):
    w, temp, pos_bias, g = make_inputs(*shape, dtype=dtype)
    T = shape[2]
    ref = run(lambda: model.causal_tssa(w, temp, pos_bias, return_pi=True, impl="reference"), w, temp, pos_bias, g)
    bias = pos_bias.to(torch.float32)[:, :T]
    fast = run(lambda: fast_tssa.causal_tssa(w, temp, bias, return_pi=True, kernels=kernels), w, temp, pos_bias, g)
    names = ["out", "pi", "dw", "dtemp", "dpos_bias"]
    errors = {n: rel_rms(f, r) for n, f, r in zip(names, [fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]])}
    assert all(e < tol for e in errors.values()), errors
    return errors


# -----------------------------------------------------------------------------
# the C kernels (CPU)

ODD_SHAPES = [(1, 3, 150, 24),  # T not a multiple of the chunk, p not a power of two, B*H odd
              (2, 5, 67, 7),  # several batch rows, tiny odd p
              (1, 2, 1, 5),  # a single token
              (3, 4, 300, 16)]  # more chunks than threads


@needs_c
@pytest.mark.parametrize("sequential", [True, False], ids=["one-pass", "chunked"])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_cpu_causal_matches_reference(shape, sequential, monkeypatch):
    monkeypatch.setattr(CKernels, "sequential", staticmethod(lambda *a, **k: sequential))
    check_causal(CKernels, shape)


@needs_c
@pytest.mark.parametrize("shape", [(1, 3, 150, 24), (2, 5, 67, 7)], ids=str)
def test_cpu_noncausal_with_mask_matches_reference(shape):
    w, temp, _, g = make_inputs(*shape)
    B, T = shape[0], shape[2]
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, T // 3:] = False  # the first row is padded after a third of its tokens
    for m in (None, mask):
        ref = run(lambda: model.tssa(w, temp, return_pi=True, mask=m, impl="reference"), w, temp, None, g, False)
        fast = run(lambda: fast_tssa.tssa(w, temp, return_pi=True, mask=m, kernels=CKernels), w, temp, None, g, False)
        for f, r in zip([fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]]):
            assert rel_rms(f, r) < FP32_TOL
    out, pi, (dw, _) = fast
    assert out[0, :, T // 3:].abs().max() == 0 and pi[0, :, T // 3:].abs().max() == 0  # padding takes no part
    assert dw[0, :, T // 3:].abs().max() == 0


@needs_c
def test_cpu_bf16_matches_reference():
    # statistics are fp32 on both sides; only the bf16 rounding of out and dw can differ
    check_causal(CKernels, (2, 3, 100, 16), dtype=torch.bfloat16, tol=BF16_TOL)


@pytest.mark.parametrize("kernels", [pytest.param(CKernels, marks=needs_c), TorchKernels], ids=["cpu", "torch"])
def test_all_zero_input_is_finite(kernels):
    w = torch.zeros(1, 3, 40, 8, requires_grad=True)
    temp = torch.ones(3, requires_grad=True)
    bias = torch.zeros(3, 40, requires_grad=True)
    out, pi = fast_tssa.causal_tssa(w, temp, bias, return_pi=True, kernels=kernels)
    out.backward(torch.randn_like(out))
    assert out.abs().max() == 0
    assert torch.allclose(pi, torch.full_like(pi, 1 / 3))  # no evidence: uniform over heads
    for grad in (w.grad, temp.grad, bias.grad):
        assert torch.isfinite(grad).all()
    out = fast_tssa.tssa(w.detach(), temp.detach(), kernels=kernels)
    assert out.abs().max() == 0


@needs_c
def test_cpu_kernels_ignore_a_float64_default_dtype():
    # the C kernels write fp32 through raw pointers: their buffers must not follow the default dtype
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        check_causal(CKernels, (1, 3, 150, 24))
        check_causal(CKernels, (3, 2, 40, 8))  # the one-pass path (B >= threads)
    finally:
        torch.set_default_dtype(prev)


# -----------------------------------------------------------------------------
# no C compiler, and building the C kernels


def test_no_c_compiler_falls_back_to_torch(monkeypatch, tmp_path):
    """With no usable C compiler: one warning, c_library() is None, "auto" runs model.py's
    reference, impl="fast" the PyTorch form of the fused backward, decoding the reference step."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("NANOTOST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NANOTOST_NO_C", raising=False)
    monkeypatch.setattr(fast_tssa, "_c_lib_cache", [])  # forget the library this process built
    with pytest.warns(UserWarning, match="could not build the C kernels"):
        assert fast_tssa.c_library() is None
    assert fast_tssa.c_library() is None  # tried once per process
    assert not list((tmp_path / "cache").iterdir())  # nothing half-built left behind
    w, temp, pos_bias, g = make_inputs(1, 3, 70, 8)
    assert not fast_tssa.applies(w, "softmax", "auto")
    assert fast_tssa.kernels_for(w) is (fast_tssa.TritonKernels if fast_tssa.INTERPRET else TorchKernels)
    out = model.causal_tssa(w, temp, pos_bias)
    assert out.grad_fn.name() != "FusedTSSABackward"  # the reference
    ref = run(lambda: model.causal_tssa(w, temp, pos_bias, return_pi=True, impl="reference"), w, temp, pos_bias, g)
    fast = run(lambda: model.causal_tssa(w, temp, pos_bias, return_pi=True, impl="fast"), w, temp, pos_bias, g)
    for f, r in zip([fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]]):
        assert rel_rms(f, r) < FP32_TOL
    state = model.TSSAState.zeros(1, 3, 8)
    assert not fast_tssa.step_applies(w[:, :, 0].detach(), temp.detach(), pos_bias.detach(), state)
    m = tiny_gpt().eval()
    assert m.generate(torch.zeros(1, 4, dtype=torch.long), 3, temperature=0).shape == (1, 7)


BUILD_SCRIPT = "import fast_tssa, sys; lib = fast_tssa.c_library(); print(lib._name if lib else 'NONE'); sys.exit(lib is None)"


@needs_c
def test_c_build_concurrent_and_cache_folder_fallback(tmp_path):
    """Two processes building at once into an empty cache (as torchrun ranks do) both load a
    whole library and leave one file; an unusable $NANOTOST_CACHE (here under a plain file)
    falls back to a per-user folder in the temp dir."""
    (tmp_path / "file").write_text("")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, NANOTOST_CACHE=str(tmp_path / "file" / "cache"), TMPDIR=str(tmpdir),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    env.pop("NANOTOST_NO_C", None)
    env.pop("TRITON_INTERPRET", None)
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and paths.pop().startswith(str(tmpdir / "nanotost-"))
    cache = next(tmpdir.glob("nanotost-*"))
    assert [f.suffix for f in cache.iterdir()] == [".so"]  # no temp files left behind


# -----------------------------------------------------------------------------
# the hand-derived backward, in float64


def test_backward_gradcheck_float64():
    """torch.autograd.gradcheck (finite differences, eps 1e-6, atol 1e-5, rtol 1e-3) of the
    hand-written backward shared by every back end, in its PyTorch form."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2, 3, 5, 3, dtype=torch.float64, generator=g).requires_grad_()
    temp = (0.5 + torch.rand(3, dtype=torch.float64, generator=g)).requires_grad_()
    bias = (0.3 * torch.randn(3, 5, dtype=torch.float64, generator=g)).requires_grad_()
    causal = lambda w_, t_, b_: fast_tssa.causal_tssa(w_, t_, b_, kernels=TorchKernels)
    assert torch.autograd.gradcheck(causal, (w, temp, bias))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    noncausal = lambda w_, t_: fast_tssa.tssa(w_, t_, mask=mask, kernels=TorchKernels)
    assert torch.autograd.gradcheck(noncausal, (w, temp))


def test_torch_backend_float64_equals_reference():
    # same maths in float64 on both sides: only rounding differs (~1e-15 relative)
    w, temp, pos_bias, g = make_inputs(2, 3, 33, 6, dtype=torch.float64)
    with torch.no_grad():
        temp.data, pos_bias.data = temp.double(), pos_bias.double()
    ref = run(lambda: model.causal_tssa(w, temp, pos_bias, return_pi=True, impl="reference"), w, temp, pos_bias, g)
    fast = run(lambda: fast_tssa.causal_tssa(w, temp, pos_bias[:, :33], True, kernels=TorchKernels),
               w, temp, pos_bias, g)
    for f, r in zip([fast[0], fast[1], *fast[2]], [ref[0], ref[1], *ref[2]]):
        assert rel_rms(f, r) < 1e-12


# -----------------------------------------------------------------------------
# dispatch from model.py


def test_applies_and_dispatch():
    w, temp, pos_bias, g = make_inputs(1, 3, 20, 8)
    assert not fast_tssa.applies(w, "softmax", "reference")
    assert not fast_tssa.applies(w, "uniform", "auto")  # the ablation stays on the reference
    assert not fast_tssa.applies(w.double(), "softmax", "auto")  # float64: the reference (fp64 statistics)
    assert fast_tssa.applies(w.double(), "softmax", "fast")
    with pytest.raises(ValueError, match="impl must be one of"):
        model.causal_tssa(w, temp, pos_bias, impl="fused")
    assert fast_tssa.applies(w, "softmax", "auto") == HAS_C
    out, pi = model.causal_tssa(w, temp, pos_bias, return_pi=True)
    assert (out.grad_fn.name() == "FusedTSSABackward") == HAS_C
    assert not pi.requires_grad or not HAS_C  # Pi comes back detached from the fused path
    ref = model.causal_tssa(w, temp, pos_bias, impl="reference")
    assert rel_rms(out, ref) < FP32_TOL
    out_u = model.causal_tssa(w, temp, pos_bias, pi_mode="uniform")
    assert out_u.grad_fn.name() != "FusedTSSABackward"


def tiny_gpt(**kw):
    torch.manual_seed(0)
    cfg = model.GPTConfig(block_size=64, vocab_size=97, n_layer=2, n_head=3, n_embd=48, layer_scale_init=0.5, **kw)
    return model.GPT(cfg)


@pytest.mark.parametrize("device", FUSED_DEVICES)
def test_whole_model_gradients_match_reference(device, monkeypatch):
    """A training step's loss and every parameter gradient are the same through the fused path
    as through model.py's reference (the operator sits between real projections here)."""
    m = tiny_gpt().to(device)
    idx = torch.randint(0, 97, (2, 50), generator=torch.Generator().manual_seed(0)).to(device)
    _, loss_fast = m(idx, idx)
    grads_fast = torch.autograd.grad(loss_fast, list(m.parameters()))
    monkeypatch.setattr(model, "fast_tssa", None)
    _, loss_ref = m(idx, idx)
    grads_ref = torch.autograd.grad(loss_ref, list(m.parameters()))
    assert abs(loss_fast.item() - loss_ref.item()) < 1e-6  # fp32 loss ~4.6: a few ulps
    names = [n for n, _ in m.named_parameters()]
    for name, gf, gr in zip(names, grads_fast, grads_ref):
        if gr.norm() > 0:
            assert rel_rms(gf, gr) < 1e-4, name  # through 2 layers of matmuls, still fp32 rounding


# -----------------------------------------------------------------------------
# decoding step


@needs_c
def test_fused_step_equals_reference_step(monkeypatch):
    B, H, p, T_bias = 2, 3, 24, 5
    g = torch.Generator().manual_seed(0)
    temp, pos_bias = 0.5 + torch.rand(H, generator=g), torch.randn(H, T_bias, generator=g)
    fused, ref = model.TSSAState.zeros(B, H, p), model.TSSAState.zeros(B, H, p)
    for t in range(T_bias + 3):  # past the end of the bias: the last one is reused
        w_t = torch.randn(B, H, p, generator=g)
        assert fast_tssa.step_applies(w_t, temp, pos_bias, fused)
        out_f, _, pi_f = model.causal_tssa_step(w_t, temp, pos_bias, fused, return_pi=True)
        with monkeypatch.context() as mp:
            mp.setattr(model, "fast_tssa", None)
            out_r, _, pi_r = model.causal_tssa_step(w_t, temp, pos_bias, ref, return_pi=True)
        assert rel_rms(out_f, out_r) < FP32_TOL and rel_rms(pi_f, pi_r) < FP32_TOL
    for a, b in ((fused.sum_sq, ref.sum_sq), (fused.sum_pi_sq, ref.sum_pi_sq), (fused.sum_pi, ref.sum_pi)):
        assert rel_rms(a, b) < FP32_TOL
    assert fused.pos == ref.pos == T_bias + 3
    # a step that needs gradients is left to the reference
    assert not fast_tssa.step_applies(w_t, temp.requires_grad_(), pos_bias, fused)


@pytest.mark.parametrize("device", FUSED_DEVICES)
def test_generation_same_tokens_fused_and_reference(device, monkeypatch):
    m = tiny_gpt().eval().to(device)
    prompt = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(1)).to(device)
    fused = m.generate(prompt, 12, temperature=0)
    monkeypatch.setattr(model, "fast_tssa", None)
    ref = m.generate(prompt, 12, temperature=0)
    assert torch.equal(fused, ref)


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
    # 18 chunks of 16 tokens: the carry kernel walks its 16-chunk blocks twice. A small first
    # token makes the first chunk's total of dL/dS huge: an exclusive scan computed as
    # (inclusive - own total) then lost the later chunks' carries (dw off by 4e-3, not 3e-6)
    causal_many_chunks=dict(B=1, H=4, T=280, p=4, dtype=torch.float32, causal=True, seed=8, block_t=16,
                            first_scale=0.01),
    noncausal_many_chunks=dict(B=1, H=3, T=280, p=4, dtype=torch.float32, causal=False, masked=True, seed=9,
                               block_t=16),
)
CUDA_CASES = dict(  # model-sized, on a GPU only
    causal_bf16_base=dict(B=2, H=12, T=4100, p=64, dtype=torch.bfloat16, causal=True, seed=10),
    causal_fp32_base=dict(B=1, H=12, T=2050, p=64, dtype=torch.float32, causal=True, seed=11),
    noncausal_mask_fp16=dict(B=2, H=6, T=3000, p=64, dtype=torch.float16, causal=False, masked=True, seed=12),
    causal_bf16_p128=dict(B=1, H=4, T=1000, p=128, dtype=torch.bfloat16, causal=True, seed=13),
)


def run_triton_case(B, H, T, p, dtype, causal, seed, masked=False, layout="model", block_t=64, first_scale=1.0,
                    device="cpu"):
    """Inputs, output, Pi and gradients of one call through fast_tssa.TritonKernels on device
    (on the CPU only under TRITON_INTERPRET=1); everything returned on the CPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H * p, generator=g)
    x[:, 0] *= first_scale
    x = x.to(dtype)
    w = x.view(B, T, H, p).transpose(1, 2)  # the layout model.py makes
    temp = 0.5 + torch.rand(H, generator=g)
    bias = 0.3 * torch.randn(H, T + 5, generator=g)  # sliced to T, as the model passes it
    gout = torch.randn(B, T, H * p, generator=g).to(dtype).view(B, T, H, p).transpose(1, 2)
    if layout == "contiguous":  # w contiguous as (B, H, T, p); dL/dout with stride 0 everywhere
        w = w.contiguous()
        gout = torch.randn((), generator=g).to(dtype).expand(B, H, T, p)
    mask = None
    if masked:
        mask = torch.ones(B, T, dtype=torch.bool)
        mask[0, T // 2:] = False
    leaves = [t.to(device).requires_grad_() for t in (w, temp, bias)]
    saved_block, fast_tssa.BLOCK_T = fast_tssa.BLOCK_T, block_t
    try:
        if causal:
            out, pi = fast_tssa.causal_tssa(leaves[0], leaves[1], leaves[2][:, :T], return_pi=True,
                                            kernels=fast_tssa.TritonKernels)
            grads = torch.autograd.grad(out, leaves, gout.to(device))
        else:
            out, pi = fast_tssa.tssa(leaves[0], leaves[1], return_pi=True, mask=None if mask is None else mask.to(device),
                                     kernels=fast_tssa.TritonKernels)
            grads = torch.autograd.grad(out, leaves[:2], gout.to(device))
    finally:
        fast_tssa.BLOCK_T = saved_block
    cpu = lambda t: t.detach().cpu()
    return dict(w=w, temp=temp, bias=bias, gout=gout, mask=mask, causal=causal, out=cpu(out), pi=cpu(pi),
                grads=[cpu(t) for t in grads])


def check_triton_case(r):
    """The case's output, Pi and every gradient against model.py's reference on the CPU."""
    w, temp, bias = (r[k].clone().requires_grad_() for k in ("w", "temp", "bias"))
    if r["causal"]:
        out, pi = model.causal_tssa(w, temp, bias[:, :w.shape[2]], return_pi=True, impl="reference")
        grads = torch.autograd.grad(out, [w, temp, bias], r["gout"])
    else:
        out, pi = model.tssa(w, temp, return_pi=True, mask=r["mask"], impl="reference")
        grads = torch.autograd.grad(out, [w, temp], r["gout"])
    # fp32: as FP32_TOL. bf16/fp16 outputs: one ulp (2^-8 for bf16) away from the reference's
    # rounding; the interpreter also rounds fp32 -> bf16 by truncation, not to nearest.
    for got, want in zip([r["out"], r["pi"], *r["grads"]], [out, pi, *grads]):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert rel_rms(got, want) < (FP32_TOL if want.dtype == torch.float32 else BF16_TOL)


def run_triton_steps(device="cpu"):
    """Seven fused decoding steps through TritonKernels.step; inputs and results on the CPU."""
    g = torch.Generator().manual_seed(5)
    B, H, p = 2, 3, 24
    temp, pos_bias = 0.5 + torch.rand(H, generator=g), torch.randn(H, 4, generator=g)
    steps = [torch.randn(B, H, p, generator=g) for _ in range(7)]
    state = model.TSSAState.zeros(B, H, p, device=device)
    outs = [fast_tssa.causal_tssa_step(w_t.to(device), temp.to(device), pos_bias.to(device), state, True,
                                       kernels=fast_tssa.TritonKernels) for w_t in steps]
    return dict(temp=temp, pos_bias=pos_bias, steps=steps, out=[o.cpu() for o, _, _ in outs],
                pi=[q.cpu() for _, _, q in outs],
                state=(state.sum_sq.cpu(), state.sum_pi_sq.cpu(), state.sum_pi.cpu(), state.pos))


def check_triton_steps(r):
    B, H, p = r["steps"][0].shape
    state = model.TSSAState.zeros(B, H, p)
    for w_t, out_f, pi_f in zip(r["steps"], r["out"], r["pi"]):
        out_r, _, pi_r = _reference_step(w_t, r, state)
        assert rel_rms(out_f, out_r) < FP32_TOL and rel_rms(pi_f, pi_r) < FP32_TOL
    for got, want in zip(r["state"][:3], (state.sum_sq, state.sum_pi_sq, state.sum_pi)):
        assert rel_rms(got, want) < FP32_TOL
    assert r["state"][3] == state.pos == len(r["steps"])


def _reference_step(w_t, r, state):
    """model.causal_tssa_step with the fused step switched off."""
    saved, model.fast_tssa = model.fast_tssa, None
    try:
        return model.causal_tssa_step(w_t, r["temp"], r["pos_bias"], state, return_pi=True)
    finally:
        model.fast_tssa = saved


TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch
    import test_fast_tssa as t
    assert t.fast_tssa.INTERPRET, "TRITON_INTERPRET=1 was not seen at import"
    results = {name: t.run_triton_case(**kw) for name, kw in t.TRITON_CASES.items()}
    results["step"] = t.run_triton_steps()
    torch.save(results, sys.argv[1])
""")


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    try:
        import triton  # noqa: F401  (only whether it imports)
    except ImportError:
        pytest.skip("triton is not installed: `pip install triton` (its interpreter runs the kernels on CPU)")
    path = tmp_path_factory.mktemp("triton") / "results.pt"
    path_var = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path_var)
    proc = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("name", list(TRITON_CASES))
def test_triton_kernels_match_reference(triton_results, name):
    check_triton_case(triton_results[name])


def test_triton_step_matches_reference(triton_results):
    check_triton_steps(triton_results["step"])


@needs_cuda
@pytest.mark.parametrize("name", list(TRITON_CASES) + list(CUDA_CASES))
def test_triton_on_cuda_matches_reference(name):
    assert fast_tssa.kernels_for(torch.empty(1, 1, 1, 1, device="cuda")) is fast_tssa.TritonKernels
    check_triton_case(run_triton_case(**{**TRITON_CASES, **CUDA_CASES}[name], device="cuda"))


@needs_cuda
def test_triton_step_on_cuda_matches_reference():
    check_triton_steps(run_triton_steps("cuda"))


COMPILE_MODEL_SCRIPT = textwrap.dedent("""
    import torch, fast_tssa, model
    assert fast_tssa.INTERPRET
    calls = []
    forward = fast_tssa.TritonKernels.forward.__func__
    fast_tssa.TritonKernels.forward = classmethod(lambda cls, *a: calls.append(1) or forward(cls, *a))
    torch.manual_seed(0)
    m = model.GPT(model.GPTConfig(block_size=64, vocab_size=50, n_layer=2, n_head=2, n_embd=32))
    idx = torch.randint(0, 50, (2, 64))
    _, loss = m(idx, idx)
    loss.backward()
    grads = [q.grad.clone() for q in m.parameters()]
    m.zero_grad()
    calls.clear()
    _, loss_c = torch.compile(m)(idx, idx)
    loss_c.backward()
    assert len(calls) == 2, f"the fused path ran {len(calls)} times in the compiled forward, not once per layer"
    assert abs(loss_c.item() - loss.item()) < 1e-6, (loss_c.item(), loss.item())
    err = max((a - q.grad).abs().max().item() for a, q in zip(grads, m.parameters()))
    assert err < 1e-6, err  # the same kernels on both sides; compiled matmuls may round differently
    print("ok")
""")


def test_torch_compile_runs_the_fused_path(tmp_path):
    """torch.compile of a ToST model runs the fused TSSA between compiled graphs (Dynamo traced
    into the Triton interpreter and failed before fast_tssa's entry points were excluded)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        pytest.skip("triton is not installed: `pip install triton` (its interpreter runs the kernels on CPU)")
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", COMPILE_MODEL_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# -----------------------------------------------------------------------------
# The Triton kernels compiled for real GPUs (no GPU needed): Triton's own compiler and ptxas,
# ahead of time, for each kernel as TritonKernels launches it. The interpreter above checks the
# maths but not what only the GPU compiler sees (types, layouts, unsupported ops); this checks
# that every kernel builds for A100 (sm_80) and H100 (sm_90) at head widths 24, 64 and 128,
# and that none spills registers to local memory (cuobjdump's STACK column), which would cost
# the memory traffic the kernels exist to save (128-wide tiles of 64 tokens did spill).

COMPILE_SCRIPT = textwrap.dedent("""
    import json, os, re, subprocess, sys, tempfile
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import fast_tssa as F
    assert not F.INTERPRET
    BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    TYPES = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}

    def compile_kernel(kernel, dtype, consts, num_warps, arch):
        # pointer arguments: w, g, out and dw in the input dtype, every other buffer fp32
        sig = {n: "constexpr" if n in consts else ((TYPES[dtype] if n in ("w_ptr", "g_ptr", "out_ptr", "gw_ptr")
               else "*fp32") if n.endswith("_ptr") else "i32") for n in kernel.arg_names}
        ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts),
                            target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps))
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(ck.asm["cubin"])
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        os.unlink(f.name)
        return int(re.search(r"REG:(\\d+)", usage).group(1)), int(re.search(r"STACK:(\\d+)", usage).group(1))

    def launches(p, causal):  # (kernel, constexprs, warps) as TritonKernels launches them
        m = F.TritonKernels.meta(p)
        tile = dict(BT=m["BT"], P=m["P"])
        c = dict(CAUSAL=causal, **tile)
        yield "_k_sum_q", tile, m["num_warps"]
        yield "_k_stats_pi", dict(HAS_BIAS=causal, HAS_MASK=not causal, **c), m["num_warps"]
        yield "_k_apply", c, m["num_warps"]
        yield "_k_sum_gm", c, m["num_warps"]
        yield "_k_grad_pi", dict(HAS_MASK=not causal, **c), m["num_warps"]
        yield "_k_grad_w", c, m["num_warps"]
        yield "_k_carry", dict(MODE=0 if causal else 2, CB=16, WB=128), 4
        yield "_k_carry", dict(MODE=1, CB=16, WB=128), 4
        yield "_k_step", dict(HP=16, P=m["P"]), 4

    rows = []
    for arch, dtype, p, causal in [(90, "bf16", 64, True), (90, "bf16", 64, False), (90, "fp32", 64, True),
                                   (90, "fp16", 24, False), (90, "bf16", 128, True), (80, "bf16", 64, True)]:
        for name, consts, warps in launches(p, causal):
            regs, stack = compile_kernel(getattr(F, name), dtype, consts, warps, arch)
            rows.append(dict(arch=arch, dtype=dtype, p=p, causal=causal, kernel=name, regs=regs, stack=stack))
    json.dump(rows, open(sys.argv[1], "w"))
""")


def test_triton_kernels_compile_for_gpus(tmp_path):
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError:
        pytest.skip("triton is not installed (requirements-dev.txt installs it on Linux x86-64)")
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")):
        pytest.skip("this triton build has no NVIDIA back end (ptxas, cuobjdump)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    out = tmp_path / "usage.json"
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 6 * 9 and all(r["regs"] > 0 for r in rows)
    spilling = [r for r in rows if r["stack"] > 0]
    assert not spilling, f"kernels spill registers: {spilling}"
