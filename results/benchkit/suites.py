"""
results/benchkit/suites.py: bench.py without --report or --headline: tables for any device, shape and
implementation (the suites op, decode, model, model_decode, vit), printed row by row, with the
ratios the targets are stated in, and their JSON (bench_results.json, or --out).

    python bench.py --quick=1                        # operator + decode, T = 1K, 4K, 16K
    python bench.py --suites=op --impls=torch,cpu,sdpa --T=16384 --modes=fwdbwd --threads=2
"""

import torch
import torch.nn.functional as F

import kernels
import model
from results.benchkit.part import fallback_note, write_results
from results.benchkit.settings import check_settings
from results.benchkit.timing import PeakMemory, copy_bandwidth, sdpa_backend, timed
from results.markdown import ratio_words
from nanotost import cli, devices, outputs, portable
from nanotost import trainkit as tk

def split_heads(x, cfg):  # (B, T, H p) -> (B, H, T, p), the layout model.py hands to the operator
    return x.view(x.shape[0], x.shape[1], cfg.H, cfg.p).transpose(1, 2)


def op_case(cfg, impl, mode, T_):
    """A closure running one operator call (and backward) at length T_, plus a note."""
    B, H, width = cfg.B, cfg.H, cfg.H * cfg.p
    kw = dict(device=cfg.device, dtype=devices.DTYPES[cfg.dtype])
    note = ""
    if impl == "sdpa":
        qkv = torch.randn(B, T_, 3 * width, **kw, requires_grad=mode == "fwdbwd")
        q, k, v = (split_heads(t, cfg) for t in qkv.chunk(3, dim=-1))
        name, force = sdpa_backend(q, k, v, cfg.causal)
        note = f"backend={name}"

        def op():
            with force():
                return F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal)
        leaf = qkv
    else:
        x = torch.randn(B, T_, width, **kw, requires_grad=mode == "fwdbwd")
        w = split_heads(x, cfg)
        temp = torch.ones(H, device=cfg.device, requires_grad=mode == "fwdbwd")
        bias = torch.zeros(H, T_, device=cfg.device, requires_grad=mode == "fwdbwd")
        ops = kernels.ops_for("torch" if impl == "compiled" else impl)
        if cfg.causal:
            fn = lambda w_, t_, b_: ops.causal_tssa(w_, t_, b_)
        else:
            fn = lambda w_, t_, b_: ops.tssa(w_, t_)
        if impl == "compiled":
            fn = torch.compile(fn)
        op = lambda: fn(w, temp, bias)
        leaf = x
    g = split_heads(torch.randn(B, T_, width, **kw), cfg)  # dL/dout as it comes back through the output projection
    if mode == "fwd":
        def run():
            with torch.no_grad():
                op()
    else:
        def run():
            leaf.grad = None
            op().backward(g)
    return run, note


def tssa_floor(cfg, mode, T_):
    """Bytes a perfect causal TSSA must move: 2 (forward) or 5 (forward+backward) tensors of C
    values per token, in the input dtype."""
    return (2 if mode == "fwd" else 5) * cfg.B * T_ * cfg.H * cfg.p * torch.finfo(devices.DTYPES[cfg.dtype]).bits // 8


def decode_case(cfg, impl, T_):
    """One generated token at context T_: the TSSA recurrent step or SDPA over a KV cache."""
    B, H, p, decode_steps = cfg.B, cfg.H, cfg.p, cfg.decode_steps
    kw = dict(device=cfg.device, dtype=devices.DTYPES[cfg.dtype])
    if impl == "sdpa":
        k, v = torch.randn(B, H, T_, p, **kw), torch.randn(B, H, T_, p, **kw)
        q = torch.randn(B, H, 1, p, **kw)
        name, force = sdpa_backend(q, k, v, False)

        def run():
            with force(), torch.no_grad():
                for _ in range(decode_steps):
                    F.scaled_dot_product_attention(q, k, v)
        return run, f"backend={name}; KV cache {2 * k.numel() * k.element_size() / 2**20:.1f} MB"
    state = model.TSSAState.zeros(B, H, p, device=cfg.device)
    state.sum_sq.uniform_(1, 2).mul_(T_)
    state.sum_pi_sq.uniform_(1, 2).mul_(T_ / H)
    state.sum_pi.fill_(T_ / H)
    state.pos.fill_(T_)
    temp, bias = torch.ones(H, device=cfg.device), torch.zeros(H, device=cfg.device)
    w_t = torch.randn(B, H, p, **kw)
    step = kernels.ops_for(impl).causal_tssa_step

    def run():
        with torch.no_grad():
            for _ in range(decode_steps):
                step(w_t, temp, bias, state)
    size = sum(t.numel() * t.element_size() for t in (state.sum_sq, state.sum_pi_sq, state.sum_pi))
    return run, f"state {size / 2**10:.1f} KB"


