"""GPU checks of the Triton kernels (tssa_impl="triton") against model.py's maths, one mode
per call, from the repository root on a CUDA machine (the README's "On a GPU" figures):

    python -m kernels.gpu_check accuracy [out.json]  # out, dw, dtemp, dbias vs float64, beside the fp32 reference
    python -m kernels.gpu_check determinism          # two fwd+bwd runs at the training shape, bit for bit
    python -m kernels.gpu_check big                  # a forward of > 2**31 elements: first/last rows == run alone
    python -m kernels.gpu_check sanitize             # one bf16 fwd+bwd at the training shape, for
        compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck python -m kernels.gpu_check sanitize
    python -m kernels.gpu_check profile              # GPU time per kernel vs wall time (launch overhead),
        and each Triton kernel's bandwidth: the bytes kernels.triton_tssa.launch_plan states / its GPU time
    python -m kernels.gpu_check direct               # the direct launches (kernels/triton_launch.py): the
        same bits as through the JIT, every later launch direct, the wall time of a call either way
"""
import json
import sys
import time

import torch

import kernels
import model
from kernels.triton_tssa import launch_plan, modelled_time_s

TRITON = kernels.ops_for("triton")


def inputs(B, H, T, p, seed=0, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    w = torch.randn(B, H, T, p, generator=g, dtype=torch.float64)
    w[:, :, :, :4] *= 1e-4  # features close to zero (the clamp / epsilon guards matter there)
    temp = 0.5 + torch.rand(H, generator=g, dtype=torch.float64)
    bias = 0.1 * torch.randn(H, T, generator=g, dtype=torch.float64)
    gout = torch.randn(B, H, T, p, generator=g, dtype=torch.float64)
    return [t.to(device) for t in (w, temp, bias, gout)]


def fwd_bwd(fn, w, temp, bias, gout, dtype):
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    w_ = w.to(dtype).detach().requires_grad_()
    temp_, bias_ = (t.to(stat).detach().requires_grad_() for t in (temp, bias))
    out = fn(w_, temp_, bias_)
    out.backward(gout.to(dtype))
    return [t.detach().double() for t in (out, w_.grad, temp_.grad, bias_.grad)]


def ref(w, t, b):
    return model.causal_tssa(w, t, b)


def fused(w, t, b):
    return TRITON.causal_tssa(w, t, b)


def rel_rms(a, b):
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-300)).item()


def accuracy():
    rows = []
    for B, H, T, p in [(12, 12, 1024, 64), (1, 12, 65536, 64)]:
        w, temp, bias, gout = inputs(B, H, T, p)
        exact = fwd_bwd(ref, w, temp, bias, gout, torch.float64)
        for name, fn, dt in [("reference fp32", ref, torch.float32), ("triton fp32", fused, torch.float32),
                             ("reference bf16", ref, torch.bfloat16), ("triton bf16", fused, torch.bfloat16)]:
            got = fwd_bwd(fn, w, temp, bias, gout, dt)
            errs = {k: rel_rms(a, e) for k, a, e in zip(("out", "dw", "dtemp", "dbias"), got, exact)}
            rows.append(dict(shape=[B, H, T, p], impl=name, **errs))
            print(f"{B}x{H}x{T}x{p} {name:<15} " + "  ".join(f"{k} {v:.2e}" for k, v in errs.items()), flush=True)
        del exact
        torch.cuda.empty_cache()
    return rows


def determinism():
    w, temp, bias, gout = inputs(16, 12, 1024, 64, seed=1)
    a = fwd_bwd(fused, w, temp, bias, gout, torch.bfloat16)
    b = fwd_bwd(fused, w, temp, bias, gout, torch.bfloat16)
    same = [bool(torch.equal(x, y)) for x, y in zip(a, b)]
    print("bit-identical out, dw, dtemp, dbias:", same, flush=True)
    return dict(identical=same)


