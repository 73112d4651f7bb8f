"""
tssa_impl="auto": the Triton kernels where they are correct and faster, model.py's reference elsewhere.

On the first TSSA call on a device, the Triton kernels are checked there against model.py's
operators as they are now (nanotost/forks.py: the whole maths, every output and gradient, in the
regimes a fork changes). Where they cannot serve (a CPU, no Triton, a compile error, an answer
that differs) the reference runs, with one warning that says why. Where they pass (a CUDA GPU),
each shape class (the operator, B and T rounded up to powers of two, H, p, the dtype, a padding
mask; and whether the run compiles) gets one pick, decided once per machine:
  - timed by the figure a training step feels: the GPU time of forward and backward (a decoding
    step: forward), CUDA events around CALLS calls queued back to back, no synchronisation
    between them (gpu_seconds), the median of ROUNDS such windows, for each candidate: the
    Triton kernels and the reference, compiled when the run compiles;
  - in the run's own process: kernels.use(model, "auto", timed_at=(B, T, dtype, compiled)) (as
    train.py does) decides the class before the model's own torch.compile, the reference
    compiled here once for it; a first call inside torch.compile's trace with no pick yet times
    the compiled reference in a child process (a compile cannot start inside another);
  - kept on disk (kernels/auto_cache.py: ~/.cache/nanotost/auto/, $NANOTOST_CACHE moves it,
    keyed by the GPU, driver, CUDA, torch, Triton, the kernels' and model.py's maths' digests,
    compile and shape class): a later run reads the pick instead of timing;
  - under torchrun, one process per node (local rank 0) times it and the others wait for its
    file: every rank runs the same.
One line says the pick and the two times, and "cached in <file>" where it was read.
NANOTOST_AUTO forces it: =triton (the Triton kernels wherever the check passes), =torch (the
reference), =measure (time anew, and keep that). The answers are constants of a compiled graph
(assume_constant_result): one graph per shape class, no graph break.
The GPU configs (config/tost_owt*.py) use it: the same file trains on any machine.

    model = kernels.use(GPT(config), "auto")      # train.py --tssa_impl=auto
    NANOTOST_AUTO=triton python train.py config/tost_owt.py
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

import kernels.auto_cache as auto_cache
import model
from nanotost import forks
from nanotost.cli import ConfigError
from kernels.fused import FUSED_DTYPES, FUSED_PI_MODES, case_size, compiler_mark, failure_of, fused_ops, warn

CHECK_ON_CPU = False  # tests: check and time on the CPU too (the kernels under TRITON_INTERPRET=1)
CALLS = 10  # calls of a candidate queued back to back in one timed window, after one that warms up
ROUNDS = 3  # timed windows of each candidate (the median is its time)
COMPILE_BACKEND = "inductor"  # the reference's compiler when the run compiles (tests: "aot_eager")
CHILD_TIMEOUT_S = 600  # the child process that times the compiled reference inside a trace
WAIT_S = 2 * CHILD_TIMEOUT_S  # how long a torchrun rank waits for local rank 0's pick
HOLD_S = 1.0  # the longest the GPU sleeps while the host queues a window's calls
SLEEP_CYCLES_PER_S = 2e9  # GPU clocks are at most ~2 GHz: this many cycles sleep at least a second
TIMER = "gpu time of back-to-back calls, 1"  # how candidates are timed (part of the cache key: change it with them)
FORCE = "NANOTOST_AUTO"  # the environment variable that forces the pick
FORCES = ("triton", "torch", "measure")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def forced():
    """$NANOTOST_AUTO: "triton", "torch", "measure" (time anew), or None (unset: the cache, else timed)."""
    value = os.environ.get(FORCE, "").strip().lower()
    if value and value not in FORCES:
        raise ConfigError(f"{FORCE} must be one of {', '.join(FORCES)} (or unset), got {value!r}")
    return value or None


def triton_refusal(device):
    """None where the Triton kernels pass the check on device (a string), else why not (one line)."""
    device_type = torch.device(device).type
    if device_type != "cuda" and not (CHECK_ON_CPU and device_type == "cpu"):
        return f"the Triton kernels run on CUDA, this is a {device_type} device"
    with warnings.catch_warnings(record=True) as caught:  # kernels/fused.py's warning is the cause
        warnings.simplefilter("always")
        try:
            diffs = forks.kernel_differences(fused_ops("triton"), device, *case_size("triton"))
        except Exception as e:  # noqa: BLE001 (no Triton, a compile error, a launch error: all say why)
            return f"the Triton check raised {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
    fell_back = [str(w.message).split("; running")[0] for w in caught if "tssa_impl='triton'" in str(w.message)]
    failure = failure_of("triton")  # off since an earlier call of this process (its warning given then)
    if fell_back or failure:
        return fell_back[0] if fell_back else f"the Triton kernels are off in this process: {failure}"
    differs = forks.described(diffs)
    return f"the Triton kernels differ from model.py's operators: {differs}" if differs else None


# -----------------------------------------------------------------------------
# timing the candidates at a call's shape


def seconds(candidate, run, device, calls=CALLS, rounds=ROUNDS):
    """The time of one run() on device: after one call that warms up (compiles, builds kernels),
    the GPU time of `calls` calls queued back to back on a CUDA device (gpu_seconds); elsewhere
    (the tests' CPU) their wall time; the median of `rounds` windows. candidate: "triton" or
    "reference" (what tests mock)."""
    device = torch.device(device)
    run()
    if device.type == "cuda":
        return gpu_seconds(run, device, calls, rounds)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def gpu_seconds(run, device, calls, rounds):
    """The GPU time of one run() on a CUDA device: CUDA events around `calls` calls queued back to
    back with no synchronisation between them, the median of `rounds` such windows. Before each
    window the GPU sleeps while the host queues the window's calls, so that inside it the GPU
    never waits for the host, as in a compiled training step, which keeps the GPU's queue full:
    the host's time (launches, allocations, Python) is not counted, only the GPU's."""
    with torch.cuda.device(device):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        hold_s = min(HOLD_S, 2 * calls * (time.perf_counter() - t0))  # more than the host takes to queue them
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(hold_s * SLEEP_CYCLES_PER_S))  # (a kernel that spins for that many cycles)
            start.record()
            for _ in range(calls):
                run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)  # (elapsed_time: milliseconds)
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
        return {name: seconds(name, runner(spec, ops), device, spec["calls"], spec["rounds"])
                for name, ops in candidates.items()}


def measure_in_child(spec):
    """measure(spec) in a child process: inside torch.compile's trace a compile cannot start (in
    the same process, Dynamo's second compile breaks the first's)."""
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


@compiler_mark("assume_constant_result")  # asked once while Dynamo traces, then a constant of the graph
def triton_picked(device, shape_class, shape, compiled):
    """Whether "auto" runs the Triton kernels for a call of this shape class on device (strings
    and ints): checked on the device's first call, decided on the shape class's first (decide).
    shape: the call's own (B, H, T, p), or None for the class's (B and T rounded up to powers of
    two: inside torch.compile's trace, or decided before it)."""
    key = (device, shape_class, compiled)
    if key in _PICKS:  # (decided: the device checked, or the reference forced)
        return _PICKS[key]
    force = forced()
    if force != "torch" and device not in _REFUSALS:
        cause = _REFUSALS[device] = triton_refusal(device)
        if cause:
            warn(f"tssa_impl='auto': {cause}; running model.py's reference maths")
    if force != "torch" and _REFUSALS[device] is not None:
        return False
    _PICKS[key] = decide(device, shape_class, shape, compiled, force)
    return _PICKS[key]


def local_rank():
    """(this process's rank on its node, the node's processes): torchrun's, else (0, 1)."""
    try:
        return int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def say(line):
    """Print one of auto's lines: on local rank 0 only (under torchrun the others run its pick)."""
    if local_rank()[0] == 0:
        print(line, flush=True)


def decide(device, shape_class, shape, compiled, force):
    """Whether the Triton kernels run this shape class, said in one line: as forced, else as kept
    (kept_pick), else timed (measure: here, or in a child process inside torch.compile's trace)
    and kept. The line begins "tssa_impl=auto:", unlike a fallback's warning ("tssa_impl='auto':",
    which bench.py's main job reports as one)."""
    form, B, H, T, p, dtype, masked = shape_class
    spec = dict(device=device, form=form, shape=shape or (B, H, T, p), dtype=dtype, masked=masked,
                compiled=compiled, backend=COMPILE_BACKEND, calls=CALLS, rounds=ROUNDS)
    B, H, T, p = spec["shape"]
    what = f"tssa_impl=auto: {form} at B={B} H={H} T={T} p={p} {dtype}{' masked' if masked else ''} on {device}"
    reference = "the compiled reference" if compiled else "the reference"
    if force in ("triton", "torch"):
        say(f"{what}: running {'Triton' if force == 'triton' else reference} ({FORCE}={force}: nothing timed)")
        return force == "triton"
    key = auto_cache.key(device, shape_class, compiled, COMPILE_BACKEND, TIMER)
    path = auto_cache.path_of(key)
    entry = kept_pick(path, key, force, what)
    if entry is not None:
        triton = entry["pick"] == "triton"
        if entry.get("failed") is None:
            times = dict(triton=entry["triton_s"], reference=entry["reference_s"])
            say(told(what, form, times, reference, device, f"cached in {path}", triton))
        return triton
    try:
        times = measure_in_child(spec) if compiled and torch.compiler.is_compiling() else measure(spec)
    except Exception as e:  # noqa: BLE001 (out of memory, a timeout: the reference, and why)
        why = f"the timing raised {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        say(f"{what}: {why}; running {reference}")
        auto_cache.write(path, key, None, "reference", spec["shape"], failed=why, say=say)  # (for the other ranks)
        return False
    triton = times["triton"] < times["reference"]
    auto_cache.write(path, key, times, "triton" if triton else "reference", spec["shape"], say=say)
    timed = f"{CALLS} calls back to back" + (f", kept in {path}" if path else "")
    say(told(what, form, times, reference, device, timed, triton))
    return triton


def kept_pick(path, key, force, what):
    """The kept pick (auto_cache's entry) this process runs, or None: it times. The file's, unless
    NANOTOST_AUTO=measure, and a failed timing only in the run that failed; on a torchrun rank
    other than its node's local rank 0, the pick local rank 0 writes, waited for."""
    entry = None if force == "measure" else auto_cache.read(path, key, say)
    if entry is not None and not auto_cache.current(entry, fresh_only=False):
        entry = None  # (a failed timing of an earlier run: timed again)
    rank, ranks = local_rank()
    if entry is None and path is not None and rank != 0 and ranks > 1:
        entry = auto_cache.wait(path, key, fresh_only=force == "measure", timeout_s=WAIT_S)
        if entry is None:
            raise ConfigError(f"{what}: local rank 0 wrote no pick to {path} in {WAIT_S} s; set {FORCE}=triton or "
                              f"{FORCE}=torch to run without timing")
    return entry


def told(what, form, times, reference, device, where, triton):
    """The line that says a pick: the two times, what they are, where from, and what runs."""
    figure = "GPU time" if torch.device(device).type == "cuda" else "wall time"
    step = "forward" if form == "causal_tssa_step" else "forward and backward"
    return (f"{what}: Triton {1e3 * times['triton']:.3f} ms, {reference} {1e3 * times['reference']:.3f} ms "
            f"({figure} of {step}, {where}): running {'Triton' if triton else reference}")


def decide_before_compile(module, B, T, dtype, compiled):
    """kernels.use(module, "auto", timed_at=(B, T, dtype, compiled)): the pick of the shape class
    that module's causal TSSAs will call (B sequences of T tokens in dtype, autocast's where it
    runs), decided now, in this process: where the run compiles, the reference is compiled here
    for the class, before the model's own torch.compile (whose trace would need a child process).
    The non-causal form (its T is not the sequence's, a mask may come) is decided at its first call."""
    if getattr(torch, dtype, None) not in FUSED_DTYPES:
        return
    for m in module.modules():
        if isinstance(m, model.TSSA) and m.causal and m.operators is AUTO_OPS and m.pi_mode in FUSED_PI_MODES:
            H = m.n_head
            p = m.w_proj.in_features // H
            shape_class = ("causal_tssa", rounded_up(B), H, rounded_up(T), p, dtype, False)
            triton_picked(str(m.gamma.device), shape_class, None if compiled else (B, H, T, p), compiled)


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
