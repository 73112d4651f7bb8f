"""
What Triton's JIT builds on the GPU machines (H100 / H200, sm_90) for every launch of
kernels/triton_tssa.py at the shapes the GPU benchmark runs: built here, without a GPU and
without launching, by tests/test_kernels.py (in a subprocess, once under the default Triton
and once under the GPU machine's, installed beside it and put first on PYTHONPATH).

How it builds what the GPU builds: TritonKernels.forward, .backward and .step run as they are,
on meta tensors laid out as model.py and bench.py hand them over, and every `kernel[grid](...)`
they make goes to the JIT's own JITFunction.run, with warmup=True (build, do not launch). So
Triton's binder specializes the arguments exactly as before a launch (an int equal to 1 becomes
a constexpr, ints and pointers divisible by 16 are marked so, each pointer typed by its tensor's
dtype: the bool padding mask *u1, its stand-in *fp32), with the constexprs and num_warps that the
launch passes (TritonKernels.plan's), and compiles for the target a stub driver reports (sm_90;
it makes no CUDA call). cuobjdump then reads from each cubin what the CUDA driver reports on the
GPU: registers a thread (CU_FUNC_ATTRIBUTE_NUM_REGS, Triton's n_regs) and local memory a thread
(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES; Triton's n_spills is it / 4); and the PTX (and, at a few
shapes, the SASS) is read for atomics, fences and how each function's lines move global memory.

    python tests/helpers_gpu_build.py OUT.json [PROFILED.py]

PROFILED.py: a copy of kernels/triton_tssa.py as a GPU profile ran it (tests/test_kernels.py
takes it from git), built also at the shapes of `python -m kernels.gpu_check profile`.
The re-tiled causal kernels (kernels/triton_retiled.py, RetiledKernels) are built the same way at
RETILED_CASES ("retiled_rows", "retiled_builds"), with the number of fused multiply-adds in each PTX
and the sizes of its asynchronous copies (the software pipeline of a row loop).
"""
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
from kernels import fused  # noqa: E402
from kernels import triton_retiled, triton_tssa  # noqa: E402

K = 1024
BF16 = torch.bfloat16


def case(name, B, T, p=64, H=12, causal=True, masked=False, dtype=BF16, arch=90, layout="heads", bias_width=None):
    """One forward and backward of the operator: ToST-Base's heads (12 of width 64) by default,
    causal with the whole position bias (H, bias_width; default T), bf16, for sm_90, w and
    dL/dout as model.py's heads of a (B, T, H * p) projection ("heads") or contiguous (B, H, T, p)."""
    return dict(name=name, B=B, T=T, p=p, H=H, causal=causal, masked=masked, dtype=dtype, arch=arch, layout=layout,
                bias_width=(bias_width or T) if causal else 0)


