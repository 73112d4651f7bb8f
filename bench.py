"""
bench.py: speed and memory of TSSA (readable reference and fused fast paths) against softmax
attention through F.scaled_dot_product_attention, on CPU or CUDA. Two modes:

THE REPORT (--report): one fixed protocol for a GPU, the source of SPEED.md's GPU tables.
    python bench.py --report --out=results/          # every section, into the committed results/<gpu>.json
    python bench.py --report --budget_s=540          # what fits in 9 minutes (out-bench/); run again to continue
    python bench.py --report --sections=op,decode    # their missing rows (--remeasure=True: all again)
    python bench.py --report --device=cpu --quick    # a smoke run of every section (tiny shapes, seconds)
    python results/render.py                         # SPEED.md's GPU tables from the committed JSON
Sections (SECTIONS below; each in its own process under a time limit, --section_s to change):
meta, gpu_check_accuracy, gpu_check_determinism (python -m kernels.gpu_check), op (TSSA fwd+bwd
vs SDPA with FlashAttention-2 and cuDNN forced, B=1 at T, and the training shape B=16 T=1K; GPU
busy time and kernels per call from torch.profiler), decode (per token, 1K..64K, ToST by
tssa_impl and GPT-2 with its static KV cache, eager, CUDA graph, compiled + CUDA graph),
train_tost / train_gpt2_flash / train_gpt2_cudnn / train_tost_triton (the compiled training
step at 4K..64K, equal tokens per step), main_job (train.py, config/tost_owt.py with
main_tssa_impl and config/gpt2_owt.py beside it, main_iters iterations on synthetic tokens:
tokens/s, MFU, and on a GPU a profile of each micro-step). Each section writes its rows as it
goes; one that hangs is stopped at its limit and recorded as timed_out with the rows it
measured, and the next section runs. The parent merges the sections into one JSON after each
(--out, a file or a folder ending in /; by default out-bench/<gpu>.json for a full CUDA report,
out-bench/cpu-report.json or <gpu>-quick.json for a CPU or quick one: results/, committed, only
when named) and, run again with sections=all, runs only the sections not yet done. A quick
report runs every section at the tiniest shapes; rows a device cannot run (Triton,
FlashAttention, cuDNN, CUDA graphs, torch.compile on the CPU) are rows saying why. One command
writes a report file at a time (a second into the same file is refused); Ctrl-C stops the
section in flight with its process group and keeps the sections done; NANOTOST_COMMIT, when
set, must name a commit (40 hex digits, one git knows where a .git is at hand). SPEED.md says more.

THE SUITES (without --report): tables for any device and shape, JSON to bench_results.json.
    python bench.py --quick=1                        # a few minutes: operator + decode, T = 1K, 4K, 16K
    python bench.py                                  # everything this device can do, T = 1K .. 64K
    python bench.py --suites=op --impls=torch,cpu,sdpa --T=16384 --modes=fwdbwd --threads=2
    python bench.py --device=cuda --dtype=bfloat16 --suites=op,decode,model,model_decode
Suites (--suites, comma separated):
  op            the attention operator alone, (B, H, T, p) inputs: forward and forward+backward
  decode        one generated token at context T: TSSA recurrent step vs SDPA over a KV cache
  model         whole-model training step (forward, backward, AdamW): ToST-Base vs GPT-2 Base
  model_decode  whole-model per-token decoding at context T, with the size of the carried state
  vit           vision: 12 attention layers of ToST-S width, forward, at T tokens (image side 16 sqrt(T))
Implementations (--impls): the values of tssa_impl, each reached through kernels.ops_for /
kernels.use(model, impl) as a training run reaches it: torch (model.py's maths), cpu (the C
kernels), triton (the Triton kernels; CUDA); then sdpa (softmax attention; the backend that
ran is named: flash, cudnn, efficient or math) and compiled (torch.compile of model.py's
maths; off by default, it compiles for ~30 s). "auto": torch, the device's kernels, sdpa.
A fused implementation that fell back to the reference says so in the note column.
Times are medians of --repeats runs after --warmup runs; memory is the peak above what was
allocated before the case (CUDA allocator peak; on CPU the sampled growth of the resident set).
For TSSA rows, GB/s is the memory floor (bytes a perfect kernel must move: forward reads w and
writes out = 2 C values per token, forward+backward also reads w and dL/dout and writes dL/dw
= 5 C values per token; 10 C bytes in bf16) divided by the time, and "x floor" is the time over
the floor's time at the machine's measured copy bandwidth. A case whose estimated time exceeds
max_case_s is a row saying "skipped" (and the summary counts them).

Every setting is checked before anything runs (a mistake is one line, nothing written). A case
that raises is a row saying FAILED (and is counted in the summary); a run in which no case ran
exits with status 1, its rows still written. The JSON is written whole or not at all.
"""

import ctypes
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.nn.functional as F

import cli
import kernels
import model
import trainkit as tk
from results.markdown import ratio_words

# -----------------------------------------------------------------------------
# settings (override with a config file or --key=value)
device = "auto"  # "auto" (cuda if available) | "cpu" | "cuda" | "cuda:N"
dtype = "auto"  # "auto" (bfloat16 on cuda, float32 on cpu) | "float32" | "bfloat16" | "float16"
suites = "op,decode,model,model_decode"
impls = "auto"  # "auto" = torch,cpu,sdpa on cpu and torch,triton,sdpa on cuda; add "compiled" for torch.compile
modes = "fwd,fwdbwd"
T = "1024,2048,4096,8192,16384,32768,65536"  # sequence lengths / decode contexts (report: the operator's, at B)
model_T = "auto"  # whole-model lengths: "auto" = 1K..8K on cuda, 1K on cpu (report: 4K, 16K, 64K, 8K, 32K)
decode_T = "auto"  # whole-model decode contexts: "auto" = T on cuda, up to 16K on cpu (report: 1K, 64K, 4K, 16K, 32K)
B = 1
H = 12
p = 64
causal = True
threads = 0  # CPU threads (0: leave torch's default)
repeats = 5
warmup = 1
decode_steps = 50  # tokens per decode timing
max_case_s = 60.0  # skip a case whose estimated run time (from the previous T) is longer
quick = False  # a short run: suites: T = 1K, 4K, 16K, op and decode, 3 repeats; report: the tiniest shapes
out = "auto"  # "auto": bench_results.json (suites); report: out-bench/<gpu>[-quick].json, or a folder/ for it
# the report (--report)
report = False  # run the report's sections (each its own process, time-limited) into one JSON
sections = "all"  # report: the sections to run; "all" runs those not yet done in the JSON at out
section_s = ""  # report: time limits, seconds: "" each section's own, "300" every one, "op:200,decode:90"
budget_s = 0.0  # report: seconds for this whole command (0: no limit); sections that no longer fit wait
remeasure = False  # report: a section run again measures every row (False: keeps the rows measured by the same code)
train_tokens = 65536  # report: tokens per training step (batch = train_tokens / T)
main_iters = 200  # report: iterations of the main job
main_tssa_impl = "auto"  # report: the main job's tssa_impl (config/tost_owt.py's own: auto)
# -----------------------------------------------------------------------------
DEFAULTS = cli.config_defaults(globals())  # the settings above
SUITES = ("op", "decode", "model", "model_decode", "vit")
IMPLS = tuple(i for i in kernels.IMPLS if i != "auto") + ("sdpa", "compiled")  # (--impls=auto: the default set)
MODES = ("fwd", "fwdbwd")


def lengths(key, text):
    """A comma-separated list of positive integers ("4096", "1024,4096"), as a list."""
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        values = []
    cli.require(values and min(values) >= 1, f"{key} must be positive integers separated by commas, got {text!r}")
    cli.require(len(set(values)) == len(values), f"{key} must name each length once, got {text!r}")
    return values


def names(key, text, allowed):
    """A comma-separated list of names, each once and one of `allowed`, as a list."""
    return cli.name_list(key, text, allowed)


MIN_BUDGET_S = 90  # budget_s: a section starts only with 60 s of it left, 10 s kept for the writes, ~20 s of meta


def check_settings(C):
    """Every setting, checked before any work (a refusal measures and writes nothing). Returns
    the lists the comma-separated settings hold (None where "auto")."""
    cli.check(C, at_least_1=("B", "H", "p", "repeats", "decode_steps", "train_tokens", "main_iters"),
              non_negative=("warmup", "budget_s"), workers=("threads",), positive=("max_case_s",),
              choices={"main_tssa_impl": kernels.IMPLS})
    cli.require(C.budget_s == 0 or C.budget_s >= MIN_BUDGET_S,
                f"budget_s={C.budget_s:g} is too short to start any section (each needs 60 s of it, and 10 s are kept "
                f"for writing): give at least {MIN_BUDGET_S}, or 0 for no limit")
    plan = dict(T=lengths("T", C.T), suites=names("suites", C.suites, SUITES), modes=names("modes", C.modes, MODES),
                impls=None if C.impls == "auto" else names("impls", C.impls, IMPLS),
                model_T=None if C.model_T == "auto" else lengths("model_T", C.model_T),
                decode_T=None if C.decode_T == "auto" else lengths("decode_T", C.decode_T))
    cli.require(C.out, "out must name the results file, e.g. --out=bench_results.json")
    if C.sections != "all":
        names("sections", C.sections, tuple(SECTIONS))
    section_limits(C, list(SECTIONS))
    into_folder = C.out == "auto" or (C.report and C.out.endswith(("/", os.sep)))  # the report: <gpu>.json in it
    if os.path.isdir(C.out) and not into_folder:
        raise cli.UserError(f"out={C.out!r} is a folder: name a file, e.g. --out={os.path.join(C.out, 'bench.json')}")
    if C.out == "auto":  # where the default goes, checked before anything is measured
        cli.writable_place("out-bench/" if C.report else "bench_results.json", "--out")
    else:
        cli.writable_place(C.out, "--out")
    return plan

