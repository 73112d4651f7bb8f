"""
Tests of the cheaper Triton operator call (kernels/triton_launch.py; issue 52): the memoised call plans
of TritonKernels and RetiledKernels equal the plans computed afresh, at many shapes and after a knob
changes; a forward and backward allocate what the design says (3 + 4 for the causal form, where there
were 17) and nothing else runs around the launches; the workspace views are 16-byte aligned and do not
overlap, and out and dw keep w's dtype and strides; the direct launches' key is at least as fine as
Triton's own specialization (checked against the JIT's native specializer, under the default Triton and
the GPU machines' 3.6), and changing any argument the JIT specializes on misses; a kept kernel is
launched with the arguments in the JIT's order, and every case the direct path must not take (the
interpreter, a wrapped kernel, an unknown Triton, a changed global, a launch that raised) goes through
kernel[grid]. Under TRITON_INTERPRET=1 (a subprocess) a call through both kernel classes matches the
reference with nothing kept for direct launches. No GPU: the launches here are recorded, not run, and
the interpreter runs the kernels (tests/test_kernels.py and tests/test_triton_retiled.py check every
output and gradient there).

    python -m pytest -q tests/test_triton_launch.py
"""

import itertools
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

pytest.importorskip("triton", reason="triton is not installed")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.compiler import CompiledKernel  # noqa: E402

from kernels import triton_launch, triton_retiled, triton_tssa  # noqa: E402
from kernels.triton_launch import key, spec_key  # noqa: E402

# what makes a tensor (aten ops); views and ops that make none are not counted
ALLOCATIONS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
               "aten::new_empty_strided", "aten::zeros", "aten::zeros_like", "aten::clone", "aten::_to_copy"}


@pytest.fixture(autouse=True)
def fresh_launches():
    """No kept kernel and the direct path on, before and after each test."""
    triton_launch.forget()
    yield
    triton_launch.forget()


# -----------------------------------------------------------------------------
# The memoised plans


def fresh_sequence(plan):
    """The grids of a launch_plan in its order."""
    return [(launch["kernel"], (launch["grid"],)) for launch in plan]


def today_sequence(call, scan):
    """The grids TritonKernels launches, in order, from its memoised CallPlan."""
    g = call.grid
    return [("_k_sq_totals", g), (scan, call.scans["tS"][0]), ("_k_u", g), ("_k_pi_totals", g),
            (scan, call.scans["tMN"][0]), ("_k_out", g), ("_k_grad_totals", g), (scan, call.scans["tG"][0]),
            ("_k_pi_grad", g), ("_k_logit_grad", g), (scan, call.scans["tGS"][0]), ("_k_grad_w", call.dw_grid)]


SHAPES = [(B, H, T, p) for B, H, T, p in itertools.product((1, 3, 16), (1, 3, 12, 17), (1, 15, 40, 1024, 4097),
                                                           (8, 24, 48, 64, 128))
          if B * T <= 16 * 4097]