# The launches of the GPU benchmark (bench.py): the operator at B=1 over its lengths and at the
# training shape (B=16 T=1K); the training step at train_tokens = 64K tokens a step (batch
# 64K / T, position bias block_size = T); the main job (config/tost_owt.py: 12 x 1K); decoding,
# one token at B=1. Then the other forms: non-causal with a padding mask (LRA, ViT), p = 128,
# fp32, and p = 24 with 17 heads (P padded to 32, HP to 32: the EVEN_P = False paths); and two
# shapes for an A100 (sm_80).
CASES = ([case(f"op B1 T{t}K", 1, t * K) for t in (16, 1, 2, 4, 8, 32, 64)] + [case("op B16 T1K", 16, K)]
         + [case(f"train B{64 // t} T{t}K", 64 // t, t * K) for t in (4, 8, 16, 32, 64)]
         + [case("main job B12 T1K", 12, K),
            case("noncausal masked B16 T1K", 16, K, causal=False, masked=True),
            case("noncausal masked B1 T16K", 1, 16 * K, causal=False, masked=True),
            case("p128 B1 T16K", 1, 16 * K, p=128), case("p128 B16 T1K", 16, K, p=128),
            case("fp32 B1 T16K", 1, 16 * K, dtype=torch.float32),
            case("fp16 p24 H17 noncausal masked B4 T1K", 4, K, p=24, H=17, causal=False, masked=True,
                 dtype=torch.float16),
            case("sm_80 op B1 T16K", 1, 16 * K, arch=80), case("sm_80 op B16 T1K", 16, K, arch=80)])
STEPS = [dict(name=f"step B1 p{p}", step=True, B=1, H=12, p=p, dtype=BF16, arch=90) for p in (64, 128)]
# kernels/gpu_check.py's profile(): contiguous inputs (its inputs()), bf16, in this order
PROFILE_CASES = [case(f"profile B{B} T{T // K}K", B, T, layout="contiguous") for B, T in [(1, 16 * K), (16, K),
                                                                                         (1, 64 * K)]]
SASS_CASES = ("op B1 T16K", "noncausal masked B16 T1K", "step B1 p64")  # the SASS is read (0.3 s a build) here
# The re-tiled causal kernels: the operator's three target shapes, the training step at 16K, the
# main job, p = 128 (8 warps), fp32 (4-wide vectors: 8 warps), 17 heads of 48 (HP = 32, P = 64:
# the column mask, 8 warps), w contiguous as (B, H, T, p), and an A100
RETILED_CASES = [case(f"retiled {name}", B, T) for name, B, T in (
    ("op B1 T16K", 1, 16 * K), ("op B16 T1K", 16, K), ("op B1 T64K", 1, 64 * K), ("train B4 T16K", 4, 16 * K),
    ("main job B12 T1K", 12, K))]
RETILED_CASES += [case("retiled p128 B1 T16K", 1, 16 * K, p=128),
                  case("retiled fp32 B1 T16K", 1, 16 * K, dtype=torch.float32),
                  case("retiled fp16 p48 H17 B4 T1K", 4, K, p=48, H=17, dtype=torch.float16),
                  case("retiled contiguous B2 T4K", 2, 4 * K, layout="contiguous"),
                  case("retiled sm_80 op B1 T16K", 1, 16 * K, arch=80)]

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTX_SYNC = re.compile(r"\b(atom|red|membar|fence)\.")  # atomics, reductions, fences
PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)")  # the source file and line of what follows
PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
PTX_MOVE = re.compile(r"(?:ld|st)\.global[.\w]*")
PTX_FMA = re.compile(r"\bfma\.rn\.f32\b")  # a multiply fused into an add (none where fp fusion is off)
PTX_COPY = re.compile(r"cp\.async\.c[ag]\.shared\.global[^,]*,[^,]*,\s*(0x[0-9a-f]+|\d+)")  # its bytes
SASS_SYNC = re.compile(r"\b(ATOM|ATOMS|ATOMG|RED|REDG|MEMBAR|ERRBAR)\b")


class StubDriver:
    """What the JIT asks the CUDA driver before a launch (the device, its stream, its target),
    answered for a GPU of compute capability `arch` (its device number: the JIT keeps a cache
    of builds per device). No CUDA call is made: nothing is loaded or launched."""

    arch = 90

    def get_current_device(self):
        return self.arch

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)

    def is_active(self):
        return True


def build_instead_of_launch(module, launches):
    """Every launch of module's kernels (its KERNELS; a profiled source's FORWARD, BACKWARD and
    _k_step) only builds (the JIT's own run, with warmup=True); each appends (kernel name, grid,
    the compiled kernel) to launches."""
    names = getattr(module, "KERNELS", None) or tuple(dict.fromkeys(module.FORWARD + module.BACKWARD)) + ("_k_step",)
    for name in names:
        kernel = getattr(module, name)

        def run(*args, grid, warmup, _kernel=kernel, _name=name, **kwargs):
            compiled = JITFunction.run(_kernel, *args, grid=grid, warmup=True, **kwargs)
            launches.append((_name, tuple(grid), compiled))
            return compiled
        kernel.run = run  # what the launcher of kernel[grid] calls


def empty(*shape, dtype=torch.float32):
    return torch.empty(*shape, device="meta", dtype=dtype)


def run_case(kernels, c):
    """One forward and backward of the kernel class (TritonKernels, RetiledKernels), as kernels/fused.py calls them."""
    B, H, T, p = c["B"], c["H"], c["T"], c["p"]
    if c["layout"] == "heads":  # model.split_heads of c_in's output / of dL/dout
        w, g = (model.split_heads(empty(B, T, H * p, dtype=c["dtype"]), H) for _ in range(2))
    else:
        w, g = (empty(B, H, T, p, dtype=c["dtype"]) for _ in range(2))
    temp = empty(H)
    bias = empty(H, c["bias_width"]) if c["causal"] else None
    mask = empty(B, T, dtype=torch.bool) if c["masked"] else None
    eps = fused.guards(c["causal"])
    out, pi, u, saved = kernels.forward(w, temp, bias, mask, c["causal"], eps)
    kernels.backward(w, g, temp, pi, u, mask, saved, c["causal"], eps, c["bias_width"])


def run_step(kernels, c):
    """One decoding token, as kernels/fused.py's causal_tssa_step calls it (model.py's bias_t:
    pos_bias.index_select(1, at).squeeze(1))."""
    state = model.TSSAState.zeros(c["B"], c["H"], c["p"], device="meta")
    bias_t = empty(c["H"], 1).squeeze(1)
    kernels.step(empty(c["B"], c["H"], c["p"], dtype=c["dtype"]), empty(c["H"]), bias_t.reshape(c["H"]).float(), state,
                 fused.guards(True))


