"""
tssa_impl="auto": the Triton kernels where they are correct and faster, model.py's reference elsewhere.

On the first TSSA call on a device, the Triton kernels are checked there against model.py's
operators as they are now (kernels/check.py: the whole maths, every output and gradient, in the
regimes a fork changes). Where they cannot serve (a CPU, no Triton, a compile error, an answer
that differs) the reference runs, with one warning that says why. Where they pass (a CUDA GPU),
the first call of each shape class (the operator, B and T rounded up to powers of two, H, p,
the dtype, a padding mask) times both candidates at the call's own shape, forward and backward
(a decoding step: forward), REPEATS times each: the Triton kernels, and the reference. Inside
torch.compile's trace the reference is timed compiled, at the class's size, in a child process
(a compile cannot start inside another). The faster runs for that shape class for the rest of
the run, and one line says which and the two times. The answers are constants of a compiled
graph (assume_constant_result): one graph per shape class, no graph break.
The GPU configs (config/tost_owt*.py) use it: the same file trains on any machine.

    model = kernels.use(GPT(config), "auto")      # train.py --tssa_impl=auto
    python -m pytest -q tests/test_auto.py
"""

import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch

import kernels.check as check
import model
from kernels.fused import FUSED_DTYPES, FUSED_PI_MODES, failure_of, fused_ops, warn

CHECK_ON_CPU = False  # tests: check and time on the CPU too (the kernels under TRITON_INTERPRET=1)
REPEATS = 5  # timed calls of each candidate, after one that warms up (compiles)
COMPILE_BACKEND = "inductor"  # the reference's compiler when the run compiles (tests: "aot_eager")
CHILD_TIMEOUT_S = 600  # the child process that times the compiled reference
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def triton_refusal(device):
    """None where the Triton kernels pass the check on device (a string), else why not (one line)."""
    device_type = torch.device(device).type
    if device_type != "cuda" and not (CHECK_ON_CPU and device_type == "cpu"):
        return f"the Triton kernels run on CUDA, this is a {device_type} device"
    with warnings.catch_warnings(record=True) as caught:  # kernels/fused.py's warning is the cause
        warnings.simplefilter("always")
        try:
            diffs = check.differences(device, "triton")
        except Exception as e:  # noqa: BLE001 (no Triton, a compile error, a launch error: all say why)
            return f"the Triton check raised {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    fell_back = [str(w.message).split("; running")[0] for w in caught if "tssa_impl='triton'" in str(w.message)]
    failure = failure_of("triton")  # off since an earlier call of this process (its warning given then)
    if fell_back or failure:
        return fell_back[0] if fell_back else f"the Triton kernels are off in this process: {failure}"
    differs = check.described(diffs)
    return f"the Triton kernels differ from model.py's operators: {differs}" if differs else None


# -----------------------------------------------------------------------------
# timing the candidates at a call's shape