def test_todays_memoised_plans_equal_the_plans_computed_afresh():
    """At 300 shapes, causal and not, with a mask and without: the memoised CallPlan holds exactly
    TritonKernels.plan's constexprs and warps and geometry's cut; its launches' grids, in order, are
    launch_plan's (which tests/test_kernels.py holds the interpreter's launches to); its workspaces
    hold the shapes forward returns (shapes(), which the custom operator's fake takes). A second call
    is the same object (memoised); a lowered knob gives the plan of the knob as it is now."""
    triton_tssa.call_plan.cache_clear()
    for (B, H, T, p), (causal, has_mask) in itertools.product(SHAPES, ((True, False), (False, True), (False, False))):
        call = triton_tssa.call_plan(B, H, T, p, causal, has_mask, triton_tssa.knob_values())
        assert call.plan == triton_tssa.TritonKernels.plan(p, H, causal, has_mask, T)
        assert call.geo == triton_tssa.geometry(T, p)
        fresh = triton_tssa.launch_plan(B, H, T, p, torch.bfloat16, causal, has_mask)
        assert today_sequence(call, "_k_scan") == fresh_sequence(fresh), (B, H, T, p, causal)
        rows, cS, cMN = triton_tssa.TritonKernels.shapes(torch.empty(B, H, T, p, device="meta"), causal)
        assert [v[0] for v in call.saved[1]] == [rows, rows, cS, cMN]
        for name, (grid, meta, (nC, W)) in call.scans.items():  # as the launch computed them
            mode = "prefix" if name in ("tS", "tMN") else "suffix"
            assert meta == triton_tssa.scan_meta(call.geo, mode, causal) and nC == call.geo["nC"]
            assert grid == (B * H * triton.cdiv(W, call.geo["SB"]),) and W == p + (name in ("tMN", "tG"))
    again = triton_tssa.call_plan(16, 12, 1024, 64, True, False, triton_tssa.knob_values())
    assert again is triton_tssa.call_plan(16, 12, 1024, 64, True, False, triton_tssa.knob_values())
    assert triton_tssa.call_plan.cache_info().hits >= 1


def test_a_lowered_knob_is_a_new_plan_not_the_memoised_one(monkeypatch):
    shipped = triton_tssa.call_plan(2, 3, 40, 8, True, False, triton_tssa.knob_values())
    monkeypatch.setattr(triton_tssa, "BLOCK_T", 16)  # as the interpreter tests lower it
    monkeypatch.setattr(triton_tssa, "FEATURE_BLOCK", 4)
    lowered = triton_tssa.call_plan(2, 3, 40, 8, True, False, triton_tssa.knob_values())
    assert lowered.geo == triton_tssa.geometry(40, 8) != shipped.geo
    assert lowered.plan == triton_tssa.TritonKernels.plan(8, 3, True, False, 40) != shipped.plan
    assert today_sequence(lowered, "_k_scan") == fresh_sequence(triton_tssa.launch_plan(2, 3, 40, 8))


def test_retiled_memoised_plans_equal_the_plans_computed_afresh(monkeypatch):
    """The re-tiled CallPlan at the same shapes, bf16, fp16 and fp32: whether the kernels apply, and
    where they do their plan, geometry, the grids of launch_plan in order, and the workspaces' shapes;
    a lowered BLOCK_T is a new plan."""
    tr = triton_retiled
    for (B, H, T, p), dtype in itertools.product(SHAPES, (torch.bfloat16, torch.float16, torch.float32)):
        call = tr.call_plan(B, H, T, p, dtype, tr.knob_values())
        assert call.applies == tr.applies(H, p, True, dtype)
        if not call.applies:
            continue
        assert call.plan == tr.RetiledKernels.plan(p, H, True, False, T, dtype)
        assert call.geo == tr.geometry(T, p, H, dtype)
        g, s = call.grid, {name: scan[0] for name, scan in call.scans.items()}
        ours = [("_r_sq_totals", g), ("_r_scan", s["tS"]), ("_r_pi", g), ("_r_scan", s["tMN"]), ("_r_out", g),
                ("_r_grad_totals", g), ("_r_scan", s["tG"]), ("_r_logit_grad", g), ("_r_scan", s["tGS"]),
                ("_r_grad_w", g)]
        assert ours == fresh_sequence(tr.launch_plan(B, H, T, p, dtype)), (B, H, T, p, dtype)
        rows, cS, cMN = tr.RetiledKernels.shapes(torch.empty(B, H, T, p, device="meta", dtype=dtype), True)
        assert [v[0] for v in call.saved[1]] == [rows, rows, cS, cMN]
    shipped = tr.call_plan(2, 3, 40, 16, torch.float32, tr.knob_values())
    monkeypatch.setattr(tr, "BLOCK_T", 8)
    lowered = tr.call_plan(2, 3, 40, 16, torch.float32, tr.knob_values())
    assert lowered.geo["nC"] == 5 != shipped.geo["nC"] and lowered.geo == tr.geometry(40, 16, 3, torch.float32)