def cuobjdump(flag, cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([os.path.join(BIN, "cuobjdump"), flag, f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)


def moves_by_function(ptx, module):
    """{name of the module's @triton.jit function: the global loads and stores (ld/st.global and
    their width) that its lines compiled to}: the PTX's .loc lines say where each comes from."""
    spans = [(name, *inspect.getsourcelines(fn.fn)[::-1]) for name, fn in vars(module).items()
             if isinstance(fn, JITFunction)]  # (name, first line, its lines)
    ours = {n for n, path in (m.groups() for m in map(PTX_FILE.match, ptx.splitlines()) if m)
            if os.path.abspath(path) == os.path.abspath(module.__file__)}
    moves, at = {}, None
    for line in ptx.splitlines():
        loc = PTX_LOC.match(line)
        if loc:
            at = int(loc.group(2)) if loc.group(1) in ours else None
        for move in PTX_MOVE.findall(line):
            where = next((n for n, first, lines in spans if at is not None and first <= at < first + len(lines)), "?")
            moves.setdefault(where, set()).add(move)
    return {k: sorted(v) for k, v in moves.items()}


def describe(compiled, read_sass, module):
    """What the driver reports of one build, the JIT's specialization it was built for, and
    what its PTX (and SASS) do."""
    res = cuobjdump("--dump-resource-usage", compiled.asm["cubin"])
    regs, stack, local = (int(re.search(rf"\b{k}:(\d+)", res).group(1)) for k in ("REG", "STACK", "LOCAL"))
    sass = cuobjdump("-sass", compiled.asm["cubin"]) if read_sass else None
    ptx, meta, src = compiled.asm["ptx"], compiled.metadata, compiled.src
    names = [p.name for p in src.fn.params]
    divisible = sorted(names[k[0]] for k, v in src.attrs.items() if ["tt.divisibility", 16] in v)
    return dict(regs=regs, local_bytes=stack + local, num_warps=meta.num_warps, num_stages=meta.num_stages,
                fma=len(PTX_FMA.findall(ptx)), copy_bytes=sorted({int(n, 0) for n in PTX_COPY.findall(ptx)}),
                shared=meta.shared, signature={k: str(v) for k, v in src.signature.items()}, divisible_by_16=divisible,
                moves=moves_by_function(ptx, module), ptx_sync=sorted(set(PTX_SYNC.findall(ptx))),
                sass_lines=None if sass is None else sass.count("\n"),
                sass_sync=None if sass is None else sorted(set(SASS_SYNC.findall(sass))))


def plan_of(kernels, c):
    """The kernel class's plan for case c: at the case's T (and w's dtype) where the plan takes one
    (the scans' chunk totals a step and warps follow the row's chunks; the re-tiled kernels' warps
    w's dtype; the profiled source's plan takes neither)."""
    args = (c["p"], c["H"], c.get("causal", True), c.get("masked", False))
    takes = inspect.signature(kernels.plan).parameters
    return kernels.plan(*args, **{k: c[k] for k in ("T", "dtype") if k in takes and k in c})


def build_all(module, cases, steps, stub, kernels=None):
    """Every launch of the cases and decoding steps through the module's kernel class (kernels;
    TritonKernels by default): rows (the case, the kernel, its grid, its plan's warps, the build's
    index) and the builds."""
    kernels = kernels or module.TritonKernels
    launches, rows, index = [], [], {}
    build_instead_of_launch(module, launches)
    for c in cases + steps:
        stub.arch = c["arch"]
        start = len(launches)
        (run_step if c.get("step") else run_case)(kernels, c)
        plan = plan_of(kernels, c)
        for name, grid, compiled in launches[start:]:
            index.setdefault(id(compiled), (len(index), compiled, set()))[2].add(c["name"])
            rows.append(dict(c, dtype=str(c["dtype"]).replace("torch.", ""), kernel=name, grid=grid,
                             plan_warps=plan[name]["num_warps"], build=index[id(compiled)][0]))
    builds = [describe(compiled, bool(names & set(SASS_CASES)), module) for _, compiled, names in index.values()]
    return rows, builds


def main(out_path, profiled_source=None):
    stub = StubDriver()
    driver.set_active(stub)
    rows, builds = build_all(triton_tssa, CASES, STEPS, stub)
    retiled_rows, retiled_builds = build_all(triton_retiled, RETILED_CASES, [], stub, triton_retiled.RetiledKernels)
    result = dict(triton=triton.__version__, rows=rows, builds=builds, retiled_rows=retiled_rows,
                  retiled_builds=retiled_builds,
                  ptxas=subprocess.run([os.path.join(BIN, "ptxas"), "--version"], capture_output=True,
                                       text=True).stdout.strip().splitlines()[-1])
    if profiled_source:
        spec = importlib.util.spec_from_file_location("profiled_triton_tssa", profiled_source)
        profiled = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(profiled)
        result["profiled_rows"], result["profiled_builds"] = build_all(profiled, PROFILE_CASES, [], stub)
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
