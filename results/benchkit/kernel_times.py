"""
results/benchkit/kernel_times.py: the headline's section kernel_times: every Triton launch of one
forward and backward of the operator (at the op section's shapes), its GPU time beside
kernels.triton_tssa.launch_plan()'s account of it: the bytes it reads and writes over its
measured time (TB/s), and the time the plan's model gives it (modelled_time_s(launch), for this
GPU where the model has its figures: model_gpu).

No list of kernels is kept here: the plan is the list. A launch is matched by name, the
profiler's kernel name being the plan's `kernel`; when the plan names a kernel k times, the
i-th launch of that name within a call is the plan's i-th. A plan launch the profiler did not
see as often as the plan says is a launch without a time (and says so), and the kernels the
plan does not name (PyTorch's, around the launches) are listed beside it.

On CUDA the times come from torch.profiler. On the CPU (the headline's rehearsal, the kernels
interpreted under TRITON_INTERPRET=1) they are the wall times of the interpreted launches,
taken by wrapping the plan's kernels: the same matching, not a speed.
"""

import statistics
import time
from collections import Counter
from functools import partial

import torch

from nanotost import devices
from results.benchkit.op import op_closure, op_shapes
from results.benchkit.part import fallback_note, why_not
from results.benchkit.timing import sync

CALLS = 5  # forward+backward calls timed per shape, after one that compiles (CUDA; one interpreted)


def kernel_times_rows(cfg, cuda):
    """The identifying fields of every row: the Triton operator at each of op's shapes."""
    return [dict(impl="triton", B=B, T=T_) for B, T_ in op_shapes(cfg)]


def section_kernel_times(S):
    cfg = S.cfg
    why = why_not(S, "triton")
    S.data.update(H=cfg.H, p=cfg.p, dtype=cfg.dtype, causal=True, mode="fwdbwd",
                  timer="torch.profiler, CUDA kernels" if S.cuda else "wall time of each interpreted launch (CPU: "
                                                                        "the code path, not a speed)")
    for key in kernel_times_rows(cfg, S.cuda):
        if why:
            S.row(**key, status="skipped", reason=why)
            continue
        S.attempt(key, partial(kernel_row, S, key["B"], key["T"]))


def kernel_row(S, B, T_):
    """The launches of one fwd+bwd at (B, T_), each timed and set beside the plan."""
    from kernels import triton_tssa as tt  # only now: under TRITON_INTERPRET=1 it is imported interpreted
    cfg = S.cfg
    plan = tt.launch_plan(B, cfg.H, T_, cfg.p, devices.DTYPES[cfg.dtype], causal=True)
    run = op_closure(cfg, "triton", B, T_)
    run()  # the compile (or the interpreter's first pass)
    sync(cfg)
    note = fallback_note("triton")
    if note:
        return dict(status="fell_back", reason=note)
    calls = CALLS if S.cuda else 1
    events = profiled(run, calls) if S.cuda else wrapped(run, calls, tt, plan)
    gpu = model_gpu(tt, torch.cuda.get_device_name(cfg.device) if S.cuda else "")
    modelled = partial(tt.modelled_time_s, gpu=gpu) if gpu else tt.modelled_time_s
    launches, others = per_launch(plan, events, calls, modelled)
    for launch in launches:
        print(f"    {launch['kernel']:<16} #{launch['launch']:<2} " + (
            f"{launch['gpu_us']:9.1f} us {launch['tbps']:6.2f} TB/s" if launch.get("gpu_us") is not None
            else f"{'-':>9}            ") + f"  model {launch['modelled_us']:8.1f} us", flush=True)
    timed = [launch["gpu_us"] for launch in launches]
    moved = sum(launch["read"] + launch["write"] for launch in launches)
    gpu_s = sum(timed) * 1e-6 if None not in timed else None
    return dict(launches=launches, other_kernels=others, calls=calls, bytes=moved,
                gpu_ms=gpu_s * 1e3 if gpu_s else None, tbps=moved / gpu_s / 1e12 if gpu_s else None,
                modelled_ms=sum(launch["modelled_us"] for launch in launches) * 1e-3, model_gpu=gpu,
                timer="profiler" if S.cuda else "interpreted")


def model_gpu(module, device_name):
    """The GPU the plan's time model has figures for that this device is (modelled_time_s's gpu=,
    a key of the module's COPY_RATE found in the device's name: "h200" in "NVIDIA H200"), or None:
    the model's default."""
    return next((gpu for gpu in getattr(module, "COPY_RATE", {}) if gpu in device_name.lower()), None)


def profiled(run, calls):
    """[(kernel name, start, seconds)] of every CUDA kernel of `calls` runs, from torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.start, (e.time_range.end - e.time_range.start) * 1e-6) for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


class _Timed:
    """A kernel of the Triton module, launched as kernel[grid](...), each launch's wall time
    recorded (the interpreter runs a launch before it returns)."""

    def __init__(self, name, kernel, events):
        self.name, self.kernel, self.events = name, kernel, events

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def timed_launch(*args, **kwargs):
            t0 = time.perf_counter()
            out = launch(*args, **kwargs)
            self.events.append((self.name, t0, time.perf_counter() - t0))
            return out
        return timed_launch

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def wrapped(run, calls, module, plan):
    """[(kernel name, start, seconds)] of `calls` runs, each launch of a kernel the plan names
    timed by wrapping it in `module` for the runs (kernels the plan does not name are not seen)."""
    events, kept = [], {}
    for name in dict.fromkeys(launch["kernel"] for launch in plan):
        kernel = getattr(module, name, None)
        if kernel is not None and hasattr(kernel, "__getitem__"):
            kept[name] = kernel
            setattr(module, name, _Timed(name, kernel, events))
    try:
        for _ in range(calls):
            run()
    finally:
        for name, kernel in kept.items():
            setattr(module, name, kernel)
    return events


def per_launch(plan, events, calls, modelled_time_s):
    """Each launch of the plan with its measured time: (launches, others). events: (kernel name,
    start, seconds) of `calls` calls, in any order. A launch: the plan's fields, its index, gpu_us
    (the median over the calls; None where the kernel was not seen as often as the plan says,
    with `unmatched` saying how often it was), tbps (its read + write bytes over that time),
    modelled_us, x_model (measured / modelled). others: [name, launches per call, ms per call]
    of the kernels the plan does not name."""
    seen = {}
    for name, _, seconds in sorted(events, key=lambda e: e[1]):
        seen.setdefault(name, []).append(seconds)
    per_call, nth = Counter(launch["kernel"] for launch in plan), Counter()
    launches = []
    for i, launch in enumerate(plan):
        name = launch["kernel"]
        k, n = nth[name], per_call[name]
        nth[name] += 1
        row = dict(launch, launch=i, modelled_us=modelled_time_s(launch) * 1e6, gpu_us=None, tbps=None, x_model=None)
        times = seen.get(name, [])
        if len(times) != n * calls:
            row["unmatched"] = f"seen {len(times)} times in {calls} calls; the plan launches it {n} times a call"
        else:
            seconds = statistics.median(times[k::n])
            row.update(gpu_us=seconds * 1e6, tbps=(launch["read"] + launch["write"]) / seconds / 1e12,
                       x_model=seconds * 1e6 / row["modelled_us"])
        launches.append(row)
    others = [[name, len(ts) / calls, sum(ts) / calls * 1e3] for name, ts in seen.items() if name not in per_call]
    return launches, sorted(others, key=lambda o: -o[2])
