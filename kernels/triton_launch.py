"""
The host side of one Triton TSSA call made cheap (issue 52): kernels/triton_tssa.py's TritonKernels
and kernels/triton_retiled.py's RetiledKernels allocate and launch through this file.

Why: an H200 measured one forward and backward of TritonKernels at B16 T1K (12 heads of 64, bf16)
at 1.61 ms of wall time for 0.35 ms of GPU time. The host paid, per call, for 12 launches through
Triton's JIT dispatch (its binder, its specialization key and cache lookup, the launch metadata),
~17 torch.empty, and the plan, geometry and grids computed afresh. Three remedies, each behind a
normal path it falls back to:

  workspace  carve(layout) makes one fp32 allocation and cuts views of it (16-byte aligned, as a
             torch.empty of its own is, so that the JIT specializes every pointer as before); the
             kernel classes group what lives as long: what the forward returns for the backward
             (Pi, u, the carries) in one allocation, the chunk totals a call uses and drops in
             another. layout() states the views, so that a memoised plan holds it.
  launch     launch(fn, grid, args, meta, at) is fn[grid](*args, **meta), Triton's normal launch,
             the first time; that returns the CompiledKernel the JIT picked (and built, or found in
             its cache) for the arguments' specialization, which is kept under key(): the kernel,
             the device, its options and constexprs, and spec_key(args), a key at least as fine as
             the JIT's own specialization (every int's class: equal to 1, divisible by 16, 32 or 64
             bits; every tensor's dtype and 16-byte alignment; floats, bools, None). A later launch
             whose key is kept calls that kernel's launcher directly, with the arguments in the
             order the JIT binds them, on the stream that is current, as Triton's own run does
             after its lookup. A stale kernel cannot run: any change the JIT would specialize on
             changes the key (a miss takes the normal path, which builds or finds the right
             kernel, then keeps it too).
  plans      the kernel classes memoise their plan, geometry, grids and workspace layouts per
             shape (functools.lru_cache; the module constants the plan reads are in its key).

Where the direct path applies (direct_at(t) is not None): t on a CUDA device, not under
TRITON_INTERPRET=1, Triton 3.6 or 3.9 (KNOWN_TRITONS: their run() and CompiledKernel were read
for this, and launch with the same calling convention), a CUDA target, Triton's compile-time
knobs at their defaults (debug, instrumentation, fpsan, a stages inspection hook: they enter the
JIT's key), and no direct launch has raised in this process. Per launch, fn must be a plain
JITFunction (no pre-run hooks, run() not replaced: tests/helpers_gpu_build.py builds through a
replaced run, tests/test_kernels.py counts launches through a wrapper; the interpreter's
InterpretedFunction is not one) and the globals it was built with unchanged. Elsewhere, and for
any argument whose type spec_key does not know, the normal launch.

What a call costs on the host now (counted, NOT MEASURED on a GPU; a GPU window measures the
wall / GPU time ratio with bench.py's op rows): the same launches (TritonKernels 6 + 6,
RetiledKernels 5 + 5), each after its first a key of its arguments (one Python pass over ~25
of them) and a dict lookup, then the launcher's C call; allocations, forward and backward of
the causal form, 7 where there were 17 (TritonKernels.forward / .backward's docstrings list
them); one lru_cache lookup of the plan a call.
"""

import torch
import triton
from triton import knobs
from triton.compiler import CompiledKernel
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from kernels.said import warn

ALIGN = 4  # fp32 values: a view of a workspace starts 16 bytes apart, the alignment the JIT specializes on
KNOWN_TRITONS = ("3.6.", "3.9.")  # whose JITFunction.run and CompiledKernel the direct path follows
MAX_KEPT = 4096  # compiled kernels kept (a few per shape class and kernel); past it the keeping starts again
_MISSING = object()

_kept = {}  # key() -> _Kept
_targets = {}  # device -> whether it is a CUDA target (the int and pointer rules spec_key follows)
_off = None  # why direct launches are off in this process (one raised), or None


def known_triton(version=None):
    """Whether the direct path follows this Triton (default: the one imported)."""
    return (version or triton.__version__).startswith(KNOWN_TRITONS)


# -----------------------------------------------------------------------------
# The workspace