# -----------------------------------------------------------------------------
# What a call allocates (the launches recorded, not run: CPU tensors, no interpreter)


class Recorder:
    """kernel[grid](*args, **meta) recorded: (name, grid, args, meta)."""

    def __init__(self, name, launches):
        self.name, self.launches = name, launches

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launches.append((self.name, grid, args, meta))


def counted(module, names, monkeypatch):
    """Replace module's kernels by Recorders; a TorchDispatchMode that lists the ops a call runs
    (allocations apart from the rest; views not listed). Returns (launches, mode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.allocations, self.others = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            makes = any(isinstance(r, torch.Tensor) for r in torch.utils._pytree.tree_leaves(result))
            if makes and not func.is_view:
                (self.allocations if func._schema.name in ALLOCATIONS else self.others).append(func._schema.name)
            return result

    launches = []
    for name in names:
        monkeypatch.setattr(module, name, Recorder(name, launches))
    return launches, Ops()


def inputs(B=2, H=3, T=40, p=16, dtype=torch.bfloat16, layout="model", causal=True):
    """w and dL/dout as model.py's heads of a (B, T, H p) projection, or contiguous; temp; the
    whole position bias (causal) or a padding mask."""
    make = (lambda: torch.randn(B, T, H * p).to(dtype).view(B, T, H, p).transpose(1, 2)) if layout == "model" \
        else (lambda: torch.randn(B, H, T, p).to(dtype))
    w, g = make(), make()
    bias = torch.randn(H, T + 5) if causal else None
    mask = None if causal else torch.arange(T) < torch.tensor([[T], [T // 2]])
    return w, g, torch.rand(H) + 0.5, bias, mask


def byte_ranges(tensors):
    """(start, end) of each distinct fp32 tensor's bytes."""
    seen = {}
    for t in tensors:
        seen[(t.data_ptr(), t.shape)] = (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
    return sorted(seen.values())


def check_workspace(launches, w):
    """Every fp32 tensor the launches take starts 16 bytes aligned, and no two overlap (w, g, out,
    dw, the bias and mask are not fp32 here; temp is, on its own)."""
    views = [a for _, _, args, _ in launches for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.float32]
    assert all(t.data_ptr() % 16 == 0 for t in views)
    ranges = byte_ranges(views)
    assert all(end <= start for (_, end), (start, _) in zip(ranges, ranges[1:])), ranges


@pytest.mark.parametrize("layout", ["model", "contiguous"])
@pytest.mark.parametrize("causal", [True, False])
def test_todays_call_allocates_three_then_four_tensors_and_runs_nothing_else(monkeypatch, layout, causal):
    """TritonKernels: forward allocates out, one block for Pi, u and the carries (kept for the
    backward), one for the chunk totals (3, where it allocated 7); backward dw, dtemp, dpos_bias
    (causal) and one block for the rest (4, or 3 non-causal, where it allocated 10); out and dw have
    w's dtype and strides; Pi, u and the carries share one storage; apart=True (the custom operator)
    gives each its own. The twelve launches happen, and no other op."""
    launches, ops = counted(triton_tssa, triton_tssa.KERNELS, monkeypatch)
    w, g, temp, bias, mask = inputs(layout=layout, causal=causal)
    eps = (1e-6, 1e-8)
    with ops:
        out, pi, u, saved = triton_tssa.TritonKernels.forward(w, temp, bias, mask, causal, eps)
    assert len(ops.allocations) == 3 and ops.others == [], (ops.allocations, ops.others)
    assert out.dtype == w.dtype and out.stride() == w.stride() and out.shape == w.shape
    storages = {t.untyped_storage().data_ptr() for t in (pi, u, *saved)}
    assert len(storages) == 1 and pi.shape == u.shape == (2, 3, 40)
    check_workspace(launches, w)
    assert [name for name, *_ in launches] == list(triton_tssa.FORWARD)
    ops.allocations.clear()
    with ops:
        gw, dtemp, dbias = triton_tssa.TritonKernels.backward(w, g, temp, pi, u, mask, saved, causal, eps, 45)
    assert len(ops.allocations) == (4 if causal else 3) and ops.others == [], (ops.allocations, ops.others)
    assert gw.dtype == w.dtype and gw.stride() == w.stride()
    assert dtemp.shape == (3,) and (dbias.shape == (3, 45) if causal else dbias is None)
    assert dtemp.untyped_storage().data_ptr() != (dbias if causal else gw).untyped_storage().data_ptr()
    check_workspace(launches[6:], w)
    assert [name for name, *_ in launches[6:]] == list(triton_tssa.BACKWARD)
    ops.allocations.clear()
    with ops:
        _, pi, u, saved = triton_tssa.TritonKernels.forward(w, temp, bias, mask, causal, eps, apart=True)
    assert len(ops.allocations) == 6 and len({t.untyped_storage().data_ptr() for t in (pi, u, *saved)}) == 4


def test_retiled_call_allocates_three_then_four_tensors_and_runs_nothing_else(monkeypatch):
    """RetiledKernels' causal call, as today's: 3 allocations forward, 4 backward, no other op; out and
    dw with w's dtype and strides; the fp32 tensors its ten launches take aligned and apart."""
    tr = triton_retiled
    launches, ops = counted(tr, tr.KERNELS, monkeypatch)
    w, g, temp, bias, _ = inputs(p=16)
    eps = (1e-6, 1e-8)
    with ops:
        out, pi, u, saved = tr.RetiledKernels.forward(w, temp, bias, None, True, eps)
    assert len(ops.allocations) == 3 and ops.others == [], (ops.allocations, ops.others)
    assert out.stride() == w.stride() and len({t.untyped_storage().data_ptr() for t in (pi, u, *saved)}) == 1
    with ops:
        gw, dtemp, dbias = tr.RetiledKernels.backward(w, g, temp, pi, u, None, saved, True, eps, 45)
    assert len(ops.allocations) == 3 + 4 and ops.others == [], (ops.allocations, ops.others)
    assert gw.stride() == w.stride() and dbias.shape == (3, 45)
    assert [name for name, *_ in launches] == list(tr.FORWARD + tr.BACKWARD)
    check_workspace(launches[:5], w)
    check_workspace(launches[5:], w)


def test_layouts_are_aligned_and_apart():
    """layout(): each view 16 bytes aligned, after the end of the one before; carve() makes them of one
    allocation (or, apart, of one each), with the shapes asked for, contiguous."""
    values, views = triton_launch.layout((2, 3, 5), (7,), (1,), (0,), (4, 4))
    offsets = [at for _, _, at in views]
    assert offsets == [0, 32, 40, 44, 44] and values == 60
    tensors = triton_launch.carve((values, views), "cpu")
    assert [t.shape for t in tensors] == [(2, 3, 5), (7,), (1,), (0,), (4, 4)]
    assert all(t.is_contiguous() for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    apart = triton_launch.carve((values, views), "cpu", apart=True)
    assert len({t.untyped_storage().data_ptr() for t in apart}) == 5


# -----------------------------------------------------------------------------
# The key of a direct launch


@triton.jit
def _tiny(x_ptr, n, y_ptr, BT: tl.constexpr, P: tl.constexpr):
    """A kernel for the key and its parameters' order (never launched here)."""
    tl.store(y_ptr + tl.arange(0, BT), tl.load(x_ptr + tl.arange(0, BT)) * n + P)


def base_args():
    x = torch.empty(64)
    return (x, 2, torch.empty(64, dtype=torch.bfloat16)), dict(BT=16, P=8, num_warps=4)


def test_the_key_misses_on_every_change_the_jit_specializes_on():
    """key(): an int becoming 1, a multiple of 16, or 64-bit; a tensor's dtype or 16-byte alignment; a
    tensor becoming None or an int a float; a constexpr, an option (num_warps), the device, the kernel:
    each a new key. What the JIT does not specialize on (an int's value within its class, another
    tensor of the same dtype and alignment, a float's value) keeps the key: the kept kernels stay few."""
    (x, n, y), meta = base_args()
    fn = _tiny
    base = key(fn, 0, (x, n, y), meta)
    changed = [key(fn, 0, (x, 1, y), meta), key(fn, 0, (x, 16, y), meta), key(fn, 0, (x, 2 ** 31 + 2, y), meta),
               key(fn, 0, (x, 2.0, y), meta), key(fn, 0, (x.to(torch.float16), n, y), meta),
               key(fn, 0, (x[1:], n, y), meta), key(fn, 0, (None, n, y), meta), key(fn, 0, (x, True, y), meta),
               key(fn, 0, (x, n, y), dict(meta, BT=32)), key(fn, 0, (x, n, y), dict(meta, num_warps=8)),
               key(fn, 0, (x, n, y), dict(meta, maxnreg=128)), key(fn, 1, (x, n, y), meta),
               key(triton_tssa._k_scan, 0, (x, n, y), meta)]
    assert len({base, *changed}) == 1 + len(changed)
    same = [key(fn, 0, (x, 3, y), meta), key(fn, 0, (torch.empty(64), 7, y), meta), key(fn, 0, (x[4:], n, y), meta)]
    assert all(k == base for k in same)
    assert key(fn, 0, (x, n, [y]), meta) is None  # a list: no key, the normal launch
    assert spec_key((0.5,)) == spec_key((1e-6,)) != spec_key((1,)) != spec_key((2,))


ORACLE_SCRIPT = textwrap.dedent("""
    import sys, torch, triton
    sys.path.insert(0, sys.argv[1])
    import test_triton_launch as t
    print(triton.__version__, t.coarser_than_the_key())
""")


def corpus():
    """Arguments of every kind the kernels pass, at the edges of the JIT's classes."""
    ints = [0, 1, 2, 3, 15, 16, 17, 32, 48, -1, -16, -17, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16, -2 ** 31,
            -2 ** 31 - 1, -2 ** 31 - 16, 2 ** 63 - 16, 2 ** 63 - 1, 2 ** 63, 2 ** 63 + 16, 2 ** 64 - 16, 2 ** 64 - 1]
    base = torch.empty(64)
    tensors = [base.to(dtype)[k:] for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.bool, torch.int64)
               for k in (0, 1, 2, 4, 8, 16)]
    return ints + tensors + [0.0, 1.0, 1e-6, -2.5, True, False, None]


def coarser_than_the_key():
    """The pairs of the corpus that spec_key puts under one key and the JIT's own specializer (the one
    its binder calls for every launch, for an sm_90 target) does not: none where the key is sound."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    backend = make_backend(GPUTarget("cuda", 90, 32))
    spec = lambda a: native_specialize_impl(backend, a, False, True, True)  # noqa: E731 (as the binder calls it)
    values = corpus()
    return [(repr(a), repr(b)) for a, b in itertools.combinations(values, 2)
            if spec_key((a,)) == spec_key((b,)) and spec(a) != spec(b)]


def test_the_key_is_at_least_as_fine_as_the_jits_specialization_under_both_tritons():
    """Over a corpus of ints at the edges of the JIT's classes, tensors of five dtypes at six
    alignments, floats, bools and None: two arguments under one spec_key are one specialization for the
    JIT's own specializer, under the default Triton here and under the GPU machines' 3.6 (a
    subprocess with it first on the path; skipped where NANOTOST_GPU_TRITON_DIR is not set)."""
    pytest.importorskip("triton._C.libtriton", reason="no compiled Triton")
    assert coarser_than_the_key() == []
    side = os.environ.get("NANOTOST_GPU_TRITON_DIR")
    if not side:
        pytest.skip("NANOTOST_GPU_TRITON_DIR is not set: the GPU machines' Triton is checked where it is")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([side, ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", ORACLE_SCRIPT, os.path.join(ROOT, "tests")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["3.6.0", "[]"], proc.stdout


# -----------------------------------------------------------------------------
# The direct launch, with a stand-in kernel (no GPU)


class StandIn:
    """A JIT kernel's stand-in: kernel[grid](...) goes through the JIT (recorded) and returns what
    `returns` says: a loaded CompiledKernel whose launcher (`launcher`, by default one that records its
    call) is the direct path's, one not loaded yet (no function handle), or nothing (a warm-up)."""

    def __init__(self, record):
        self.arg_names, self.debug, self.used_global_vals, self.pre_run_hooks = ["x", "n", "y", "BT", "P"], None, {}, []
        self.record, self.returns, self.launcher = record, "loaded", lambda *a: record.append(("direct", *a))

    def __getitem__(self, grid):
        def through_the_jit(*args, **meta):
            self.record.append(("jit", grid, args, meta))
            if self.returns == "nothing":
                return None
            compiled = CompiledKernel.__new__(CompiledKernel)  # as the JIT returns it
            compiled._run, compiled.packed_metadata, compiled.module = self.launcher, "packed", None
            compiled.function = "function" if self.returns == "loaded" else None
            return compiled
        return through_the_jit


@pytest.fixture
def stand_in(monkeypatch):
    record = []
    fn = StandIn(record)
    monkeypatch.setattr(triton_launch, "plain_jit", lambda f: f is fn)
    return fn, record


def test_a_kept_kernel_is_launched_directly_with_the_jits_argument_order(stand_in, monkeypatch):
    """The first launch goes through the JIT; the next with the same specialization calls the kept
    kernel's launcher: grid as three dimensions, the call's stream, the function and metadata, no
    launch metadata and no hooks (Triton's hook chains are empty), then every parameter in the kernel's
    order (the constexprs BT, P after the positional ones, whatever order meta gives them in); with a
    launch hook, the hook and the metadata the JIT would give it."""
    fn, record = stand_in
    (x, n, y), _ = base_args()
    triton_launch.launch(fn, (6,), (x, n, y), dict(P=8, BT=16, num_warps=4), (0, 1234))
    assert [r[0] for r in record] == ["jit"]
    triton_launch.launch(fn, (7,), (x, 3, y), dict(P=8, BT=16, num_warps=4), (0, 1234))
    assert record[1] == ("direct", 7, 1, 1, 1234, "function", "packed", None, None, None, x, 3, y, 16, 8)
    seen = []
    monkeypatch.setattr(CompiledKernel, "launch_metadata", lambda self, grid, stream, *a: ("metadata", grid, stream, a))
    triton.knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        triton_launch.launch(fn, (8,), (x, 3, y), dict(P=8, BT=16, num_warps=4), (0, 1234))
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(seen.append)
    enter = triton.knobs.runtime.launch_enter_hook
    assert record[2] == ("direct", 8, 1, 1, 1234, "function", "packed", ("metadata", (8,), 1234, (x, 3, y, 16, 8)),
                         enter, None, x, 3, y, 16, 8)


@pytest.mark.parametrize("change", ["int to 1", "int to 16", "int to 64 bits", "alignment", "dtype", "None",
                                    "constexpr", "num_warps", "device", "no direct path", "a global changed"])
def test_a_changed_specialization_goes_through_the_jit_again(stand_in, change):
    """Each change the kept kernel was not built for (or where the direct path must not run) is a launch
    through the JIT, never the kept kernel."""
    fn, record = stand_in
    (x, n, y), meta = base_args()
    triton_launch.launch(fn, (6,), (x, n, y), meta, (0, 1234))
    args, at = dict(x=x, n=n, y=y), (0, 1234)
    if change.startswith("int to"):
        args["n"] = {"int to 1": 1, "int to 16": 16, "int to 64 bits": 2 ** 31 + 2}[change]
    elif change in ("alignment", "dtype", "None"):
        args["x"] = {"alignment": x[1:], "dtype": x.double(), "None": None}[change]
    elif change in ("constexpr", "num_warps"):
        meta = dict(meta, **{"constexpr": dict(P=16), "num_warps": dict(num_warps=8)}[change])
    elif change == "device":
        at = (1, 1234)
    elif change == "no direct path":
        at = None
    else:  # the JIT's own check before a launch: a global the kernel read is not what it was
        fn.used_global_vals = {("SCALE", 0): (1, {"SCALE": 2})}
    triton_launch.launch(fn, (6,), tuple(args.values()), meta, at)
    assert [r[0] for r in record] == ["jit", "jit"], change


@pytest.mark.parametrize("returns", ["unloaded", "nothing"])
def test_a_kernel_the_jit_did_not_load_is_not_kept(stand_in, returns):
    """A launch whose JIT returns no loaded CompiledKernel (a warm-up, a kernel not loaded) keeps
    nothing: the next launch goes through the JIT too."""
    fn, record = stand_in
    fn.returns = returns
    (x, n, y), meta = base_args()
    for _ in range(2):
        triton_launch.launch(fn, (6,), (x, n, y), meta, (0, 1))
    assert [r[0] for r in record] == ["jit", "jit"] and triton_launch._kept == {}


def test_a_direct_launch_that_raises_turns_the_direct_path_off(stand_in):
    """The launch goes through the JIT instead (the same kernels, one warning saying why), and from
    then on every launch does, every call's direct_at is None."""
    fn, record = stand_in

    def broken(*a):
        raise RuntimeError("the launcher")
    fn.launcher = broken
    (x, n, y), meta = base_args()
    triton_launch.launch(fn, (6,), (x, n, y), meta, (0, 1))  # through the JIT (the stand-in's does not run it)
    with pytest.warns(RuntimeWarning, match="direct launch is off for this process .*RuntimeError: the launcher"):
        triton_launch.launch(fn, (6,), (x, n, y), meta, (0, 1))  # through the JIT after all
    assert "RuntimeError: the launcher" in triton_launch._off
    assert triton_launch.direct_at(types.SimpleNamespace(is_cuda=True)) is None
    triton_launch.launch(fn, (6,), (x, n, y), meta, (0, 1))
    assert [r[0] for r in record] == ["jit", "jit", "jit"]


def test_only_tritons_own_jit_run_is_bypassed():
    """plain_jit: a JITFunction as Triton made it; not the interpreter's InterpretedFunction, a wrapper
    (tests/test_kernels.py's launch counter), a JITFunction whose run is replaced (the sm_90 build
    helper's) or that has a pre-run hook."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    fresh = lambda: JITFunction(_tiny.fn)  # noqa: E731
    assert triton_launch.plain_jit(fresh())
    assert not triton_launch.plain_jit(InterpretedFunction(_tiny.fn))
    assert not triton_launch.plain_jit(Recorder("_tiny", []))
    replaced = fresh()
    replaced.run = lambda *a, **k: None
    hooked = fresh()
    hooked.add_pre_run_hook(lambda *a, **k: None)
    assert not triton_launch.plain_jit(replaced) and not triton_launch.plain_jit(hooked)


class StubDriver:
    """What direct_at asks the driver: device 3, stream 77, a CUDA target (or another)."""

    def __init__(self, backend="cuda"):
        self.backend = backend

    def get_current_device(self):
        return 3

    def get_current_stream(self, device):
        return 77

    def get_current_target(self):
        return types.SimpleNamespace(backend=self.backend)


def test_the_direct_path_applies_on_cuda_under_a_known_triton_with_the_jits_knobs_at_their_defaults(monkeypatch):
    """direct_at: (device, stream) for a CUDA tensor under Triton 3.6 or 3.9 on a CUDA target; None off
    CUDA, under another Triton, another target, with TRITON_DEBUG's knob or an instrumentation mode on."""
    cuda = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(triton_launch, "driver", types.SimpleNamespace(active=StubDriver()))
    for version in ("3.6.0", "3.9.0"):
        monkeypatch.setattr(triton, "__version__", version)
        assert triton_launch.direct_at(cuda) == (3, 77)
    assert triton_launch.direct_at(torch.empty(1)) is None
    for version in ("3.5.1", "3.7.0", "4.0.0"):
        monkeypatch.setattr(triton, "__version__", version)
        assert triton_launch.direct_at(cuda) is None, version
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(triton.knobs.runtime, "debug", True)
    assert triton_launch.direct_at(cuda) is None
    monkeypatch.setattr(triton.knobs.runtime, "debug", False)
    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "consan")
    assert triton_launch.direct_at(cuda) is None
    monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "")
    triton_launch.forget()
    monkeypatch.setattr(triton_launch, "driver", types.SimpleNamespace(active=StubDriver("hip")))
    assert triton_launch.direct_at(cuda) is None


