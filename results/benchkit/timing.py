"""
results/benchkit/timing.py: how bench.py measures (both of its modes use these): wall time of single
calls (timed) and of back-to-back calls between CUDA events (measure_ms), GPU busy time and
launches from torch.profiler (profile_device, device_activity), peak memory (PeakMemory), the
device's copy bandwidth, the SDPA backend that runs (sdpa_backend, forced, attention_ran), and
one report row's whole set of measurements (measure_row).

    from results.benchkit.timing import measure_row
    row = measure_row(lambda: step(), C)      # C: bench.py's settings (device, repeats, warmup)
"""

import ctypes
import os
import threading
import time

import torch
import torch.nn.functional as F

from results.benchkit.costs import calls_per_repeat

def sync(cfg):
    if cfg.device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, n_repeats, n_warmup, cfg):
    """Median wall time (ms) of fn() over n_repeats runs after n_warmup runs, all the wall
    times, and the median process CPU time (ms; on a shared CPU it shows the work done when
    the wall time is stretched by other processes)."""
    for _ in range(n_warmup):
        fn()
    sync(cfg)
    times, cpu = [], []
    for _ in range(n_repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync(cfg)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return sorted(times)[len(times) // 2], times, sorted(cpu)[len(cpu) // 2]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _cpu_bytes_fn():
    """A function returning the bytes the C allocator has handed out and not taken back
    (glibc mallinfo2: heap in use + mmapped blocks), or None where that is not available."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None

    def in_use():
        info = libc.mallinfo2()
        return info.uordblks + info.hblkhd
    return in_use


_cpu_bytes = _cpu_bytes_fn()


class PeakMemory:
    """Peak memory growth (MB) inside the block: the CUDA allocator's peak, or on CPU the bytes
    malloc has handed out, sampled every ~0.2 ms by a thread (None without glibc)."""

    def __init__(self, cfg):
        self.cfg, self.cuda = cfg, cfg.device.startswith("cuda")

    def __enter__(self):
        self.mb = None
        if self.cuda:
            sync(self.cfg)
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        elif _cpu_bytes is not None:
            self.base = self.peak = _cpu_bytes()
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, _cpu_bytes())
            time.sleep(0.0002)

    def __exit__(self, *exc):
        if self.cuda:
            sync(self.cfg)
            self.mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        elif hasattr(self, "thread"):
            self.stop.set()
            self.thread.join()
            self.mb = max(0, self.peak - self.base) / 2**20


def copy_bandwidth(cfg):
    """Measured device copy bandwidth in GB/s (read + write) on 1 GiB (256 MiB on small CPUs)."""
    big = cfg.device.startswith("cuda") or (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) > 16 * 2**30
    n = 2**28 if big else 2**26
    src = torch.ones(n, device=cfg.device)
    dst = torch.zeros(n, device=cfg.device)
    ms, _, _ = timed(lambda: dst.copy_(src), 5, 2, cfg)
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def sdpa_backend(q, k, v, is_causal):
    """The first SDPA backend that runs these inputs, in the order flash, cuDNN, memory-efficient,
    math, and a context manager that forces it (so the name reported is the one that ran)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    order = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None)),
             ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
    for name, backend in order:
        if backend is None:
            continue
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q[:, :, :64], k[:, :, :64], v[:, :, :64], is_causal=is_causal)
            return name, lambda b=backend: sdpa_kernel([b])
        except RuntimeError:
            continue
    raise RuntimeError("no SDPA backend runs on this device")



def free_memory(cfg):
    import gc
    gc.collect()
    if cfg.device.startswith("cuda"):
        torch.cuda.empty_cache()



def measure_ms(fn, cfg, n_calls=None):
    """Median ms per call of fn and the per-repeat values. CUDA: CUDA events around n back-to-back
    calls (n chosen so a repeat lasts ~20 ms: launch gaps included, as a training loop sees them);
    CPU: wall time of single calls (timed)."""
    if not cfg.device.startswith("cuda"):
        ms, all_ms, _ = timed(fn, cfg.repeats, cfg.warmup, cfg)
        return ms, all_ms
    for _ in range(cfg.warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one_ms = (time.perf_counter() - t0) * 1e3
    n = n_calls or calls_per_repeat(one_ms)
    times = []
    for _ in range(cfg.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    return sorted(times)[len(times) // 2], times


def device_activity(events, calls):
    """From torch.profiler's events: GPU busy ms per call (the sum of the device-side kernel,
    memcpy and memset durations), kernels launched per call, and the top kernels by time."""
    from torch.autograd import DeviceType
    on_gpu = [e for e in events if e.device_type == DeviceType.CUDA]
    by_name = {}
    for e in on_gpu:
        n, us = by_name.get(e.name, (0, 0.0))
        by_name[e.name] = (n + 1, us + (e.time_range.end - e.time_range.start))
    kernels = [e for e in on_gpu if not e.name.startswith(("Memcpy", "Memset"))]
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:6]
    return dict(gpu_ms=sum(us for _, us in by_name.values()) / 1e3 / calls, kernels=len(kernels) / calls,
                memops=(len(on_gpu) - len(kernels)) / calls,
                top_kernels=[[name[:120], n / calls, us / 1e3 / calls] for name, (n, us) in top])


def profile_device(fn, cfg, calls=3):
    """device_activity of `calls` runs of fn under torch.profiler (CUDA only; {} elsewhere)."""
    if not cfg.device.startswith("cuda"):
        return {}
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return device_activity(prof.events(), calls)


def attention_ran(top_kernels):
    """Which SDPA kernel ran, from the names of the kernels: cudnn, flash, efficient, or None."""
    names = " ".join(name.lower() for name, *_ in top_kernels or [])
    for backend, marks in (("cudnn", ("cudnn",)), ("flash", ("flash",)), ("efficient", ("fmha", "efficient"))):
        if any(m in names for m in marks):
            return backend
    return None


def forced(backend):
    """A context forcing SDPA's backend ('flash', 'cudnn', 'efficient', 'math'); 'default' forces none."""
    from contextlib import nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel
    choice = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
              "math": "MATH"}.get(backend)
    return nullcontext() if choice is None else sdpa_kernel([getattr(SDPBackend, choice)])


def measure_row(fn, cfg, profile_calls=3):
    """The measurements of one row: the first call (compile / warm-up) in s, median ms per call,
    GPU busy ms and kernels per call, peak memory (MB above what was allocated before)."""
    import warnings
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:  # SDPA says why a forced backend cannot run
        warnings.simplefilter("always")
        try:
            fn()
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError as e:
            why = "; ".join(str(w.message).splitlines()[0] for w in caught[:2])
            raise RuntimeError(f"{str(e).strip().splitlines()[0]}" + (f" ({why})" if why else "")) from e
    sync(cfg)
    first_s = time.perf_counter() - t0
    ms, all_ms = measure_ms(fn, cfg)
    row = dict(ms=ms, ms_all=all_ms, first_call_s=round(first_s, 3))
    row.update(profile_device(fn, cfg, profile_calls))
    with PeakMemory(cfg) as mem:
        fn()
    row["peak_mb"] = mem.mb
    return row