def layout(*shapes):
    """(values, views) of one fp32 workspace holding a tensor of each shape: views as (shape, stride,
    offset), contiguous, each starting ALIGN values (16 bytes) after the end of the one before, rounded up."""
    at, views = 0, []
    for shape in shapes:
        stride, step = [], 1
        for n in reversed(shape):
            stride.insert(0, step)
            step *= n
        views.append((tuple(shape), tuple(stride), at))
        at += -(-step // ALIGN) * ALIGN
    return at, tuple(views)


def carve(spec, device, apart=False):
    """The tensors of a layout() on device: views of one fp32 allocation, or (apart) one each: a custom
    operator's outputs may not share storage (kernels/triton_ops.py)."""
    values, views = spec
    if apart:
        return [torch.empty(shape, device=device, dtype=torch.float32) for shape, _, _ in views]
    whole = torch.empty(values, device=device, dtype=torch.float32)
    return [whole.as_strided(shape, stride, offset) for shape, stride, offset in views]


# -----------------------------------------------------------------------------
# The key of a launch


def spec_key(args):
    """What the JIT specializes a launch's positional arguments on, at least as finely (Triton 3.6 and
    3.9 on CUDA): an int equal to 1 (a constexpr), else whether it divides by 16 and its width (i32,
    i64, u64); a tensor's dtype and whether its address divides by 16; a float (fp32, never
    specialized); a bool (keyed by value: finer than the JIT, which does not specialize it); None.
    None for an argument of another type: no key, so no direct launch."""
    key = []
    for a in args:
        kind = type(a)
        if kind is int:
            if a == 1:
                key.append(("one",))
            else:
                width = 32 if -0x80000000 <= a <= 0x7FFFFFFF else (64 if a < 0x8000000000000000 else "u64")
                key.append(("int", a % 16 == 0, width))
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif kind is float:
            key.append("float")
        elif kind is bool:
            key.append(("bool", a))
        elif a is None:
            key.append(None)
        else:
            return None
    return tuple(key)


def key(fn, device, args, meta):
    """The key a compiled kernel is kept under: the kernel, the device (each has its own build, loaded
    there), its debug flag, its constexprs and options as passed (num_warps, ...: in order), spec_key(args).
    None where spec_key has none (an option that cannot be hashed shows at the lookup: launch())."""
    spec = spec_key(args)
    return None if spec is None else (id(fn), device, fn.debug, tuple(meta.items()), spec)


# -----------------------------------------------------------------------------
# Launching


def direct_at(t):
    """(device, stream) for the direct launches of a call on t's device, read once a call (inside the
    device's context: triton_tssa.on_device), or None where only the normal launch applies."""
    if _off is not None or not t.is_cuda or not known_triton() or _compile_knobs_set():
        return None
    device = driver.active.get_current_device()
    if device not in _targets:
        _targets[device] = driver.active.get_current_target().backend == "cuda"
    if not _targets[device]:
        return None
    return device, driver.active.get_current_stream(device)


def _compile_knobs_set():
    """Whether a knob that enters the JIT's key or options is off its default (then every launch
    goes through the JIT, which keys on it)."""
    comp = knobs.compilation
    return bool(knobs.runtime.debug or comp.instrumentation_mode or getattr(comp, "fpsan_homomorphic_casts", False)
                or getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None)


def plain_jit(fn):
    """Whether fn is a JITFunction whose run() is Triton's own, with no pre-run hook."""
    return type(fn) is JITFunction and "run" not in vars(fn) and not fn.pre_run_hooks


def _globals_unchanged(fn):
    """The JIT's own check before a launch: the globals the kernel was built with still hold."""
    for (name, _), (value, scope) in fn.used_global_vals.items():
        if scope.get(name, _MISSING) != value:
            return False
    return True


class _Kept:
    """A compiled kernel and what a launch of it needs besides the call's arguments: its launcher,
    its function handle, its packed metadata, and the constexprs the JIT binds after the positional
    arguments (in its parameters' order)."""

    def __init__(self, fn, compiled, tail):
        self.fn, self.compiled, self.tail = fn, compiled, tail
        self.run, self.function, self.packed = compiled.run, compiled.function, compiled.packed_metadata

    def launch(self, grid, stream, args):
        """As JITFunction.run launches after its lookup: the grid as three dimensions, the launch hooks
        and their metadata, but None for a hook chain with no hook in it (Triton's default: the
        launcher would call it with metadata that nothing reads)."""
        bound = args + self.tail
        enter, leave = _live(knobs.runtime.launch_enter_hook), _live(knobs.runtime.launch_exit_hook)
        metadata = self.compiled.launch_metadata(grid, stream, *bound) if enter is not None else None
        self.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, self.function,
                 self.packed, metadata, enter, leave, *bound)


def _live(hook):
    """A launch hook, or None where it is None or a HookChain with no hook."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


def _keep(k, fn, compiled, args, meta):
    """Keep what a normal launch returned, where it is a loaded CompiledKernel and the JIT binds the
    arguments as launch() will: the positional ones, then every other parameter from meta."""
    if not isinstance(compiled, CompiledKernel) or compiled.function is None:
        return
    names = fn.arg_names[len(args):]
    if any(n not in meta for n in names):
        return
    if len(_kept) >= MAX_KEPT:
        _kept.clear()
    _kept[k] = _Kept(fn, compiled, tuple(meta[n] for n in names))


def launch(fn, grid, args, meta, at):
    """fn[grid](*args, **meta); directly where at (a call's direct_at()) allows and a compiled kernel is
    kept under this launch's key. args: a tuple of the positional arguments; meta: the rest."""
    global _off
    k = key(fn, at[0], args, meta) if at is not None and _off is None and plain_jit(fn) else None
    try:
        kept = None if k is None else _kept.get(k)
    except TypeError:  # an unhashable option: the normal launch, kept nowhere
        k = kept = None
    if kept is not None and kept.fn is fn and _globals_unchanged(fn):
        try:
            kept.launch(grid, at[1], args)
            return
        except Exception as e:  # never again in this process: this launch and the rest through the JIT
            _off = f"a direct launch raised {type(e).__name__}: {e}"
            warn(f"the Triton kernels' direct launch is off for this process ({_off}); launching through "
                 "Triton's JIT (slower on the host, the same kernels)")
    compiled = fn[grid](*args, **meta)
    if k is not None:
        _keep(k, fn, compiled, args, meta)


def forget():
    """Drop every kept kernel and turn the direct path back on (tests)."""
    global _off
    _kept.clear()
    _targets.clear()
    _off = None