# -----------------------------------------------------------------------------
# Under the interpreter: the normal launch, the same results

INTERPRETER_SCRIPT = textwrap.dedent("""
    import sys, warnings, torch
    sys.path.insert(0, sys.argv[1])
    import model
    from kernels import fused, triton_launch, triton_retiled, triton_tssa
    assert triton_tssa.INTERPRET and not triton_launch.plain_jit(triton_tssa._k_u)
    triton_tssa.BLOCK_T, triton_retiled.BLOCK_T = 16, 8  # two chunks, the second part-filled
    g = torch.Generator().manual_seed(0)
    B, H, T, p = 2, 3, 20, 16
    w = torch.randn(B, T, H * p, generator=g).view(B, T, H, p).transpose(1, 2)
    temp, bias, gout = 0.5 + torch.rand(H, generator=g), torch.randn(H, T + 3, generator=g) / p, torch.randn_like(w)
    worst = [0.0, 0.0]  # relative RMS from float64's answer: outputs (out, Pi), gradients
    for impl in ("triton", "triton_retiled"):
        leaves = [t.clone().requires_grad_() for t in (w, temp, bias)]
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "tssa_impl")
            out, pi = fused.fused_ops(impl).causal_tssa(*leaves, return_pi=True)
            got = [out, pi, *torch.autograd.grad(out, leaves, gout)]
        ref = [t.double().requires_grad_() for t in (w, temp, bias)]  # the reference in float64: the exact answer
        out_r, pi_r = model.causal_tssa(*ref, return_pi=True)
        want = [out_r, pi_r, *torch.autograd.grad(out_r, ref, gout.double())]
        for i, (a, b) in enumerate(zip(got, want)):
            worst[i > 1] = max(worst[i > 1], ((a.double() - b).norm() / b.norm()).item())
    assert triton_tssa.call_plan.cache_info().hits >= 1 and triton_retiled.call_plan.cache_info().hits >= 1  # backwards
    print(len(triton_launch._kept), triton_launch._off, *worst)
""")


def test_under_the_interpreter_every_launch_is_the_normal_one_and_the_results_hold():
    """TRITON_INTERPRET=1 (a subprocess): a causal forward and backward through fused_ops("triton") and
    ("triton_retiled") (each backward on the forward's memoised plan) matches model.py's reference in
    every output and gradient (relative RMS from float64's answer: 2e-5 for the outputs, 1e-4 for the
    gradients, whose fp32 rounding is larger), and keeps nothing
    for direct launches (the interpreter's kernels are not Triton's JITFunctions)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_SCRIPT, ROOT], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept, off, outputs, gradients = proc.stdout.split()
    assert kept == "0" and off == "None", proc.stdout
    # fp32 against float64: the outputs within 2e-5; dL/dw sums over every later token and head, and
    # its rounding here reaches 1.3e-5 (with the interpreter's threads: torch's own fp32 reference is
    # off by as much), so 1e-4: a wrong gradient term is O(1) relative
    assert float(outputs) < 2e-5 and float(gradients) < 1e-4, proc.stdout