def seconds(candidate, run, device, repeats=REPEATS):
    """The median wall time of run() on device over `repeats` calls, after one that warms up
    (compiles, builds kernels). candidate: "triton" or "reference" (what tests mock)."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    run()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def runner(spec, ops):
    """A call of spec's operator through ops at spec's shape on fresh inputs: forward and backward
    for the parallel forms, one step (forward) for the decoding step."""
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    B, H, T, p = spec["shape"]
    gen = torch.Generator().manual_seed(0)  # never the run's random numbers
    new = lambda *shape: torch.randn(*shape, generator=gen).to(device)  # noqa: E731
    temp = (new(H).abs() + 0.5).requires_grad_()
    if spec["form"] == "causal_tssa_step":
        w_t, bias_t = new(B, H, p).to(dtype), new(H)
        state = model.TSSAState.zeros(B, H, p, device, dtype)

        def run():
            with torch.no_grad():
                ops.causal_tssa_step(w_t, temp, bias_t, state)
        return run
    w, g = new(B, H, T, p).to(dtype).requires_grad_(), new(B, H, T, p).to(dtype)
    if spec["form"] == "causal_tssa":
        bias = new(H, T).requires_grad_()
        leaves, call = (w, temp, bias), lambda: ops.causal_tssa(w, temp, bias)
    else:
        mask = torch.ones(B, T, dtype=torch.bool, device=device) if spec["masked"] else None
        leaves, call = (w, temp), lambda: ops.tssa(w, temp, mask=mask)
    return lambda: torch.autograd.grad(call(), leaves, g)


def measure(spec):
    """{"triton": seconds, "reference": seconds} at spec's shape on spec's device; the reference
    compiled by torch.compile (spec["backend"]) when spec["compiled"]."""
    form = spec["form"]
    reference = getattr(model, form)  # as it is now
    if spec["compiled"]:
        reference = torch.compile(reference, backend=spec["backend"], dynamic=False)
    candidates = {"triton": fused_ops("triton"), "reference": model.TSSAOperators(**{
        name: reference if name == form else getattr(model, name) for name in model.TSSAOperators._fields})}
    device = torch.device(spec["device"])
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        return {name: seconds(name, runner(spec, ops), device, spec["repeats"]) for name, ops in candidates.items()}


def measure_in_child(spec):
    """measure(spec) in a child process (a compile cannot start inside torch.compile's trace)."""
    code = "import json, sys; from kernels import auto; print(json.dumps(auto.measure(json.loads(sys.argv[1]))))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["no output"]
        raise RuntimeError(f"the timing process ended with {proc.returncode}: {lines[-1][:200]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -----------------------------------------------------------------------------
# the choice, once per device (the check) and per shape class (the timing)

_REFUSALS = {}  # device -> the check's answer (None: passed), asked once per process
_PICKS = {}  # (device, shape class, compiled) -> whether the Triton kernels run it


def rounded_up(n):
    """The power of two at or above n (a comparison at a time: a symbolic size under torch.compile
    gives guards, not a graph break)."""
    b = 1
    while b < n:
        b *= 2
    return b


@torch.compiler.assume_constant_result  # asked once while Dynamo traces, then a constant of the graph
def triton_picked(device, shape_class, shape, compiled):
    """Whether "auto" runs the Triton kernels for a call of this shape class on device (strings
    and ints): checked on the device's first call, timed on the shape class's first. shape: the
    call's own (B, H, T, p), or None inside torch.compile's trace (then the class's: B and T
    rounded up to powers of two)."""
    if device not in _REFUSALS:
        cause = _REFUSALS[device] = triton_refusal(device)
        if cause:
            warn(f"tssa_impl='auto': {cause}; running model.py's reference maths")
    if _REFUSALS[device] is not None:
        return False
    key = (device, shape_class, compiled)
    if key not in _PICKS:
        _PICKS[key] = faster_is_triton(device, shape_class, shape, compiled)
    return _PICKS[key]


def faster_is_triton(device, shape_class, shape, compiled):
    """Time both candidates (measure) and say in one line which runs; the reference if the timing fails.
    The line begins "tssa_impl=auto:", unlike a fallback's warning ("tssa_impl='auto':", which
    bench.py's main job reports as one)."""
    form, B, H, T, p, dtype, masked = shape_class
    spec = dict(device=device, form=form, shape=shape or (B, H, T, p), dtype=dtype, masked=masked,
                compiled=compiled, backend=COMPILE_BACKEND, repeats=REPEATS)
    B, H, T, p = spec["shape"]
    what = f"tssa_impl=auto: {form} at B={B} H={H} T={T} p={p} {dtype}{' masked' if masked else ''} on {device}"
    reference = "the compiled reference" if compiled else "the reference"
    try:
        times = measure_in_child(spec) if compiled else measure(spec)
    except Exception as e:  # noqa: BLE001 (out of memory, a timeout: the reference, and why)
        print(f"{what}: the timing raised {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}; "
              f"running {reference}", flush=True)
        return False
    triton = times["triton"] < times["reference"]
    step = "forward" if form == "causal_tssa_step" else "forward and backward"
    print(f"{what}: Triton {1e3 * times['triton']:.3f} ms, {reference} {1e3 * times['reference']:.3f} ms "
          f"({step}): running {'Triton' if triton else reference}", flush=True)
    return triton


def uses_triton(form, w, masked=False, pi_mode="softmax"):
    """Whether this call runs the Triton kernels (the reference for what they never run: another
    Pi, float64)."""
    if pi_mode not in FUSED_PI_MODES or w.dtype not in FUSED_DTYPES:
        return False
    if form == "causal_tssa_step":
        (B, H, p), T = w.shape, 1
    else:
        B, H, T, p = w.shape
    compiling = torch.compiler.is_compiling()
    # constants for the graph: B and T by range (a guard each), H and p as they are (a model's own)
    shape_class = (form, rounded_up(B), int(H), rounded_up(T), int(p), str(w.dtype).replace("torch.", ""), masked)
    shape = None if compiling else (B, H, T, p)  # (traced, the exact B and T would specialize the graph)
    return triton_picked(str(w.device), shape_class, shape, compiling)


def tssa(w, temp, return_pi=False, mask=None, pi_mode="softmax"):
    if uses_triton("tssa", w, mask is not None, pi_mode):
        return fused_ops("triton").tssa(w, temp, return_pi, mask, pi_mode)
    return model.tssa(w, temp, return_pi, mask, pi_mode)


def causal_tssa(w, temp, pos_bias, return_pi=False, pi_mode="softmax", state=None):
    if uses_triton("causal_tssa", w, pi_mode=pi_mode):
        return fused_ops("triton").causal_tssa(w, temp, pos_bias, return_pi, pi_mode, state)
    return model.causal_tssa(w, temp, pos_bias, return_pi, pi_mode, state)


def causal_tssa_step(w_t, temp, bias_t, state, pi_mode="softmax"):
    if uses_triton("causal_tssa_step", w_t, pi_mode=pi_mode):
        return fused_ops("triton").causal_tssa_step(w_t, temp, bias_t, state, pi_mode)
    return model.causal_tssa_step(w_t, temp, bias_t, state, pi_mode)


AUTO_OPS = model.TSSAOperators(tssa, causal_tssa, causal_tssa_step)