# -----------------------------------------------------------------------------
# measuring


def sync(C):
    if C.device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, n_repeats, n_warmup, C):
    """Median wall time (ms) of fn() over n_repeats runs after n_warmup runs, all the wall
    times, and the median process CPU time (ms; on a shared CPU it shows the work done when
    the wall time is stretched by other processes)."""
    for _ in range(n_warmup):
        fn()
    sync(C)
    times, cpu = [], []
    for _ in range(n_repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync(C)
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

    def __init__(self, C):
        self.C, self.cuda = C, C.device.startswith("cuda")

    def __enter__(self):
        self.mb = None
        if self.cuda:
            sync(self.C)
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
            sync(self.C)
            self.mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        elif hasattr(self, "thread"):
            self.stop.set()
            self.thread.join()
            self.mb = max(0, self.peak - self.base) / 2**20


def copy_bandwidth(C):
    """Measured device copy bandwidth in GB/s (read + write) on 1 GiB (256 MiB on small CPUs)."""
    big = C.device.startswith("cuda") or (os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) > 16 * 2**30
    n = 2**28 if big else 2**26
    src = torch.ones(n, device=C.device)
    dst = torch.zeros(n, device=C.device)
    ms, _, _ = timed(lambda: dst.copy_(src), 5, 2, C)
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


# -----------------------------------------------------------------------------
# the cases


def split_heads(x, C):  # (B, T, H p) -> (B, H, T, p), the layout model.py hands to the operator
    return x.view(x.shape[0], x.shape[1], C.H, C.p).transpose(1, 2)


def op_case(C, impl, mode, T_):
    """A closure running one operator call (and backward) at length T_, plus a note."""
    B, H, width = C.B, C.H, C.H * C.p
    kw = dict(device=C.device, dtype=tk.DTYPES[C.dtype])
    note = ""
    if impl == "sdpa":
        qkv = torch.randn(B, T_, 3 * width, **kw, requires_grad=mode == "fwdbwd")
        q, k, v = (split_heads(t, C) for t in qkv.chunk(3, dim=-1))
        name, force = sdpa_backend(q, k, v, C.causal)
        note = f"backend={name}"

        def op():
            with force():
                return F.scaled_dot_product_attention(q, k, v, is_causal=C.causal)
        leaf = qkv
    else:
        x = torch.randn(B, T_, width, **kw, requires_grad=mode == "fwdbwd")
        w = split_heads(x, C)
        temp = torch.ones(H, device=C.device, requires_grad=mode == "fwdbwd")
        bias = torch.zeros(H, T_, device=C.device, requires_grad=mode == "fwdbwd")
        ops = kernels.ops_for("torch" if impl == "compiled" else impl)
        if C.causal:
            fn = lambda w_, t_, b_: ops.causal_tssa(w_, t_, b_)
        else:
            fn = lambda w_, t_, b_: ops.tssa(w_, t_)
        if impl == "compiled":
            fn = torch.compile(fn)
        op = lambda: fn(w, temp, bias)
        leaf = x
    g = split_heads(torch.randn(B, T_, width, **kw), C)  # dL/dout as it comes back through the output projection
    if mode == "fwd":
        def run():
            with torch.no_grad():
                op()
    else:
        def run():
            leaf.grad = None
            op().backward(g)
    return run, note


def tssa_floor(C, mode, T_):
    """Bytes a perfect causal TSSA must move: 2 (forward) or 5 (forward+backward) tensors of C
    values per token, in the input dtype."""
    return (2 if mode == "fwd" else 5) * C.B * T_ * C.H * C.p * torch.finfo(tk.DTYPES[C.dtype]).bits // 8


def fallback_note(impl):
    """Why a fused implementation ran the reference instead (its one warning), or ""."""
    if impl not in ("cpu", "triton"):
        return ""
    from kernels import fused  # imported already: the implementation ran
    cause = getattr(fused._OPS.get(impl), "fallback", None)
    return f"FELL BACK to the reference: {cause}" if cause else ""


def decode_case(C, impl, T_):
    """One generated token at context T_: the TSSA recurrent step or SDPA over a KV cache."""
    B, H, p, decode_steps = C.B, C.H, C.p, C.decode_steps
    kw = dict(device=C.device, dtype=tk.DTYPES[C.dtype])
    if impl == "sdpa":
        k, v = torch.randn(B, H, T_, p, **kw), torch.randn(B, H, T_, p, **kw)
        q = torch.randn(B, H, 1, p, **kw)
        name, force = sdpa_backend(q, k, v, False)

        def run():
            with force(), torch.no_grad():
                for _ in range(decode_steps):
                    F.scaled_dot_product_attention(q, k, v)
        return run, f"backend={name}; KV cache {2 * k.numel() * k.element_size() / 2**20:.1f} MB"
    state = model.TSSAState.zeros(B, H, p, device=C.device)
    state.sum_sq.uniform_(1, 2).mul_(T_)
    state.sum_pi_sq.uniform_(1, 2).mul_(T_ / H)
    state.sum_pi.fill_(T_ / H)
    state.pos.fill_(T_)
    temp, bias = torch.ones(H, device=C.device), torch.zeros(H, device=C.device)
    w_t = torch.randn(B, H, p, **kw)
    step = kernels.ops_for(impl).causal_tssa_step

    def run():
        with torch.no_grad():
            for _ in range(decode_steps):
                step(w_t, temp, bias, state)
    size = sum(t.numel() * t.element_size() for t in (state.sum_sq, state.sum_pi_sq, state.sum_pi))
    return run, f"state {size / 2**10:.1f} KB"


def model_for(C, impl, block_size):
    if impl == "sdpa":
        return model.GPT.from_preset("gpt2", block_size=block_size).to(C.device)
    return kernels.use(model.GPT.from_preset("tost-base", block_size=block_size), impl).to(C.device)


def autocast(C):
    device_type = "cuda" if C.device.startswith("cuda") else "cpu"
    return device_type, torch.autocast(device_type, dtype=tk.DTYPES[C.dtype], enabled=C.dtype != "float32")


def model_case(C, impl, T_):
    """One training step of the whole model at context T_ (batch B)."""
    m = model_for(C, impl, T_)
    device_type, amp = autocast(C)
    opt = tk.configure_adamw(m, 0.1, 6e-4, (0.9, 0.95), device_type)
    idx = torch.randint(0, 50257, (C.B, T_), device=C.device)
    note = f"{sum(q.numel() for q in m.parameters()) / 1e6:.0f}M params"

    def run():
        with amp:
            _, loss = m(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run, note


def model_decode_case(C, impl, T_):
    """Per-token decoding of the whole model with a context of T_ tokens already in its state
    (synthetic state: the cost does not depend on its values)."""
    m = model_for(C, impl, T_ + C.decode_steps).eval()
    width, H, B = m.config.n_embd, m.config.n_head, C.B
    kw = dict(device=C.device, dtype=tk.DTYPES[C.dtype])
    state = m.init_state(B)
    for s in state.layers:  # as if T_ tokens had been prefilled
        if impl == "sdpa":
            s.k, s.v = (torch.randn(B, H, s.max_len, width // H, **kw) for _ in range(2))
        else:
            s.sum_sq.fill_(T_), s.sum_pi_sq.fill_(T_ / H), s.sum_pi.fill_(T_ / H)
    state.pos.fill_(T_)
    size = sum(s.nbytes() for s in state.layers)
    tok = torch.randint(0, 50257, (B, 1), device=C.device)
    _, amp = autocast(C)

    def run():
        state.pos.fill_(T_)  # every call decodes the same positions (the KV cache holds T_ + decode_steps)
        with torch.no_grad(), amp:
            for _ in range(C.decode_steps):
                m.step(tok, state)
    return run, f"state {size / 2**20:.3f} MB"


def vit_case(C, impl, T_):
    """Vision at T_ tokens (a sqrt(T_) * 16 pixel square image, patch 16): the forward pass of
    12 attention layers of ToST-S width (384, 8 heads), batch B, no gradients (MATH.md §6.3: the
    paper's 10k-token comparison). sdpa: softmax attention; torch / cpu / triton / compiled: TSSA."""
    torch.manual_seed(0)
    kind = "softmax" if impl == "sdpa" else "tssa"
    tssa_impl = impl if impl in ("cpu", "triton") else "torch"
    config = model.ViTConfig(n_embd=384, n_head=8, attn=kind)  # ToST-S width, biases
    dtype = tk.DTYPES[C.dtype]
    layers = torch.nn.Sequential(*[model.make_attention(config, causal=False) for _ in range(12)])
    layers = kernels.use(layers, tssa_impl).to(C.device, dtype)
    fn = torch.compile(layers.eval()) if impl == "compiled" else layers.eval()
    x = torch.randn(C.B, T_, 384, device=C.device, dtype=dtype)

    def run():
        with torch.no_grad():
            fn(x)
    side = int(round(T_ ** 0.5)) * 16
    return run, f"image {side}x{side}, 12 layers, width 384"


# -----------------------------------------------------------------------------
# driver


def run_suite(C, suite, impl_list, mode_list, T_list, results, bw):
    """Measure one suite over implementations, modes and lengths, a row (printed and kept in
    `results`) per case. A case that raises is a row saying so (a measured failure, not a
    mistake in the settings); after one out of memory, longer lengths of that case are not tried."""
    per_call = suite in ("decode", "model_decode")
    cuda = C.device.startswith("cuda")
    last = {}  # (impl, mode) -> (T, ms): to skip cases that would run too long
    for impl in impl_list:
        if suite != "op" and impl == "compiled":  # torch.compile of the operator only
            continue
        for mode in (mode_list if suite == "op" else ["step"]):
            for T_ in T_list:
                rec = dict(suite=suite, impl=impl, mode=mode, T=T_, B=C.B, H=C.H, p=C.p, device=C.device,
                           dtype=C.dtype, causal=C.causal)
                if (impl, mode) in last:
                    T0, ms0 = last[(impl, mode)]
                    # how the cost grows with T: attention T^2 per sequence / T per decoded token;
                    # TSSA T per sequence and constant per decoded token (its state does not grow)
                    power = (1 if per_call else 2) if impl == "sdpa" else (0 if per_call else 1)
                    est_s = ms0 * (T_ / T0) ** power * (C.repeats + C.warmup) / 1e3
                    if est_s > C.max_case_s:
                        rec.update(note=f"skipped: estimated {est_s:.0f} s > max_case_s={C.max_case_s:g}",
                                   max_case_s=C.max_case_s)
                        results.append(rec)
                        print_row(rec)
                        continue
                try:
                    make = {"op": lambda: op_case(C, impl, mode, T_), "decode": lambda: decode_case(C, impl, T_),
                            "model": lambda: model_case(C, impl, T_), "model_decode": lambda: model_decode_case(C, impl, T_),
                            "vit": lambda: vit_case(C, impl, T_)}[suite]
                    fn, note = make()
                    fn()  # first call outside the timing (compilation, C build, allocator warm-up)
                    note = "; ".join(n for n in (note, fallback_note(impl)) if n)
                    ms, all_ms, cpu_ms = timed(fn, C.repeats, C.warmup, C)
                    with PeakMemory(C) as mem:  # a separate run: the sampling thread costs CPU time
                        fn()
                except (torch.cuda.OutOfMemoryError, MemoryError) as e:
                    rec.update(note=f"out of memory ({type(e).__name__})")
                    results.append(rec)
                    print_row(rec)
                    break
                except Exception as e:  # e.g. a compiler error: say so in the table and go on
                    rec.update(note=f"FAILED: {type(e).__name__}: {(str(e).strip() or '-').splitlines()[0][:100]}")
                    results.append(rec)
                    print_row(rec)
                    continue
                if per_call:
                    ms, all_ms, cpu_ms = ms / C.decode_steps, [t / C.decode_steps for t in all_ms], cpu_ms / C.decode_steps
                rec.update(ms=ms, ms_all=all_ms, cpu_ms=None if cuda else cpu_ms, peak_mb=mem.mb, note=note)
                if suite == "op" and impl != "sdpa":
                    floor = tssa_floor(C, mode, T_)
                    rec.update(gbps=floor / (ms * 1e-3) / 1e9, x_floor=ms * 1e-3 / (floor / (bw * 1e9)))
                last[(impl, mode)] = (T_, ms * (C.decode_steps if per_call else 1))
                results.append(rec)
                print_row(rec)
                del fn
                if cuda:
                    torch.cuda.empty_cache()


_HEADER = f"{'suite':<13}{'impl':<10}{'mode':<7}{'T':>7}{'ms':>11}{'cpu ms':>11}{'peak MB':>10}{'GB/s':>8}{'x floor':>9}  note"


def print_row(r):
    f = lambda key, fmt: (fmt.format(r[key]) if r.get(key) is not None else "-")
    print(f"{r['suite']:<13}{r['impl']:<10}{r['mode']:<7}{r['T']:>7}{f('ms', '{:.3f}'):>11}{f('cpu_ms', '{:.3f}'):>11}{f('peak_mb', '{:.1f}'):>10}"
          f"{f('gbps', '{:.1f}'):>8}{f('x_floor', '{:.1f}'):>9}  {r.get('note', '')}", flush=True)


def did_not_run(results):
    """The rows of cases that raised or ran out of memory."""
    return [r for r in results if r.get("note", "").startswith(("FAILED", "out of memory"))]


def summary(results):
    """Ratios the issue's targets are stated in, where both sides were measured; first, how
    many cases did not run."""
    def ms(suite, impl, mode, T_):
        for r in results:
            if (r["suite"], r["impl"], r["mode"], r["T"]) == (suite, impl, mode, T_) and r.get("ms") \
                    and "FELL BACK" not in r.get("note", ""):
                return r["ms"], r.get("peak_mb")
        return None, None
    lines = []
    failed = did_not_run(results)
    if failed:
        lines.append(f"{len(failed)} of {len(results)} cases did not run (the FAILED / out of memory rows above); "
                     f"the first: {failed[0]['suite']} {failed[0]['impl']} T={failed[0]['T']}: {failed[0]['note']}")
    skipped = [r for r in results if r.get("note", "").startswith("skipped")]
    if skipped:
        lines.append(f"{len(skipped)} cases were skipped by max_case_s={skipped[0].get('max_case_s')} (estimated "
                     "to run longer; the 'skipped' rows above): raise --max_case_s to run them")
    tost = [i for i in ("cpu", "triton", "compiled", "torch") if any(r["impl"] == i for r in results)]
    for T_ in sorted({r["T"] for r in results}):
        for mode in ("fwd", "fwdbwd"):
            ref, _ = ms("op", "torch", mode, T_)
            s, _ = ms("op", "sdpa", mode, T_)
            for impl in tost:
                f, _ = ms("op", impl, mode, T_)
                if f and (s or (ref and impl != "torch")):
                    vs = [ratio_words(f, ref, "torch")] if ref and impl != "torch" else []
                    vs += [ratio_words(f, s, "SDPA")] if s else []
                    lines.append(f"op {mode} T={T_}: {impl} {f:.2f} ms, " + ", ".join(vs))
        for suite, mode in (("model", "step"), ("model_decode", "step")):
            s, sm = ms(suite, "sdpa", mode, T_)
            for impl in tost:
                f, fm = ms(suite, impl, mode, T_)
                if f and s:
                    mem = f", peak memory {fm / sm:.2f}x GPT-2's" if fm and sm else ""
                    lines.append(f"{suite} T={T_}: ToST ({impl}) {f:.1f} ms vs GPT-2 {s:.1f} ms = {f / s:.2f}x the "
                                 f"time, {ratio_words(f, s, 'GPT-2')}{mem}")
    return lines


def write_results(path, obj, saved=None):
    """The results as JSON, atomically (a failure leaves no file and no temp file), an error
    naming `path` rather than the temp file; `saved`: what an interrupt then leaves behind."""
    try:
        cli.write_json(path, obj, saved)
    except OSError as e:
        if e.filename and ".tmp" not in os.path.basename(str(e.filename)):
            raise
        raise OSError(e.errno, e.strerror or "could not write", path) from e


# -----------------------------------------------------------------------------
# the report (--report): one fixed protocol for a GPU, in sections. Each section runs in its own
# process (forked from a clean server process that never touches CUDA) with a time limit; it
# writes its rows to a part file after every row (atomically), so a section killed at its limit
# keeps what it measured. The parent merges the parts into one JSON after every section (a
# parent killed in turn loses only the section in flight) and, run again, runs only what is
# missing. results/render.py renders SPEED.md's GPU tables from that JSON.

REPORT_SCHEMA = "nanotost-bench-report/1"
# name: (time limit in seconds, what it measures). Run in this order (the report's priorities).
SECTIONS = {
    "meta": (60, "device, driver, CUDA, torch, Triton, cuDNN, git commit, date"),
    "gpu_check_accuracy": (150, "python -m kernels.gpu_check accuracy: Triton vs float64, beside model.py's error"),
    "gpu_check_determinism": (60, "python -m kernels.gpu_check determinism: two fwd+bwd runs bit for bit"),
    "op": (300, "the TSSA operator fwd+bwd vs SDPA (FlashAttention-2 and cuDNN forced), GPU time, launches"),
    "decode": (420, "per-token decoding 1K..64K: ToST (torch, triton) and GPT-2 (static KV cache), eager, CUDA "
                    "graph, compiled + CUDA graph"),
    "train_tost": (420, "ToST-Base training step (compiled, tssa_impl=torch) at 4K..64K"),
    "train_gpt2_flash": (420, "GPT-2 Base training step (compiled, SDPA forced to FlashAttention-2) at 4K..64K"),
    "train_gpt2_cudnn": (420, "GPT-2 Base training step (compiled, SDPA forced to cuDNN attention) at 4K..64K"),
    "main_job": (600, "200 iterations of config/tost_owt.py, then of config/gpt2_owt.py (synthetic GPT-2 "
                      "tokens): tokens/s, MFU, a profile of each micro-step"),
    "train_tost_triton": (420, "ToST-Base training step (compiled, tssa_impl=triton) at 4K..64K"),
}
DONE = ("ok", "skipped", "failed")  # a section in one of these states is not run again unless named
TRAINING_SHAPE = (16, 1024)  # (B, T) of the operator at the main job's micro-batch (ToST-Base: 16 x 1K)
QUICK = dict(T="64,128", model_T="64", decode_T="32,64", H=2, p=16, repeats=3, warmup=0, decode_steps=4,
             train_tokens=128, main_iters=3)  # a smoke run of every code path, seconds on a CPU
TINY = dict(n_layer=1, n_head=2, n_embd=32)  # the models of a quick report
PRESETS = {"tost": "tost-base", "gpt2": "gpt2"}
SKIP = {  # why a row does not run on this device
    "triton": "the Triton kernels run on CUDA (tests/test_kernels.py runs them under Triton's CPU interpreter)",
    "compiled": "torch.compile rows run on CUDA only (on the CPU a compile per shape outlasts the run)",
    "flash": "FlashAttention-2 is a CUDA kernel",
    "cudnn": "cuDNN attention is a CUDA kernel",
    "captured": "a CUDA graph needs CUDA",
    "gpu_check": "kernels/gpu_check.py checks the Triton kernels on a CUDA GPU",
}


def slug(name):
    """A device name as a file name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split()) or "device"


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def source_digest():
    """sha256 over the code that the figures depend on (bench.py, model.py, train.py, trainkit.py,
    kernels/, the two main configs), to tie a report to a commit where no git checkout travels:
    `python -c "import bench; print(bench.source_digest())"` at a commit gives the same hex."""
    import glob
    import hashlib
    root = os.path.dirname(os.path.abspath(__file__))
    files = ["bench.py", "model.py", "train.py", "trainkit.py", "config/tost_owt.py", "config/gpt2_owt.py"]
    files += sorted(os.path.relpath(f, root) for pattern in ("kernels/*.py", "kernels/*.c")
                    for f in glob.glob(os.path.join(root, pattern)))
    h = hashlib.sha256()
    for name in files:
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                h.update(name.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def _run_text(cmd, cwd=None, timeout=20):
    """stdout of a small command, stripped, or None where it cannot run."""
    import subprocess
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def given_commit(root):
    """NANOTOST_COMMIT, when set: a commit's 40 hex digits, one that git knows where a .git is at
    hand (an unexpanded `$(git rev-parse HEAD)`, a branch name, a short hash: refused); else None."""
    given = os.environ.get("NANOTOST_COMMIT")
    if given is None:
        return None
    cli.require(len(given) == 40 and all(c in "0123456789abcdef" for c in given.lower()),
                f"NANOTOST_COMMIT={given!r} is not a commit (40 hex digits): set it to what `git rev-parse HEAD` "
                "prints, or unset it (the checkout's own git then names the commit)")
    if os.path.exists(os.path.join(root, ".git")) and _run_text(["git", "--version"]) is not None:
        known = _run_text(["git", "cat-file", "-e", f"{given}^{{commit}}"], cwd=root) is not None
        cli.require(known, f"NANOTOST_COMMIT={given} is no commit of the repository at {root}: set it to what "
                           "`git rev-parse HEAD` prints there, or unset it")
    return given.lower()


def collect_meta(C):
    """What a figure depends on besides the code: device, driver, versions, commit, date, load."""
    root = os.path.dirname(os.path.abspath(__file__))
    cuda = C.device.startswith("cuda")
    # NANOTOST_COMMIT, when given, names the commit: a copy of the tree (a device machine's) may
    # carry a .git that is not the commit sent; source_sha256 below identifies the code either way
    given = given_commit(root)
    commit = None if given else _run_text(["git", "rev-parse", "HEAD"], cwd=root)
    dirty = bool(_run_text(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)) if commit else None
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 (any import failure: no Triton here)
        triton_version = None
    cpu = None
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    meta = dict(
        date=now_iso(), device=C.device, dtype=C.dtype, quick=C.quick, python=sys.version.split()[0],
        torch=torch.__version__, cuda=torch.version.cuda, triton=triton_version,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        commit=given or commit, commit_from="NANOTOST_COMMIT" if given else ("git" if commit else None),
        dirty=dirty, source_sha256=source_digest(), cpu=cpu, cpu_threads=torch.get_num_threads(),
        load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    if cuda:
        props = torch.cuda.get_device_properties(C.device)
        driver = _run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        meta.update(name=props.name, gpu=props.name, capability=f"{props.major}.{props.minor}",
                    gpu_memory_gib=round(props.total_memory / 2**30, 1), sm_count=props.multi_processor_count,
                    driver=driver.splitlines()[0] if driver else None)
    else:
        meta.update(name="cpu", gpu=None, driver=None)
    meta["slug"] = slug(meta["name"])
    return meta


def quick_defaults(C, given):
    """A quick report: the tiniest shapes and models (TINY), every code path in seconds."""
    if C.quick:
        for key, value in QUICK.items():
            if key not in given:
                setattr(C, key, value)


class Part:
    """One section's results as its process measures them: rows (each printed and written to
    the part file at once, atomically), the time left before the parent's limit."""

    def __init__(self, name, path, C, limit_s, previous=()):
        self.name, self.path, self.C = name, path, C
        # the rows an earlier run of this section measured before budget_s cut it (same code): kept
        self.previous = {row_key(r): r for r in previous if r.get("status") not in ("not_run", "running")}
        self.cuda = C.device.startswith("cuda")
        self.deadline = time.time() + limit_s
        self.reserve_s = 0.0 if C.quick else 15.0  # time kept for the last write
        self.longest_row_s = 0.0
        self.data = dict(section=name, status="running", started=now_iso(), rows=[])
        self.write()

    def write(self):
        with cli.atomic_write(self.path, "w") as f:
            json.dump(self.data, f, indent=1)

    def row(self, **row):
        row.setdefault("status", "ok")
        self.data["rows"].append(row)
        print(format_report_row(self.name, row), flush=True)
        self.write()
        return row

    def time_left(self):
        return self.deadline - time.time()

    def attempt(self, key, work):
        """Measure one row: work() -> dict of measurements. Out of memory and errors are rows that
        say so; a row that would not fit in the section's remaining time is recorded as not run; a
        row an earlier, cut run of the section measured is kept."""
        old = self.previous.get(row_key(key))
        if old is not None:
            return self.row(**dict(old, kept_from=old.get("kept_from") or self.previous_started))
        if self.time_left() < self.reserve_s + 1.5 * self.longest_row_s:
            return self.row(**key, status="not_run", reason=f"the section's time limit was nearly spent "
                                                            f"({self.time_left():.0f} s left)")
        t0 = time.time()
        try:
            got = work()
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            got = dict(status="oom", reason=f"out of memory ({type(e).__name__})")
        except Exception as e:  # noqa: BLE001 (a measured failure is a row, and the section goes on)
            got = dict(status="failed", reason=f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0][:300]}")
        finally:
            self.longest_row_s = max(self.longest_row_s, time.time() - t0)
            free_memory(self.C)
        return self.row(**key, **got)

    def finish(self, status, **info):
        self.data.update(status=status, finished=now_iso(), **info)
        self.write()


def free_memory(C):
    import gc
    gc.collect()
    if C.device.startswith("cuda"):
        torch.cuda.empty_cache()


def format_report_row(section, r):
    keys = [k for k in ("arch", "impl", "backend", "mode", "B", "T") if k in r]
    what = " ".join(f"{k}={r[k]}" for k in keys)
    if r["status"] != "ok":
        return f"  {section:<22} {what:<44} {r['status']}: {r.get('reason', '')}"
    vals = [f"{k} {r[k]:.4g}" for k in ("ms", "gpu_ms", "kernels", "peak_mb", "tokens_per_s", "mfu")
            if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
    extra = [f"{k}={r[k]}" for k in ("backend_ran",) if r.get(k)]
    return f"  {section:<22} {what:<44} " + ", ".join(vals + extra)


def measure_ms(fn, C, n_calls=None):
    """Median ms per call of fn and the per-repeat values. CUDA: CUDA events around n back-to-back
    calls (n chosen so a repeat lasts ~20 ms: launch gaps included, as a training loop sees them);
    CPU: wall time of single calls (timed)."""
    if not C.device.startswith("cuda"):
        ms, all_ms, _ = timed(fn, C.repeats, C.warmup, C)
        return ms, all_ms
    for _ in range(C.warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one_ms = (time.perf_counter() - t0) * 1e3
    n = n_calls or max(1, min(200, int(20.0 / max(one_ms, 1e-3))))
    times = []
    for _ in range(C.repeats):
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


def profile_device(fn, C, calls=3):
    """device_activity of `calls` runs of fn under torch.profiler (CUDA only; {} elsewhere)."""
    if not C.device.startswith("cuda"):
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


def measure_row(fn, C, profile_calls=3):
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
    sync(C)
    first_s = time.perf_counter() - t0
    ms, all_ms = measure_ms(fn, C)
    row = dict(ms=ms, ms_all=all_ms, first_call_s=round(first_s, 3))
    row.update(profile_device(fn, C, profile_calls))
    with PeakMemory(C) as mem:
        fn()
    row["peak_mb"] = mem.mb
    return row


def plan_lengths(text, fallback):
    return fallback if text == "auto" else [int(t) for t in text.split(",")]


# ---- the sections. Each takes a Part and records rows; skipped rows say why.


def section_meta(S):
    S.data["meta"] = collect_meta(S.C)


def section_gpu_check(S, mode):
    """python -m kernels.gpu_check MODE <json>: its JSON is kept as it is written (rows: one per
    accuracy row, or one for determinism); a failure is a row with the end of its output."""
    import subprocess
    if not S.cuda:
        S.row(mode=mode, status="skipped", reason=SKIP["gpu_check"])
        return
    root = os.path.dirname(os.path.abspath(__file__))
    out = S.path + f".{mode}.json"
    try:
        done = subprocess.run([sys.executable, "-m", "kernels.gpu_check", mode, out], cwd=root, capture_output=True,
                              text=True, timeout=max(5.0, S.time_left() - 5))
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-1500:]
        S.row(mode=mode, status="failed", reason="kernels/gpu_check.py did not finish in the section's time",
              output_tail=tail.decode(errors="replace") if isinstance(tail, bytes) else tail)
        return
    if done.returncode != 0 or not os.path.isfile(out):
        S.row(mode=mode, status="failed", reason=f"kernels/gpu_check.py exited with {done.returncode}",
              output_tail=(done.stdout + done.stderr)[-1500:])
        return
    with open(out) as f:
        result = json.load(f)
    S.data["result"] = result
    rows = result.get("result")
    for r in (rows if isinstance(rows, list) else [rows]):
        S.row(**{"mode": mode, **(r if isinstance(r, dict) else dict(value=r))})


def op_closure(C, impl, B, T_):
    """fwd+bwd of one operator call at (B, H, T_, p): TSSA by impl, or SDPA with a forced backend."""
    H, width = C.H, C.H * C.p
    kw = dict(device=C.device, dtype=tk.DTYPES[C.dtype])
    heads = lambda x: model.split_heads(x, H)  # noqa: E731 (the (B, H, T, p) views model.py hands over)
    g = heads(torch.randn(B, T_, width, **kw))  # dL/dout, as it comes back through the output projection
    if impl.startswith("sdpa"):
        backend = impl.split("_", 1)[1] if "_" in impl else "default"
        qkv = torch.randn(B, T_, 3 * width, **kw, requires_grad=True)  # c_attn's output
        q, k, v = (heads(t) for t in qkv.chunk(3, dim=-1))

        def run():
            qkv.grad = None
            with forced(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        return run
    x = torch.randn(B, T_, width, **kw, requires_grad=True)  # c_in's output
    w = heads(x)
    temp = torch.ones(H, device=C.device, requires_grad=True)
    bias = (0.01 * torch.randn(H, T_, device=C.device)).requires_grad_()
    ops = kernels.ops_for("torch" if impl == "compiled" else impl)
    fn = ops.causal_tssa
    if impl == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(lambda w_, t_, b_: ops.causal_tssa(w_, t_, b_), dynamic=False)

    def run():
        x.grad = temp.grad = bias.grad = None
        fn(w, temp, bias).backward(g)
    return run


def section_op(S):
    C = S.C
    lengths = plan_lengths(C.T, [])
    shapes = [(C.B, t) for t in lengths] + ([TRAINING_SHAPE] if not C.quick else [(4, lengths[0])])
    if not C.quick:  # the targets' shapes first, so that a cut section still has them
        first = [(1, 16384), TRAINING_SHAPE]
        shapes = [s for s in first if s in shapes] + [s for s in shapes if s not in first]
    impls = ["triton", "compiled", "torch", "sdpa_flash", "sdpa_cudnn"] if S.cuda else \
        ["cpu", "torch", "sdpa", "triton", "compiled", "sdpa_flash", "sdpa_cudnn"]
    S.data.update(H=C.H, p=C.p, dtype=C.dtype, mode="fwdbwd", causal=True)
    for B, T_ in shapes:
        for impl in impls:
            key = dict(impl=impl, B=B, T=T_)
            why = None if S.cuda else SKIP.get(impl.replace("sdpa_", ""))
            if why:
                S.row(**key, status="skipped", reason=why)
                continue

            def work():
                row = measure_row(op_closure(C, impl, B, T_), C)
                if impl.startswith("sdpa"):
                    row["backend_ran"] = attention_ran(row.get("top_kernels"))
                if impl in ("cpu", "triton"):
                    note = fallback_note(impl)
                    if note:
                        row.update(status="fell_back", reason=note)
                return row
            S.attempt(key, work)


def build_gpt(C, arch, block_size, impl="torch"):
    """ToST-Base (arch 'tost', TSSA by impl) or GPT-2 Base ('gpt2'); the TINY shape in a quick
    report. GPT-2's vocabulary padded to 50304 as train.py pads it. Both compute the loss in
    chunks (kernels/cross_entropy.py): neither holds the (B, T, V) logits at a long context."""
    over = dict(block_size=block_size, vocab_size=50304, **(TINY if C.quick else {}))
    m = model.GPT.from_preset(PRESETS[arch], **over)
    return kernels.use(m, impl if arch == "tost" else "torch", chunked_loss=True)


DECODE_CONTEXTS = [1024, 65536, 4096, 16384, 32768]  # the two ends of the target first
DECODE_MODES = {"compiled": "torch.compile of GPT.step replayed as a CUDA graph (kernels.CompiledStep)",
                "captured": "GPT.step op by op, replayed as a CUDA graph (kernels.CapturedStep)",
                "eager": "GPT.step op by op"}


def decode_cases(contexts):
    """(arch, impl, mode, T) of every decode row, the target's first (a cut section keeps them):
    each of DECODE_MODES at every context, for ToST-Base by tssa_impl (torch: model.py's step;
    triton: the fused step kernel) and GPT-2 Base."""
    for mode in DECODE_MODES:
        for T_ in contexts:
            for arch, impl in (("tost", "torch"), ("tost", "triton"), ("gpt2", None)):
                yield arch, impl, mode, T_


def section_decode(S):
    """One token at a time after T tokens: ToST from its recurrent state, GPT-2 from a static KV
    cache of T + a few tokens; bf16 weights on CUDA (model.to(dtype), no autocast: an inference
    copy); eager, replayed as a CUDA graph, and compiled then replayed (DECODE_MODES). The
    states are synthetic (filled as if T tokens had been read): the cost does not depend on
    their values. Every ToST model is built for the longest context, so its compiled step is
    compiled once and serves every context (its cost does not depend on block_size)."""
    C = S.C
    dtype = tk.DTYPES[C.dtype]
    contexts = plan_lengths(C.decode_T, DECODE_CONTEXTS)
    S.data.update(modes=DECODE_MODES, dtype=C.dtype)
    # GPT.step's compiled graphs: ToST's two (torch, triton) and GPT-2's, one per KV length; past
    # the limit Dynamo would run the step uncompiled, under a "compiled" label
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 + len(contexts) + 2)
    for arch, impl, mode, T_ in decode_cases(contexts):
        key = {k: v for k, v in dict(arch=arch, impl=impl, mode=mode, T=T_, B=1).items() if v is not None}
        why = None if S.cuda else SKIP.get(impl if impl == "triton" else mode)
        if why:
            S.row(**key, status="skipped", reason=why)
            continue
        S.attempt(key, lambda: decode_row(C, arch, impl, mode, T_, max(contexts), dtype))


def decode_row(C, arch, impl, mode, T_, longest, dtype):
    steps = C.decode_steps
    m = build_gpt(C, arch, (longest if arch == "tost" else T_) + steps + 8, impl or "torch").to(C.device, dtype).eval()
    state = m.init_state(1)
    cfg = m.config
    for s in state.layers:  # as if T_ tokens had been prefilled
        if arch == "gpt2":
            shape = (1, cfg.n_head, s.max_len, cfg.n_embd // cfg.n_head)
            s.k, s.v = (torch.randn(shape, device=C.device, dtype=dtype) for _ in range(2))
        else:
            s.sum_sq.uniform_(1, 2).mul_(T_)
            s.sum_pi_sq.uniform_(1, 2).mul_(T_ / cfg.n_head)
            s.sum_pi.fill_(T_ / cfg.n_head)
    tok = torch.randint(0, 50257, (1, 1), device=C.device)
    stepper = dict(compiled=kernels.CompiledStep, captured=kernels.CapturedStep).get(mode)
    step = stepper(m.step) if stepper else m.step  # (tok, state) -> logits

    def tokens():  # `steps` tokens from context T_ (the position set back first: a device write)
        state.pos.fill_(T_)
        for _ in range(steps):
            step(tok, state)
    with torch.no_grad():
        row = measure_row(tokens, C, profile_calls=1)
    for k in ("ms", "gpu_ms", "kernels", "memops"):
        if isinstance(row.get(k), float):
            row[k] /= steps  # per token
    row["ms_all"] = [t / steps for t in row["ms_all"]]
    row["top_kernels"] = [[n, c / steps, t / steps] for n, c, t in row.get("top_kernels", [])]
    row.update(state_mb=sum(s.nbytes() for s in state.layers) / 2**20, tokens_per_timing=steps, dtype=C.dtype)
    note = fallback_note(impl)
    if note:
        row.update(status="fell_back", reason=note)
    return row


def section_train(S, arch, impl=None, backend=None):
    """The training step (forward, backward, AdamW) of ToST-Base or GPT-2 Base at each length,
    the batch chosen so every row holds train_tokens tokens; compiled on CUDA (a fresh compile per
    row: torch._dynamo.reset()), eager on the CPU. bf16 autocast, fused AdamW on CUDA."""
    C = S.C
    order = plan_lengths(C.model_T, [4096, 16384, 65536, 8192, 32768])  # targets first
    S.data.update(train_tokens=C.train_tokens, compiled=S.cuda, dtype=C.dtype)
    for T_ in order:
        B = max(1, C.train_tokens // T_)
        key = {k: v for k, v in dict(arch=arch, impl=impl, backend=backend, T=T_, B=B).items() if v is not None}
        if arch == "tost" and impl == "triton" and not S.cuda:
            S.row(**key, status="skipped", reason=SKIP["triton"])
            continue
        if backend in ("flash", "cudnn") and not S.cuda:
            S.row(**key, status="skipped", reason=SKIP[backend])
            if backend == "flash":  # the CPU still runs the step's code path, with SDPA's own choice
                S.attempt(dict(key, backend="default"), lambda: train_row(C, arch, impl or "torch", "default", T_, B))
            continue
        S.attempt(key, lambda: train_row(C, arch, impl or "torch", backend, T_, B))


def train_row(C, arch, impl, backend, T_, B):
    cuda = C.device.startswith("cuda")
    device_type = "cuda" if cuda else "cpu"
    if cuda:
        torch._dynamo.reset()
    m = build_gpt(C, arch, T_, impl).to(C.device)
    opt = tk.configure_adamw(m, 0.1, 6e-4, (0.9, 0.95), device_type)
    fwd = torch.compile(m) if cuda else m
    idx = torch.randint(0, 50257, (B, T_), device=C.device)
    tgt = torch.randint(0, 50257, (B, T_), device=C.device)
    amp = C.dtype != "float32"
    with forced(backend):
        from torch.backends import cuda as sdp
        flags = dict(flash=sdp.flash_sdp_enabled(), cudnn=sdp.cudnn_sdp_enabled(),
                     efficient=sdp.mem_efficient_sdp_enabled(), math=sdp.math_sdp_enabled())

    def step():
        with forced(backend), torch.autocast(device_type, dtype=tk.DTYPES[C.dtype], enabled=amp):
            _, loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    compile_error, t0 = None, time.perf_counter()
    if cuda:  # a compile that fails (an Inductor bug) leaves an eager row that says so, not a gap
        try:
            step()
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            compile_error = f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0][:300]}"
            torch._dynamo.reset()
            opt.zero_grad(set_to_none=True)
            fwd = m
    compile_s = round(time.perf_counter() - t0, 1) if cuda else None
    row = measure_row(step, C, profile_calls=1)
    row["compile_s"] = compile_s  # the first step, compile included (a failed compile: its time to fail)
    if compile_error:
        row.update(status="eager", reason=f"torch.compile failed ({compile_error}); measured eager")
    row.update(tokens=B * T_, tokens_per_s=B * T_ / (row["ms"] / 1e3), compiled=cuda and not compile_error,
               tssa_impl=impl if arch == "tost" else None, preset="tiny" if C.quick else PRESETS[arch],
               params_m=round(m.get_num_params() / 1e6, 2))
    if cuda:
        row["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20  # everything: weights, Adam, activations
    row["peak_is"] = "all allocated at the step's peak" if cuda else "growth during the step (CPU, sampled)"
    if arch == "gpt2":
        row.update(backend_ran=attention_ran(row.get("top_kernels")), sdp_enabled=flags)
    return row


MAIN_JOBS = (("tost", "config/tost_owt.py"), ("gpt2", "config/gpt2_owt.py"))  # ToST's job, GPT-2's beside it
# kernel names -> what they compute, first match wins (Inductor names a fused kernel after its ops)
KERNEL_KINDS = (("tssa", ("cumsum", "tssa", "_k_")), ("attention", ("flash", "fmha", "cudnn", "attention")),
                ("loss", ("cross_entropy", "nll_loss", "log_softmax", "logsumexp")),
                ("matmuls", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "matmul", "sm80_", "sm90_", "ampere")))


def section_main_job(S):
    """train.py with config/tost_owt.py (tssa_impl=main_tssa_impl), and config/gpt2_owt.py
    beside it, as each GPU of the recipe's 8 runs them (batch 12 x 5 micro-steps = 61,440 tokens
    per iteration), main_iters iterations, compiled on CUDA, on a synthetic dataset written here
    (uniform random GPT-2 token ids; meta.json as prepare_openwebtext.py writes it): throughput
    does not depend on the token values. tokens/s and MFU are the medians of train.py's
    log.jsonl after the first iterations. On CUDA each row also holds a profile of the same
    model's compiled micro-step (main_job_profile: top kernels, shares by kind)."""
    import numpy as np
    C = S.C
    work = S.path + ".main_job"
    data = os.path.join(work, "data", "synthetic_gpt2")
    os.makedirs(data, exist_ok=True)
    counts = dict(train=1 << 12 if C.quick else 1 << 23, val=1 << 12 if C.quick else 1 << 20)
    rng = np.random.default_rng(0)
    for split, n in counts.items():
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(os.path.join(data, f"{split}.bin"))
    with open(os.path.join(data, "meta.json"), "w") as f:
        json.dump(dict(dataset="synthetic_gpt2", tokenizer="gpt2", vocab_size=50257, eot_token=50256,
                       source="bench.py main_job: uniform random token ids (synthetic)", splits=counts,
                       command="python bench.py --report --sections=main_job"), f, indent=1)
    S.data.update(data="synthetic: uniform random GPT-2 token ids (throughput does not depend on their values)",
                  tssa_impl=C.main_tssa_impl)
    for arch, config in MAIN_JOBS:
        key = dict(arch=arch, impl=C.main_tssa_impl if arch == "tost" else None)
        S.attempt({k: v for k, v in key.items() if v is not None}, lambda: main_job_row(S, work, arch, config))
    import shutil
    shutil.rmtree(work, ignore_errors=True)  # the checkpoint of a real model is ~1.3 GB


def main_job_args(C, work, arch, config):
    """train.py's command line for one main job (the quick report's: a tiny model, 3 iterations)."""
    iters = C.main_iters
    args = [config, f"--data_dir={os.path.join(work, 'data')}", "--dataset=synthetic_gpt2",
            f"--out_dir={os.path.join(work, 'out-' + arch)}", f"--max_iters={iters}", f"--eval_interval={iters}",
            "--eval_iters=1", "--log_interval=1", f"--device={C.device}", f"--dtype={C.dtype}",
            f"--compile={C.device.startswith('cuda')}", "--wandb_log=False"]
    args += [f"--tssa_impl={C.main_tssa_impl}"] if arch == "tost" else []
    args += ["--gradient_accumulation_steps=5"] if not C.quick else \
        ["--gradient_accumulation_steps=1", "--batch_size=2", "--block_size=32"] + \
        [f"--{k}={v}" for k, v in TINY.items()]
    return args


def main_job_row(S, work, arch, config):
    """One train.py run: its median tokens/s and MFU after the warm-up iterations, and (CUDA) the profile."""
    import re
    import subprocess
    C = S.C
    root = os.path.dirname(os.path.abspath(__file__))
    iters, args = C.main_iters, main_job_args(C, work, arch, config)
    shown = [a for a in args if not a.startswith(("--data_dir", "--out_dir"))]  # (temporary folders)
    if arch == "tost":
        S.data["command"] = "python train.py " + " ".join(shown)
    t0 = time.time()
    log_path = os.path.join(work, f"train-{arch}.log")
    with open(log_path, "w") as log:
        try:
            done = subprocess.run([sys.executable, "train.py"] + args, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=max(5.0, S.time_left() - 10))
            rc = done.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(log_path) as f:
        tail_all = f.read()
    records = []
    path = os.path.join(work, "out-" + arch, "log.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if r.get("tokens_per_s") is not None]
    skip = 1 if C.quick else min(20, iters // 4)  # compile and warm-up
    steady = [r for r in steps if r["iter"] >= skip]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    said = re.search(r"([\d,]+) tokens per iteration", tail_all)
    row = dict(config=config, command="python train.py " + " ".join(shown), iters=iters,
               tokens_per_iter=int(said.group(1).replace(",", "")) if said else None, wall_s=round(time.time() - t0, 1),
               iters_logged=len(steps), steady_from_iter=skip, tokens_per_s=med([r["tokens_per_s"] for r in steady]),
               mfu=med(mfus), tokens_per_s_all=[r["tokens_per_s"] for r in steps], compiled=S.cuda)
    if rc != 0 or not steady:
        why = "did not finish in the section's time" if rc == "timeout" else f"exit code {rc}"
        row.update(status="failed", reason=f"train.py: {why}" + ("" if steady else "; no iterations logged"),
                   output_tail=tail_all[-2000:])
        return row
    if row["mfu"] is None:
        row["mfu_note"] = "train.py reports MFU on CUDA only" if not S.cuda else "unknown device peak"
    fell_back = re.search(r"tssa_impl='(?:auto|triton)': ([^;\n]*)", tail_all)
    row["tssa_fallback"] = fell_back.group(1)[:300] if fell_back else None
    if S.cuda and S.time_left() > 60:
        row["profile"] = main_job_profile(C, arch)
    return row


def main_job_profile(C, arch):
    """Where a micro-step of the main job spends the GPU: the same model and batch (12 x 1K, bf16
    autocast, compiled, the loss as train.py computes it by default), forward and backward under
    torch.profiler. Returns GPU ms per micro-step, the top kernels and each KERNEL_KINDS share."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch._dynamo.reset()
    m = model.GPT.from_preset(PRESETS[arch], block_size=1024, vocab_size=50304)
    m = kernels.use(m, C.main_tssa_impl if arch == "tost" else "torch").to(C.device)
    fwd = torch.compile(m)
    idx = torch.randint(0, 50257, (12, 1024), device=C.device)

    def micro_step():
        with torch.autocast("cuda", dtype=tk.DTYPES[C.dtype]):
            _, loss = fwd(idx, idx)
        loss.backward()
    for _ in range(2):  # compile, then warm
        micro_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            micro_step()
        torch.cuda.synchronize()
    return kernel_shares([(e.name, e.time_range.end - e.time_range.start) for e in prof.events()
                          if e.device_type == DeviceType.CUDA], calls=3)


def kernel_shares(kernels_us, calls):
    """[(kernel name, us)] -> gpu_ms per call, the top 10 kernels, and the share of each
    KERNEL_KINDS kind (the rest: elementwise, norms, the optimizer's kernels, copies)."""
    by_name, by_kind = {}, {kind: 0.0 for kind, _ in KERNEL_KINDS + (("rest", ()),)}
    for name, us in kernels_us:
        by_name[name] = by_name.get(name, 0.0) + us
        low = name.lower()
        by_kind[next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "rest")] += us
    total = sum(by_name.values()) or 1.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    return dict(gpu_ms=total / 1e3 / calls, top_kernels=[[n[:120], us / 1e3 / calls] for n, us in top],
                shares={kind: round(us / total, 4) for kind, us in by_kind.items()})


SECTION_FUNCS = {
    "meta": section_meta,
    "gpu_check_accuracy": lambda S: section_gpu_check(S, "accuracy"),
    "gpu_check_determinism": lambda S: section_gpu_check(S, "determinism"),
    "op": section_op,
    "decode": section_decode,
    "train_tost": lambda S: section_train(S, "tost", impl="torch"),
    "train_gpt2_flash": lambda S: section_train(S, "gpt2", backend="flash"),
    "train_gpt2_cudnn": lambda S: section_train(S, "gpt2", backend="cudnn"),
    "main_job": section_main_job,
    "train_tost_triton": lambda S: section_train(S, "tost", impl="triton"),
}


def row_key(row):
    """What identifies a row within its section (not its measurements)."""
    return tuple((k, row.get(k)) for k in ("arch", "impl", "backend", "mode", "B", "T"))


def run_section(name, C, path, limit_s, hang=False, previous=None):
    """The body of one section's process: its own process group (the parent ends the whole group
    at the limit, children such as train.py included), then the section, then the part's status."""
    os.setsid()
    C.device, C.dtype = tk.choose_device_dtype(C.device, C.dtype)
    if C.threads:
        torch.set_num_threads(C.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as train.py
    S = Part(name, path, C, limit_s, (previous or {}).get("rows", ()))
    S.previous_started = (previous or {}).get("started")
    try:
        if hang:  # the test hook NANOTOST_BENCH_HANG=<section>: a section that never ends
            print(f"  {name}: hanging (NANOTOST_BENCH_HANG)", flush=True)
            time.sleep(10 ** 6)
        SECTION_FUNCS[name](S)
        rows = S.data["rows"]
        whole = rows and all(r["status"] == "skipped" for r in rows)
        cut = [r for r in rows if r["status"] == "not_run"]
        if cut:
            S.finish("timed_out", reason=f"its time limit came before {len(cut)} of {len(rows)} rows")
        else:
            S.finish("skipped" if whole else "ok", **({"reason": rows[0]["reason"]} if whole else {}))
    except BaseException as e:
        import traceback
        S.finish("failed", reason=f"{type(e).__name__}: {str(e).strip()[:300]}",
                 traceback=traceback.format_exc()[-3000:])
        raise SystemExit(1) from None


def section_limits(C, names):
    """Each section's time limit in seconds: its own (SECTIONS), or section_s ("300" for all,
    "op:200,decode:100" for some)."""
    limits = {n: float(SECTIONS[n][0]) for n in names}
    text = C.section_s.strip()
    if not text:
        return limits
    for part in text.split(","):
        key, sep, value = part.strip().rpartition(":")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        cli.require(0 < seconds < 10 ** 7 and (not sep or key in SECTIONS), f"section_s must be seconds ('300') or "
                                                                  f"section:seconds pairs ('op:200,decode:100'), got "
                                                                  f"{C.section_s!r}")
        for n in ([key] if sep else names):
            if n in limits:
                limits[n] = seconds
    return limits


def run_child(ctx, name, C, tmp, limit_s, previous=None):
    """Run one section in its own process with a time limit (previous: a part whose measured rows
    it keeps). Returns its part: its rows, and its status (ok, skipped, failed, timed_out), wall
    time and limit."""
    import bench  # the module (not __main__): the forkserver's children import it by name
    path = os.path.join(tmp, f"{name}.json")
    hang = os.environ.get("NANOTOST_BENCH_HANG") == name
    p = ctx.Process(target=bench.run_section, args=(name, C, path, limit_s, hang, previous), daemon=False)
    t0 = time.time()
    interrupted = False
    try:
        p.start()
        p.join(limit_s)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) reaches this process only: the section has its own group
        interrupted = True
    timed_out = p.is_alive() and not interrupted
    if p.pid is not None and p.is_alive():  # its whole process group: train.py, gpu_check, compile workers too
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):  # (no group: it had not called setsid yet)
                if p.is_alive():
                    p.kill()
            p.join(5)
    part = dict(section=name, status="failed", rows=[])
    if os.path.isfile(path):  # written whole by the section (atomic_write): its rows so far
        part = cli.read_json(path, "a bug: the section's process wrote it")
    part.update(wall_s=round(time.time() - t0, 1), limit_s=limit_s)
    if interrupted:
        part.update(status="interrupted", reason="interrupted (Ctrl-C or SIGTERM); the rows measured before are "
                                                 "kept, and the same command runs the rest")
    elif timed_out:
        part.update(status="timed_out", reason=f"stopped at its time limit of {limit_s:.0f} s; the rows "
                                               f"measured before are kept")
    elif part.get("status") in ("running", "failed") and p.exitcode != 0 and not part.get("reason"):
        part.update(status="failed", reason=f"its process ended with exit code {p.exitcode}")
    return part


def report_out(C, meta):
    """The merged JSON's path: --out, else under the ignored out-bench/: <gpu>.json for a full
    CUDA report, <gpu>-quick.json or cpu-report.json otherwise; an --out ending in / is the
    folder for that name. The committed results/<gpu>.json is written only when named
    (--out=results/): no run replaces it by default."""
    name = "cpu-report" if not meta["gpu"] else meta["slug"] + ("-quick" if C.quick else "")
    if C.out == "auto" or C.out.endswith(("/", os.sep)):
        return os.path.join("out-bench" if C.out == "auto" else C.out, f"{name}.json")
    return C.out


def load_report(path, meta):
    """The report already at path (to continue), or a new one; one of another device or kind
    (quick or full) is refused."""
    if not os.path.isfile(path):
        return dict(schema=REPORT_SCHEMA, meta=meta, runs=[], sections={})
    old = read_report(path)
    old_meta = old["meta"]
    if (old_meta.get("slug"), bool(old_meta.get("quick"))) != (meta["slug"], bool(meta["quick"])):
        raise cli.UserError(f"{path} holds a {'quick ' if old_meta.get('quick') else ''}report of "
                            f"{old_meta.get('name')!r}, not of this {'quick ' if meta['quick'] else ''}run on "
                            f"{meta['name']!r}: choose another --out")
    return old


def read_report(path):
    """The report at path, its fields checked (one line naming the file and the field)."""
    fix = "restore it (git checkout, or a copy), or choose another --out"
    old = cli.read_json(path, fix)
    cli.require(old.get("schema") == REPORT_SCHEMA, f"{path} is not a report of bench.py (schema "
                                                    f"{old.get('schema')!r}): choose another --out")
    with cli.reading(path, fix):  # the fields run_report reads, each of its type
        _ = dict(old["meta"]), list(old["runs"])
        _ = {name: (part.get("status"), [row["status"] for row in part["rows"]])
             for name, part in dict(old["sections"]).items()}
    return old


def is_done(part):
    """A section that a new run (sections=all) does not repeat: done, or timed out at its own
    limit (not cut short by budget_s)."""
    if not part:
        return False
    return part.get("status") in DONE or (part.get("status") == "timed_out" and not part.get("cut_by_budget"))


def rows_to_keep(C, old, meta):
    """The earlier part of a section about to run again whose measured rows it keeps: those
    measured by the same code (source_sha256), unless --remeasure. Only the missing rows (not run
    before a limit, or never tried) are measured; a cut section thus continues where it stopped."""
    if C.remeasure or not old or old.get("source_sha256") != meta["source_sha256"]:
        return None
    return old


def run_report(C):
    """--report: the sections in their own processes, merged into one JSON (module comment above)."""
    import multiprocessing
    import shutil
    import subprocess
    import tempfile
    chosen = list(SECTIONS) if C.sections == "all" else C.sections.split(",")
    limits = section_limits(C, list(SECTIONS))
    C.device, _ = tk.choose_device_dtype(C.device, "float32")  # checks the device; no CUDA here (the sections')
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench"])
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="nanotost-report-")
    try:
        meta_part = run_child(ctx, "meta", C, tmp, limits["meta"])
        if meta_part["status"] == "interrupted":
            raise KeyboardInterrupt
        meta = meta_part.get("meta")
        if meta_part["status"] != "ok" or not meta:
            raise cli.UserError(f"the meta section {meta_part['status']}: {meta_part.get('reason', '')}")
        out = report_out(C, meta)
        cli.claim_output(out, "--out=<another file>")  # one report at a time into one file
        merged = load_report(out, meta)
        merged["meta"] = meta
        merged["sections"]["meta"] = meta_part
        run = dict(started=meta["date"], commit=meta["commit"], source_sha256=meta["source_sha256"],
                   argv=C.argv, sections=[])
        merged["runs"].append(run)
        print(f"report on {meta['name']} ({C.device}, {meta['dtype']}), torch {meta['torch']}, commit "
              f"{(meta['commit'] or 'unknown')[:10]}: {out}", flush=True)
        for name in [n for n in SECTIONS if n in chosen and n != "meta"]:
            old = merged["sections"].get(name)
            if C.sections == "all" and is_done(old):
                print(f"[{name}] kept from {out} ({old['status']}, run {old.get('started', '?')}); name it in "
                      f"--sections to run it again", flush=True)
                continue
            limit = limits[name]
            left = C.budget_s - (time.time() - t_start) - 10 if C.budget_s else float("inf")
            if left < min(limit, 60.0):
                merged["sections"][name] = old if old and old.get("status") != "not_run" else dict(
                    section=name, status="not_run", rows=[], reason=f"budget_s={C.budget_s:g} was spent before "
                                                                     f"it could start; run the command again")
                print(f"[{name}] not run: budget_s spent", flush=True)
                continue
            print(f"[{name}] {SECTIONS[name][1]} (limit {min(limit, left):.0f} s)", flush=True)
            part = run_child(ctx, name, C, tmp, min(limit, left), rows_to_keep(C, old, meta))
            part.update(cut_by_budget=left < limit, commit=meta["commit"], source_sha256=meta["source_sha256"])
            merged["sections"][name] = part
            run["sections"].append(name)
            counts = {}
            for r in part.get("rows", []):
                counts[r["status"]] = counts.get(r["status"], 0) + 1
            print(f"[{name}] {part['status']} in {part['wall_s']:.0f} s: " + (", ".join(
                f"{n} {s}" for s, n in counts.items()) or "no rows") + (f" ({part['reason']})" if part.get("reason")
                                                                       else ""), flush=True)
            write_results(out, merged, saved=f"{out} holds the sections measured so far; the same command runs "
                                             "what is missing")
            if part["status"] == "interrupted":
                raise KeyboardInterrupt
        for name in SECTIONS:
            merged["sections"].setdefault(name, dict(section=name, status="not_run", rows=[],
                                                     reason="not in this run's --sections"))
        run["finished"] = now_iso()
        write_results(out, merged)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if C.budget_s and not run["sections"] and any(n in chosen and merged["sections"][n]["status"] == "not_run"
                                                  for n in SECTIONS):
        raise cli.UserError(f"budget_s={C.budget_s:g} was spent before any section could start (meta took "
                            f"{meta_part['wall_s']:.0f} s): give a larger --budget_s, or 0 for no limit")
    missing = [n for n in SECTIONS if not is_done(merged["sections"][n])]
    stopped = [n for n in SECTIONS if merged["sections"][n]["status"] in ("timed_out", "failed") and n not in missing]
    print(f"\nwrote {out}", flush=True)
    root = os.path.dirname(os.path.abspath(__file__))
    shown = subprocess.run([sys.executable, os.path.join(root, "results", "render.py"), "--show=gpu_*",
                            f"--json_path={out}"], capture_output=True, text=True)
    print(shown.stdout + (f"(results/render.py failed: {shown.stderr.strip()[-500:]})" if shown.returncode else ""))
    statuses = ", ".join(f"{n} {merged['sections'][n]['status']}" for n in SECTIONS)
    print(f"sections: {statuses}")
    if missing:
        print(f"not complete: {', '.join(missing)}: the same command runs what is missing and keeps the rest")
    if stopped:
        print(f"timed out or failed: {', '.join(stopped)} (kept as they are; name them in --sections to run their "
              f"missing rows)")
    return merged


def main(argv):
    argv = [a + "=1" if a in ("--quick", "--report") else a for a in argv]
    C, given = cli.configure(DEFAULTS, argv)
    C.argv = list(argv)
    if C.report:
        quick_defaults(C, given)
        check_settings(C)
        given_commit(os.path.dirname(os.path.abspath(__file__)))  # before any work (meta records it)
        if C.out != "auto" and not C.out.endswith(("/", os.sep)):
            cli.claim_output(C.out, "--out=<another file>")
            if os.path.isfile(C.out):
                read_report(C.out)  # a damaged one: said before the sections run
        return run_report(C)
    if C.quick:  # a short run; settings given explicitly still win
        for key, value in dict(T="1024,4096,16384", suites="op,decode", repeats=3).items():
            if key not in given:
                setattr(C, key, value)
    plan = check_settings(C)
    if C.out == "auto":
        C.out = "bench_results.json"
    cli.claim_output(C.out, "--out=<another file>")  # one run at a time into one file
    C.device, C.dtype = tk.choose_device_dtype(C.device, C.dtype)
    if C.threads:
        torch.set_num_threads(C.threads)
    cuda = C.device.startswith("cuda")
    impl_list = plan["impls"] or ["torch", "triton" if cuda else "cpu", "sdpa"]
    model_T = plan["model_T"] or ([1024, 2048, 4096, 8192] if cuda else [1024])
    decode_T = plan["decode_T"] or [t for t in plan["T"] if cuda or t <= 16384]
    name = torch.cuda.get_device_name(C.device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    bw = copy_bandwidth(C)
    print(f"device: {name}; dtype {C.dtype}; B={C.B} H={C.H} p={C.p} causal={C.causal}; "
          f"copy bandwidth {bw:.1f} GB/s; torch {torch.__version__}; impls {','.join(impl_list)}")
    results = []
    print(_HEADER)
    for suite in plan["suites"]:
        Ts = {"model": model_T, "model_decode": decode_T}.get(suite, plan["T"])
        run_suite(C, suite, impl_list, plan["modes"], Ts, results, bw)
    lines = summary(results)
    if lines:
        print("\n" + "\n".join(lines))
    meta = dict(device=name, dtype=C.dtype, copy_gbps=bw, torch=torch.__version__,
                config={k: v for k, v in vars(C).items() if k != "argv"},
                load_average=os.getloadavg() if hasattr(os, "getloadavg") else None)
    write_results(C.out, dict(meta=meta, results=results, summary=lines))
    print(f"\nwrote {C.out}")
    if not any(r.get("ms") is not None for r in results):  # nothing was measured: not a success
        why = lines[0] if did_not_run(results) else \
            "the settings select none: on the CPU, decode_T=auto keeps the T up to 16384; give --decode_T"
        raise cli.UserError(f"no case ran: {why}; the rows are in {C.out}")


if __name__ == "__main__":
    cli.run_cli(main, sys.argv[1:])