def big():
    B, H, T, p = 44, 12, 65536, 64
    print(f"elements {B * H * T * p:,} (2**31 = {2**31:,})", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(B, H, T, p, device="cuda", dtype=torch.bfloat16, generator=g)
    temp = torch.ones(H, device="cuda")
    bias = torch.zeros(H, T, device="cuda")
    with torch.no_grad():
        t0 = time.time()
        out = fused(w, temp, bias)
        torch.cuda.synchronize()
        print(f"forward {time.time() - t0:.2f} s; peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
        last = out[-1].clone()
        first = out[0].clone()
        del out
        alone = fused(w[-1:].contiguous(), temp, bias)[0]
        alone0 = fused(w[:1].contiguous(), temp, bias)[0]
    res = dict(last_row_equal=bool(torch.equal(last, alone)), max_abs_diff_last=(last.float() - alone.float()).abs().max().item(),
               first_row_equal=bool(torch.equal(first, alone0)))
    print(res, flush=True)
    return res


def sanitize():
    w, temp, bias, gout = inputs(16, 12, 1024, 64, seed=2)
    fwd_bwd(fused, w, temp, bias, gout, torch.bfloat16)
    torch.cuda.synchronize()
    print("sanitize case done", flush=True)
    return {}



def profile():
    """Where the time of one fused fwd+bwd goes: per-kernel GPU time (torch.profiler), and the
    host-side wall time with and without a CUDA graph (launch overhead)."""
    from torch.profiler import ProfilerActivity, profile as prof
    out = {}
    for B, T in [(1, 16384), (16, 1024), (1, 65536)]:
        w, temp, bias, gout = inputs(B, 12, T, 64, seed=3)
        wb = w.bfloat16().requires_grad_()
        t32, b32 = temp.float().requires_grad_(), bias.float().requires_grad_()
        gb = gout.bfloat16()

        def step():
            wb.grad = t32.grad = b32.grad = None
            fused(wb, t32, b32).backward(gb)
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(50):
            step()
        ev[1].record()
        torch.cuda.synchronize()
        eager_ms = ev[0].elapsed_time(ev[1]) / 50
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        rows = sorted(p.key_averages(), key=lambda e: -e.device_time_total)
        gpu_total = sum(e.device_time_total for e in rows) / 10 / 1e3
        print(f"B={B} T={T}: wall {eager_ms:.3f} ms/iter, GPU busy {gpu_total:.3f} ms/iter", flush=True)
        plan = {}  # kernel -> its launches' bytes and modelled time, summed (the scans launch 4 times)
        for launch in launch_plan(B, 12, T, 64, torch.bfloat16, causal=True):
            seen = plan.setdefault(launch["kernel"], dict(read=0, write=0, model_ms=0.0))
            seen.update(read=seen["read"] + launch["read"], write=seen["write"] + launch["write"],
                        model_ms=seen["model_ms"] + modelled_time_s(launch, "h200") * 1e3)
        table = []
        for e in rows[:14]:
            ms = e.device_time_total / 10 / 1e3
            launch = plan.get(e.key)  # a Triton kernel of the plan: its bytes over its time
            tbs = (launch["read"] + launch["write"]) / (ms * 1e-3) / 1e12 if launch else None
            table.append((e.key[:60], e.count // 10, ms, tbs))
            print(f"   {e.key[:60]:<60} x{e.count // 10:<3} {ms:.4f} ms" + (f"  {tbs:.2f} TB/s" if tbs else ""),
                  flush=True)
        out[f"B{B}_T{T}"] = dict(wall_ms=eager_ms, gpu_ms=gpu_total, kernels=table,
                                 plan_ms=sum(launch["model_ms"] for launch in plan.values()))
    out["compiled"] = compiled_kernels()
    return out


def direct():
    """kernels/triton_launch.py on this GPU, for each Triton implementation, at the training shape
    (B16 T1K, bf16): a fwd+bwd with the direct path off (every launch through the JIT), then on (the
    first call keeps the kernels, the next launches them directly): the same bits; the launches of
    the later calls all direct; the wall time of a call (50, back to back) with the path off and on."""
    from kernels import fused as fused_ops, triton_launch
    w, temp, bias, gout = inputs(16, 12, 1024, 64, seed=4)
    direct_launches = []
    kept_launch = triton_launch._Kept.launch
    triton_launch._Kept.launch = lambda self, *a: direct_launches.append(1) or kept_launch(self, *a)
    res = {}
    for impl in ("triton", "triton_retiled"):
        ops = fused_ops.fused_ops(impl)
        run = lambda: fwd_bwd(lambda w_, t_, b_: ops.causal_tssa(w_, t_, b_), w, temp, bias, gout, torch.bfloat16)
        wb, t32, b32 = w.bfloat16().requires_grad_(), temp.float().requires_grad_(), bias.float().requires_grad_()
        gb = gout.bfloat16()

        def step():
            wb.grad = t32.grad = b32.grad = None
            ops.causal_tssa(wb, t32, b32).backward(gb)

        def wall_ms():
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(50):
                step()
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / 50 * 1e3
        triton_launch.forget()
        triton_launch._off = "off for the check"  # every launch through the JIT
        through_jit, jit_ms = run(), wall_ms()
        triton_launch.forget()
        first = run()  # through the JIT, the kernels kept
        before = len(direct_launches)
        again = run()
        launches = len(direct_launches) - before
        direct_ms = wall_ms()
        same = all(torch.equal(a, b) for a, b in zip(through_jit + first, again + again))
        res[impl] = dict(same_bits=same, direct_launches=launches, kept=len(triton_launch._kept),
                         wall_ms_jit=jit_ms, wall_ms_direct=direct_ms)
        print(f"{impl}: same bits {same}, {launches} direct launches in a call, {len(triton_launch._kept)} kept, "
              f"wall {jit_ms:.3f} ms through the JIT, {direct_ms:.3f} ms direct", flush=True)
    triton_launch._Kept.launch = kept_launch
    return res


def compiled_kernels():
    """What the JIT built on this GPU for each Triton kernel launched so far: registers a thread,
    spilled bytes, warps, stages, shared memory (read from Triton's own cache of compiled kernels)."""
    from kernels import triton_tssa as tt
    info = {}
    for name in tt.KERNELS:
        for cache in getattr(getattr(tt, name), "device_caches", {}).values():
            for compiled in cache[0].values():
                try:
                    compiled._init_handles()
                except Exception:  # noqa: BLE001 (a kernel that cannot load says so by its missing fields)
                    pass
                meta = compiled.metadata
                info.setdefault(name, []).append(dict(
                    n_regs=getattr(compiled, "n_regs", None), n_spills=getattr(compiled, "n_spills", None),
                    num_warps=getattr(meta, "num_warps", None), num_stages=getattr(meta, "num_stages", None),
                    shared=getattr(meta, "shared", None)))
    for name, builds in info.items():
        print(f"   {name:<14} " + "; ".join(f"{b['n_regs']} regs, {b['n_spills']} B spilled, {b['num_warps']} warps, "
                                             f"{b['num_stages']} stages, {b['shared']} B shared" for b in builds),
              flush=True)
    return info


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("accuracy", "determinism", "big", "sanitize", "profile", "direct"):
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        sys.exit("kernels/gpu_check.py: needs a CUDA GPU (the tests run these kernels on the CPU under TRITON_INTERPRET=1)")
    mode = sys.argv[1]
    res = globals()[mode]()
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, result=res), f, indent=1)