def model_for(cfg, impl, block_size):
    if impl == "sdpa":
        return model.GPT.from_preset("gpt2", block_size=block_size).to(cfg.device)
    return kernels.use(model.GPT.from_preset("tost-base", block_size=block_size), impl).to(cfg.device)


def autocast(cfg):
    device_type = "cuda" if cfg.device.startswith("cuda") else "cpu"
    return device_type, torch.autocast(device_type, dtype=devices.DTYPES[cfg.dtype], enabled=cfg.dtype != "float32")


def model_case(cfg, impl, T_):
    """One training step of the whole model at context T_ (batch B)."""
    m = model_for(cfg, impl, T_)
    device_type, amp = autocast(cfg)
    opt = tk.configure_adamw(m, 0.1, 6e-4, (0.9, 0.95), device_type)
    idx = torch.randint(0, 50257, (cfg.B, T_), device=cfg.device)
    note = f"{sum(q.numel() for q in m.parameters()) / 1e6:.0f}M params"

    def run():
        with amp:
            _, loss = m(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run, note


def model_decode_case(cfg, impl, T_):
    """Per-token decoding of the whole model with a context of T_ tokens already in its state
    (synthetic state: the cost does not depend on its values)."""
    m = model_for(cfg, impl, T_ + cfg.decode_steps).eval()
    width, H, B = m.config.n_embd, m.config.n_head, cfg.B
    kw = dict(device=cfg.device, dtype=devices.DTYPES[cfg.dtype])
    state = m.init_state(B)
    for s in state.layers:  # as if T_ tokens had been prefilled
        if impl == "sdpa":
            s.k, s.v = (torch.randn(B, H, s.max_len, width // H, **kw) for _ in range(2))
        else:
            s.sum_sq.fill_(T_), s.sum_pi_sq.fill_(T_ / H), s.sum_pi.fill_(T_ / H)
    state.pos.fill_(T_)
    size = sum(s.nbytes() for s in state.layers)
    tok = torch.randint(0, 50257, (B, 1), device=cfg.device)
    _, amp = autocast(cfg)

    def run():
        state.pos.fill_(T_)  # every call decodes the same positions (the KV cache holds T_ + decode_steps)
        with torch.no_grad(), amp:
            for _ in range(cfg.decode_steps):
                m.step(tok, state)
    return run, f"state {size / 2**20:.3f} MB"


def vit_case(cfg, impl, T_):
    """Vision at T_ tokens (a sqrt(T_) * 16 pixel square image, patch 16): the forward pass of
    12 attention layers of ToST-S width (384, 8 heads), batch B, no gradients (MATH.md §6.3: the
    paper's 10k-token comparison). sdpa: softmax attention; torch / cpu / triton / compiled: TSSA."""
    torch.manual_seed(0)
    kind = "softmax" if impl == "sdpa" else "tssa"
    tssa_impl = impl if impl in ("cpu", "triton") else "torch"
    config = model.ViTConfig(n_embd=384, n_head=8, attn=kind)  # ToST-S width, biases
    dtype = devices.DTYPES[cfg.dtype]
    layers = torch.nn.Sequential(*[model.make_attention(config, causal=False) for _ in range(12)])
    layers = kernels.use(layers, tssa_impl).to(cfg.device, dtype)
    fn = torch.compile(layers.eval()) if impl == "compiled" else layers.eval()
    x = torch.randn(cfg.B, T_, 384, device=cfg.device, dtype=dtype)

    def run():
        with torch.no_grad():
            fn(x)
    side = int(round(T_ ** 0.5)) * 16
    return run, f"image {side}x{side}, 12 layers, width 384"


# -----------------------------------------------------------------------------
# driver


def run_suite(cfg, suite, impl_list, mode_list, T_list, results, bw):
    """Measure one suite over implementations, modes and lengths, a row (printed and kept in
    `results`) per case. A case that raises is a row saying so (a measured failure, not a
    mistake in the settings); after one out of memory, longer lengths of that case are not tried."""
    per_call = suite in ("decode", "model_decode")
    cuda = cfg.device.startswith("cuda")
    last = {}  # (impl, mode) -> (T, ms): to skip cases that would run too long
    for impl in impl_list:
        if suite != "op" and impl == "compiled":  # torch.compile of the operator only
            continue
        for mode in (mode_list if suite == "op" else ["step"]):
            for T_ in T_list:
                rec = dict(suite=suite, impl=impl, mode=mode, T=T_, B=cfg.B, H=cfg.H, p=cfg.p, device=cfg.device,
                           dtype=cfg.dtype, causal=cfg.causal)
                if (impl, mode) in last:
                    T0, ms0 = last[(impl, mode)]
                    # how the cost grows with T: attention T^2 per sequence / T per decoded token;
                    # TSSA T per sequence and constant per decoded token (its state does not grow)
                    power = (1 if per_call else 2) if impl == "sdpa" else (0 if per_call else 1)
                    est_s = ms0 * (T_ / T0) ** power * (cfg.repeats + cfg.warmup) / 1e3
                    if est_s > cfg.max_case_s:
                        rec.update(note=f"skipped: estimated {est_s:.0f} s > max_case_s={cfg.max_case_s:g}",
                                   max_case_s=cfg.max_case_s)
                        results.append(rec)
                        print_row(rec)
                        continue
                try:
                    make = {"op": lambda: op_case(cfg, impl, mode, T_), "decode": lambda: decode_case(cfg, impl, T_),
                            "model": lambda: model_case(cfg, impl, T_), "model_decode": lambda: model_decode_case(cfg, impl, T_),
                            "vit": lambda: vit_case(cfg, impl, T_)}[suite]
                    fn, note = make()
                    fn()  # first call outside the timing (compilation, C build, allocator warm-up)
                    note = "; ".join(n for n in (note, fallback_note(impl)) if n)
                    ms, all_ms, cpu_ms = timed(fn, cfg.repeats, cfg.warmup, cfg)
                    with PeakMemory(cfg) as mem:  # a separate run: the sampling thread costs CPU time
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
                    ms, all_ms, cpu_ms = ms / cfg.decode_steps, [t / cfg.decode_steps for t in all_ms], cpu_ms / cfg.decode_steps
                rec.update(ms=ms, ms_all=all_ms, cpu_ms=None if cuda else cpu_ms, peak_mb=mem.mb, note=note)
                if suite == "op" and impl != "sdpa":
                    floor = tssa_floor(cfg, mode, T_)
                    rec.update(gbps=floor / (ms * 1e-3) / 1e9, x_floor=ms * 1e-3 / (floor / (bw * 1e9)))
                last[(impl, mode)] = (T_, ms * (cfg.decode_steps if per_call else 1))
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



def run(cfg, given):
    """The suites: every setting checked, then each suite's rows, the summary, the JSON."""
    if cfg.quick:  # a short run; settings given explicitly still win
        for key, value in dict(T="1024,4096,16384", suites="op,decode", repeats=3).items():
            if key not in given:
                setattr(cfg, key, value)
    plan = check_settings(cfg, given=given)
    if cfg.out == "auto":
        cfg.out = "bench_results.json"
    outputs.claim_output(cfg.out, "--out=<another file>")  # one run at a time into one file
    cfg.device, cfg.dtype = devices.choose_device_dtype(cfg.device, cfg.dtype)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cuda = cfg.device.startswith("cuda")
    impl_list = plan["impls"] or ["torch", "triton" if cuda else "cpu", "sdpa"]
    model_T = plan["model_T"] or ([1024, 2048, 4096, 8192] if cuda else [1024])
    decode_T = plan["decode_T"] or [t for t in plan["T"] if cuda or t <= 16384]
    name = torch.cuda.get_device_name(cfg.device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    bw = copy_bandwidth(cfg)
    print(f"device: {name}; dtype {cfg.dtype}; B={cfg.B} H={cfg.H} p={cfg.p} causal={cfg.causal}; "
          f"copy bandwidth {bw:.1f} GB/s; torch {torch.__version__}; impls {','.join(impl_list)}")
    results = []
    print(_HEADER)
    for suite in plan["suites"]:
        Ts = {"model": model_T, "model_decode": decode_T}.get(suite, plan["T"])
        run_suite(cfg, suite, impl_list, plan["modes"], Ts, results, bw)
    lines = summary(results)
    if lines:
        print("\n" + "\n".join(lines))
    meta = dict(device=name, dtype=cfg.dtype, copy_gbps=bw, torch=torch.__version__,
                config={k: v for k, v in vars(cfg).items() if k != "argv"},
                load_average=list(portable.load_average()))
    write_results(cfg.out, dict(meta=meta, results=results, summary=lines))
    print(f"\nwrote {cfg.out}")
    if not any(r.get("ms") is not None for r in results):  # nothing was measured: not a success
        why = lines[0] if did_not_run(results) else \
            "the settings select none: on the CPU, decode_T=auto keeps the T up to 16384; give --decode_T"
        raise cli.UserError(f"no case ran: {why}; the rows are in {cfg.out}")
