"""
Design probe for the TSSA Triton kernels (CUDA): what a program that reads one tile, one that
loops over several, a token-axis scan inside a tile (tl.cumsum, or tl.dot with a triangular
matrix in tf32x3 / ieee) and a scan over chunk totals cost on this GPU, at B=1 T=16K, B=16
T=1K and B=1 T=64K (12 heads of 64, bf16); then the streaming kernels of 9b494a4 under other
chunk groupings (their "current" rows: those kernels are gone since). Every row is written to
$OUT/probe.json as it is measured. results/nvidia-h200-probe.json is its run on the H200
(commit 0af2430 with this file); kernels/triton_tssa.py's design comes from it, and its rows
check the launch model's cost of a token-axis scan (tests/test_triton_design.py).

    OUT=/tmp/probe python -m results.design_probe
    python -m results.design_probe --model    # no GPU: the launch model's tables (SPEED.md)
"""
import json, os, sys, time
import torch, triton, triton.language as tl

OUT = os.environ.get("OUT", "/tmp/probe_out")
os.makedirs(OUT, exist_ok=True)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
ROWS = []


def save(**row):
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    tmp = os.path.join(OUT, "probe.json.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name() if CUDA else "cpu", rows=ROWS), f, indent=0)
    os.replace(tmp, os.path.join(OUT, "probe.json"))


def bench(fn):
    if not CUDA:
        fn(); t0 = time.perf_counter(); fn(); return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


@triton.jit
def k_tot(w_ptr, s_b, s_h, s_t, tot_ptr, H, T, nC, BT: tl.constexpr, P: tl.constexpr, HEADS_FAST: tl.constexpr):
    pid = tl.program_id(0)
    if HEADS_FAST:
        h = pid % H
        c = (pid // H) % nC
        b = pid // (H * nC)
    else:
        c = pid % nC
        h = (pid // nC) % H
        b = pid // (nC * H)
    t = c * BT + tl.arange(0, BT)
    offs = b.to(tl.int64) * s_b + h * s_h + t[:, None].to(tl.int64) * s_t + tl.arange(0, P)[None, :]
    x = tl.load(w_ptr + offs, mask=(t < T)[:, None], other=0.0).to(tl.float32)
    tl.store(tot_ptr + ((b * H + h) * nC + c).to(tl.int64) * P + tl.arange(0, P), tl.sum(x * x, axis=0))


@triton.jit
def k_loop(w_ptr, s_b, s_h, s_t, tot_ptr, H, T, nC, G, BT: tl.constexpr, P: tl.constexpr, NS: tl.constexpr):
    pid = tl.program_id(0)
    h = pid % H
    nG = tl.cdiv(nC, G)
    g = (pid // H) % nG
    b = pid // (H * nG)
    for k in tl.range(0, tl.minimum(G, nC - g * G), num_stages=NS):
        c = g * G + k
        t = c * BT + tl.arange(0, BT)
        offs = b.to(tl.int64) * s_b + h * s_h + t[:, None].to(tl.int64) * s_t + tl.arange(0, P)[None, :]
        x = tl.load(w_ptr + offs, mask=(t < T)[:, None], other=0.0).to(tl.float32)
        tl.store(tot_ptr + ((b * H + h) * nC + c).to(tl.int64) * P + tl.arange(0, P), tl.sum(x * x, axis=0))


@triton.jit
def k_scan_tile(w_ptr, s_b, s_h, s_t, o_ptr, H, T, nC, BT: tl.constexpr, P: tl.constexpr, METHOD: tl.constexpr):
    pid = tl.program_id(0)
    h = pid % H
    c = (pid // H) % nC
    b = pid // (H * nC)
    t = c * BT + tl.arange(0, BT)
    offs = b.to(tl.int64) * s_b + h * s_h + t[:, None].to(tl.int64) * s_t + tl.arange(0, P)[None, :]
    x = tl.load(w_ptr + offs, mask=(t < T)[:, None], other=0.0).to(tl.float32)
    q = x * x
    if METHOD == 0:
        M = tl.cumsum(q, axis=0)
    elif METHOD == 3:
        M = q
    else:
        r = tl.arange(0, BT)
        tril = (r[:, None] >= r[None, :]).to(tl.float32)
        if METHOD == 1:
            M = tl.dot(tril, q, input_precision="tf32x3")
        else:
            M = tl.dot(tril, q, input_precision="ieee")
    tl.store(o_ptr + offs, (x / (1.0 + M)).to(o_ptr.dtype.element_ty), mask=(t < T)[:, None])


@triton.jit
def k_chunk_scan(tot_ptr, carry_ptr, nC, P: tl.constexpr, BK: tl.constexpr, CB: tl.constexpr, NS: tl.constexpr):
    pid = tl.program_id(0)
    nK: tl.constexpr = P // BK
    bh = pid // nK
    cols = (pid % nK) * BK + tl.arange(0, BK)
    acc = tl.zeros((BK,), tl.float32)
    for c0 in tl.range(0, nC, CB, num_stages=NS):
        rows = c0 + tl.arange(0, CB)
        offs = (bh * nC + rows[:, None]).to(tl.int64) * P + cols[None, :]
        x = tl.load(tot_ptr + offs, mask=(rows < nC)[:, None], other=0.0)
        tl.store(carry_ptr + offs, acc[None, :] + tl.cumsum(x, axis=0) - x, mask=(rows < nC)[:, None])
        acc += tl.sum(x, axis=0)


def heads_view(B, T, H=12, p=64):
    x = torch.randn(B, T, H * p, device=DEV, dtype=torch.bfloat16)
    return x.view(B, T, H, p).transpose(1, 2)  # (B, H, T, p), the layout model.py hands over


def main(shapes):
    if CUDA:  # the copy rate, for the ratios
        a = torch.empty(2 ** 28, device=DEV, dtype=torch.uint8); b2 = torch.empty_like(a)
        ms = bench(lambda: b2.copy_(a))
        save(kind="copy", bytes=2 * a.numel(), ms=ms, tbs=2 * a.numel() / ms / 1e9)
        del a, b2
    for B, T in shapes:
        w = heads_view(B, T)
        H, p = 12, 64
        nbytes = w.numel() * 2
        s = w.stride()[:3]
        for BT in (32, 64, 128):
            nC = triton.cdiv(T, BT)
            tot = torch.empty(B * H * nC, p, device=DEV)
            for warps in (4, 8):
                for heads_fast in (True, False):
                    f = lambda: k_tot[(B * H * nC,)](w, *s, tot, H, T, nC, BT=BT, P=p, HEADS_FAST=heads_fast, num_warps=warps)
                    ms = bench(f)
                    save(kind="tot_one_tile", B=B, T=T, BT=BT, warps=warps, heads_fast=heads_fast, ms=ms, tbs=nbytes / ms / 1e9)
            for G in (4, 8):
                for NS in (1, 2, 3):
                    grid = (B * H * triton.cdiv(nC, G),)
                    f = lambda: k_loop[grid](w, *s, tot, H, T, nC, G, BT=BT, P=p, NS=NS, num_warps=8 if BT >= 64 else 4)
                    ms = bench(f)
                    save(kind="tot_loop", B=B, T=T, BT=BT, G=G, NS=NS, ms=ms, tbs=nbytes / ms / 1e9)
            for method, name in ((3, "none"), (0, "cumsum"), (1, "dot_tf32x3"), (2, "dot_ieee")):
                o = torch.empty_like(w)
                for warps in (4, 8):
                    f = lambda: k_scan_tile[(B * H * nC,)](w, *s, o, H, T, nC, BT=BT, P=p, METHOD=method, num_warps=warps)
                    try:
                        ms = bench(f)
                        save(kind="scan_tile", method=name, B=B, T=T, BT=BT, warps=warps, ms=ms, tbs=2 * nbytes / ms / 1e9)
                    except Exception as e:
                        save(kind="scan_tile", method=name, B=B, T=T, BT=BT, warps=warps, error=str(e)[:200])
            carry = torch.empty_like(tot)
            for BK in (16, 32, 64):
                for CB in (32, 64, 128):
                    f = lambda: k_chunk_scan[(B * H * (p // BK),)](tot, carry, nC, P=p, BK=BK, CB=CB, NS=2, num_warps=4)
                    ms = bench(f)
                    save(kind="chunk_scan", B=B, T=T, BT=BT, nC=nC, BK=BK, CB=CB, ms=ms)
        del w
        torch.cuda.empty_cache() if CUDA else None


def current(shapes):
    """The current streaming kernels under other geometries: per-kernel GPU time."""
    sys.path.insert(0, os.getcwd())
    import kernels.triton_tssa as tt
    if not hasattr(tt, "GROUP_CHUNKS"):  # the streaming kernels of 9b494a4 are gone
        return
    from torch.profiler import ProfilerActivity, profile
    base = (tt.BLOCK_T, tt.GROUP_CHUNKS, tt.MAX_GROUPS)
    for label, (gc, mg) in (("default", base[1:]), ("G1", (1, 4096)), ("G2", (2, 4096))):
        tt.GROUP_CHUNKS, tt.MAX_GROUPS = gc, mg
        for B, T in shapes:
            w = heads_view(B, T)
            temp = torch.ones(12, device=DEV); bias = torch.zeros(12, T, device=DEV)
            g = torch.randn_like(w)
            def run():
                out, pi, u, saved = tt.TritonKernels.forward(w, temp, bias, None, True, (1e-6, 1e-6))
                tt.TritonKernels.backward(w, g, temp, pi, u, None, saved, True, (1e-6, 1e-6), bias_width=T)
            run(); run()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as pr:
                for _ in range(10):
                    run()
                torch.cuda.synchronize()
            per = {e.key: e.device_time_total / 10 / 1e3 for e in pr.key_averages() if e.key.startswith("_k_")}
            save(kind="current", label=label, B=B, T=T, geometry=tt.geometry(T, 64), total_ms=sum(per.values()), kernels=per)
    tt.GROUP_CHUNKS, tt.MAX_GROUPS = base[1:]


def recorded_kernel_times(report, commit):
    """{(B, T): [each launch's measured GPU us]} of the kernel_times `report` holds for `commit`."""
    from results.benchkit.reportfile import part_measured_at, read_report
    part = part_measured_at(read_report(report, "give a report of bench.py")[0], "kernel_times", commit)
    return {(r["B"], r["T"]): [launch["gpu_us"] for launch in r["launches"]] for r in (part or {}).get("rows", [])}


def model_tables(shapes=((1, 16384), (16, 1024), (1, 65536)), report="results/nvidia-h200.json"):
    """Markdown tables of kernels/launch_model.py's figures (modelled, not measured; no GPU is
    used): each launch of one fwd+bwd (12 heads of 64, bf16, causal) of the kernels the H200
    measured (35ffd52, 88ecccebc71c) and of now, their programs and warps, the measured time of
    each measured kernel (the report's kernel_times) beside the model's, and the model's time of
    today's on the H200 and H100."""
    sys.path.insert(0, os.getcwd())
    from kernels import launch_model as lm, triton_tssa as tt
    kept = [(lm.AT_35FFD52, recorded_kernel_times(report, "35ffd52")),
            (lm.AT_88ECCCE, recorded_kernel_times(report, "88ecccebc71c"))]
    us = lambda plan, gpu: f"{lm.modelled_time_s(plan, gpu) * 1e6:,.1f}"  # noqa: E731
    for B, T in shapes:
        plans = [lm.plan_for(kernels, B, 12, T, 64) for kernels, _ in kept] + [tt.launch_plan(B, 12, T, 64)]
        got = [measured.get((B, T), [float("nan")] * len(plans[0])) for _, measured in kept]
        print(f"\n**B={B}, T={T:,}** (µs; H200 measured and modelled at 35ffd52 and at 88ecccebc71c, "
              "the model of now)\n\n| # | launch | programs × warps, 35ffd52 → 88ecccebc71c → now | 35ffd52 "
              "measured | model | 88ecccebc71c measured | model | now: model, H200 | H100 |\n"
              "|---|---|---|---|---|---|---|---|---|")
        for i, launches in enumerate(zip(*plans)):
            o = launches[0]
            name = f"`{o['kernel']}`" + (f" ({o['mode']}, {o['carries']})" if "mode" in o else "")
            shape = " → ".join(f"{x['grid']:,} × {x['warps']}" for x in launches)
            pairs = " | ".join(f"{g[i]:,.1f} | {us(x, 'h200')}" for g, x in zip(got, launches))
            print(f"| {i} | {name} | {shape} | {pairs} | {us(launches[-1], 'h200')} | {us(launches[-1], 'h100')} |")
        pairs = " | ".join(f"{sum(g):,.1f} | {us(p, 'h200')}" for g, p in zip(got, plans))
        print(f"| | total | | {pairs} | {us(plans[-1], 'h200')} | {us(plans[-1], 'h100')} |")


if __name__ == "__main__":
    if "--model" in sys.argv:
        model_tables()
        sys.exit()
    shapes = [(1, 16384), (16, 1024), (1, 65536)] if CUDA else [(1, 256)]
    main(shapes)
    if CUDA:
        current(shapes)
