"""
The Triton kernels as the JIT builds them on the GPU machines, without a GPU. The interpreter
run (tests/test_kernels.py) checks the maths but not what only the GPU compiler sees (types,
layouts, registers, the software pipeline). tests/helpers_gpu_build.py runs TritonKernels'
forward, backward and decoding step at every shape the GPU benchmark launches (and the other
forms: non-causal with a padding mask, p = 128, fp32, p = 24 with 17 heads; sm_80 at two
shapes), and lets Triton's JIT build each launch for sm_90 with its own specialization of the
arguments (ints equal to 1 as constexprs, divisibility by 16, each pointer's dtype), the plan's
constexprs and warps: what the GPU builds, read back from the cubin as the CUDA driver reports
it. It runs under the default Triton and under the GPU machines' (torch 2.11's Triton 3.6.0 with
its ptxas 12.8, installed beside the default: .ci/run does), which build different code. Every
build must stay within 128 registers a thread and spill nothing to local memory, which would
cost the memory traffic the kernels exist to save; none may use an atomic, reduction or fence
instruction (the kernels' determinism rests on no program waiting on or adding into another's
data); and bf16 tiles move as vectors at p = 64. The builds run in the background from the
start of the session (tests/background.py), after the interpreter run in priority; this file
sorts late, so that the suite's other tests run meanwhile. The same job builds the re-tiled causal
kernels (kernels/triton_retiled.py) at their own shapes, held to the same bounds.

    NANOTOST_GPU_TRITON_DIR=DIR python -m pytest -q tests/test_triton_builds.py
"""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

import background

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GPU_BUILD = os.path.join(ROOT, "tests", "helpers_gpu_build.py")
GPU_TRITON_PIN = os.path.join(ROOT, "tests", "requirements-gpu-triton.txt")  # the GPU machines' Triton
with open(GPU_TRITON_PIN) as _f:
    GPU_TRITON = re.search(r"^triton==(\S+)$", _f.read(), re.M).group(1)
TRITONS = ("default", GPU_TRITON)
MAX_REGISTERS = 128
# What the JIT built on an H200 (Triton 3.6.0, torch 2.11) for each kernel, in the order of
# `python -m kernels.gpu_check profile`'s shapes (B1 T16K, B16 T1K, B1 T64K): its "compiled"
# section, measured at the commit its name ends with.
H200_PROFILE = os.path.join(ROOT, "results", "nvidia-h200-profile-9b494a4.json")
H200_PROFILE_COMMIT = re.search(r"-([0-9a-f]+)\.json$", H200_PROFILE).group(1)
PROFILED_SOURCE = os.path.join(background.SCRATCH, "profiled_triton_tssa.py")  # kernels/triton_tssa.py at that commit


def gpu_triton_dir():
    """(folder, None): where the GPU machines' Triton is installed beside the default (the folder
    NANOTOST_GPU_TRITON_DIR names); or (None, why it cannot be used)."""
    path = os.environ.get("NANOTOST_GPU_TRITON_DIR")
    if not path:
        return None, (f"Triton {GPU_TRITON} (the GPU machines') is not installed beside the default: "
                      f"pip install --no-deps --target DIR -r tests/requirements-gpu-triton.txt, then set "
                      f"NANOTOST_GPU_TRITON_DIR=DIR (.ci/run does)")
    found = [d.version for d in importlib.metadata.distributions(path=[path]) if d.metadata["Name"] == "triton"]
    if found != [GPU_TRITON]:
        return None, f"NANOTOST_GPU_TRITON_DIR={path} holds triton {found or 'nothing'}, not {GPU_TRITON}"
    return path, None


def gpu_build_missing(which):
    """Why the build under `which` Triton ("default" or the GPU machines') cannot run here, or None."""
    try:
        import triton
    except ImportError:
        return "triton is not installed (requirements-dev.txt installs it on Linux x86-64)"
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")):
        return "this triton build has no NVIDIA back end (ptxas, cuobjdump)"
    return None if which == "default" else gpu_triton_dir()[1]


def start_gpu_build(which):
    side = gpu_triton_dir()[0] if which != "default" else None
    path_var = os.pathsep.join(([side] if side else []) + [ROOT, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path_var, TRITON_DEFAULT_FP_FUSION="1",  # the default of both, said
               TRITON_CACHE_DIR=os.path.join(background.SCRATCH, f"triton-cache-{which}"))
    env.pop("TRITON_INTERPRET", None)
    argv = [sys.executable, GPU_BUILD, os.path.join(background.SCRATCH, f"gpu-build-{which}.json")]
    if side and write_profiled_source():  # the source the H200 profile ran, built at its shapes too
        argv.append(PROFILED_SOURCE)
    background.start(f"gpu build {which}", argv, env=env, cwd=ROOT, nice=15)  # after the interpreter run


def write_profiled_source():
    """Write kernels/triton_tssa.py as the H200 profile ran it (from git) to PROFILED_SOURCE;
    False where this clone's history does not hold that commit (or git is missing)."""
    try:
        source = subprocess.run(["git", "show", f"{H200_PROFILE_COMMIT}:kernels/triton_tssa.py"], cwd=ROOT,
                                capture_output=True, text=True)
    except OSError:
        return False
    if source.returncode == 0:
        with open(PROFILED_SOURCE, "w") as f:
            f.write(source.stdout)
    return source.returncode == 0


def gpu_builds(which):
    """The build job's result under `which` Triton: skipped where it cannot run, a failure where
    NANOTOST_GPU_TRITON_DIR names a folder that does not hold the GPU machines' Triton (as in CI)."""
    missing = gpu_build_missing(which)
    if missing and which != "default" and os.environ.get("NANOTOST_GPU_TRITON_DIR"):
        pytest.fail(missing)
    if missing:
        pytest.skip(missing)
    start_gpu_build(which)  # a no-op where the session started it already
    background.succeeded(f"gpu build {which}", timeout=900)
    with open(os.path.join(background.SCRATCH, f"gpu-build-{which}.json")) as f:
        return json.load(f)


def offending(rows, builds, bad):
    """The builds for which bad(build) holds, as one line: each one's kernel, registers, local
    memory and warps, and the cases that launch it ("" if none)."""
    found = {}
    for r in rows:
        b = builds[r["build"]]
        if bad(b):
            what = f"{b['regs']} registers, {b['local_bytes']} B local a thread, {b['num_warps']} warps"
            found.setdefault(f"{r['kernel']} ({what})", []).append(r["name"])
    return "; ".join(f"{k} at {', '.join(names)}" for k, names in found.items())


@pytest.mark.parametrize("which", TRITONS)
def test_triton_kernels_built_as_the_gpu_builds_them(which):
    result = gpu_builds(which)
    import helpers_gpu_build as gb
    from kernels import triton_tssa
    rows, builds = result["rows"], result["builds"]
    build = lambda r: builds[r["build"]]  # noqa: E731
    # every case made the forward's and the backward's launches in order, every decoding step _k_step
    launched = {}
    for r in rows:
        launched.setdefault(r["name"], []).append(r["kernel"])
    assert launched == {c["name"]: list(triton_tssa.FORWARD + triton_tssa.BACKWARD) for c in gb.CASES} | {
        s["name"]: ["_k_step"] for s in gb.STEPS}
    assert all(build(r)["num_warps"] == r["plan_warps"] for r in rows)  # the plan's warps, as launched
    # built as the JIT specializes: B = 1 a constexpr, other B not; the bool mask *u1 (its stand-in
    # fp32); w in its dtype; strides divisible by 16 marked so
    grad_w = {r["name"]: build(r)["signature"] for r in rows if r["kernel"] == "_k_grad_w"}
    assert grad_w["op B1 T16K"]["B"] == "constexpr" and grad_w["op B16 T1K"]["B"] == "i32"
    assert grad_w["noncausal masked B16 T1K"]["mask_ptr"] == "*u1" and grad_w["op B16 T1K"]["mask_ptr"] == "*fp32"
    assert grad_w["fp32 B1 T16K"]["w_ptr"] == "*fp32" and grad_w["op B16 T1K"]["w_ptr"] == "*bf16"
    assert "s_t" in build(rows[0])["divisible_by_16"]
    assert all(b["regs"] > 0 for b in builds)
    assert all(build(r)["sass_lines"] > 100 for r in rows if r["name"] in gb.SASS_CASES)  # the dumps were read
    # w, g, out and dw: _tile's loads and _store_tile's stores; at p = 64 (a token's features a
    # whole tile row) bf16 ones move as vectors (or through cp.async, the software pipeline)
    tile_moves = lambda b: b["moves"].get("_tile", []) + b["moves"].get("_store_tile", [])  # noqa: E731
    assert any(".v4." in m for b in builds for m in tile_moves(b))  # the PTX was read
    problems = {
        "spill registers to local memory": offending(rows, builds, lambda b: b["local_bytes"] > 0),
        f"use more than {MAX_REGISTERS} registers a thread": offending(rows, builds,
                                                                       lambda b: b["regs"] > MAX_REGISTERS),
        "use atomics or fences": offending(rows, builds, lambda b: b["ptx_sync"] or b["sass_sync"]),
        "move bf16 tiles one element at a time": offending(
            [r for r in rows if r["dtype"] == "bfloat16" and r["p"] % 16 == 0], builds,
            lambda b: any(m.endswith((".b16", ".u16")) for m in tile_moves(b)))}
    problems = [f"kernels {what}: {where}" for what, where in problems.items() if where]
    assert not problems, f"Triton {result['triton']} ({result['ptxas']}), sm_90 unless named: " + "\n".join(problems)


@pytest.mark.parametrize("which", TRITONS)
def test_retiled_kernels_built_as_the_gpu_builds_them(which):
    """kernels/triton_retiled.py's ten launches at helpers_gpu_build.RETILED_CASES, as the JIT
    builds them for sm_90 (sm_80 where named): at most 128 registers a thread, no spill, no atomic
    or fence; B1, B2 and B3 (EXACT_TERMS) without a fused multiply-add, so that each computes the
    dL/dM and dL/dS terms another takes out of its totals with the same roundings (and fp fusion
    on elsewhere: the count reads the PTX); bf16 and fp16 rows (widths multiples of 16) move as
    16-byte vectors (stores v4, the row loop's asynchronous copies 16 bytes, and never one element
    at a time)."""
    result = gpu_builds(which)
    import helpers_gpu_build as gb
    from kernels import triton_retiled
    rows, builds = result["retiled_rows"], result["retiled_builds"]
    build = lambda r: builds[r["build"]]  # noqa: E731
    launched = {}
    for r in rows:
        launched.setdefault(r["name"], []).append(r["kernel"])
    assert launched == {c["name"]: list(triton_retiled.FORWARD + triton_retiled.BACKWARD) for c in gb.RETILED_CASES}
    assert all(build(r)["num_warps"] == r["plan_warps"] for r in rows)
    exact = [build(r)["fma"] for r in rows if r["kernel"] in triton_retiled.EXACT_TERMS]
    assert exact and not any(exact)
    assert all(build(r)["fma"] > 0 for r in rows if r["kernel"] in ("_r_pi", "_r_out"))
    half = [r for r in rows if r["dtype"] in ("bfloat16", "float16") and r["kernel"] != "_r_scan"]
    moves = lambda b: [m for ms in b["moves"].values() for m in ms]  # noqa: E731
    assert all(16 in build(r)["copy_bytes"] for r in half)  # w (and g) rows: 16-byte cp.async
    assert all(any(m.startswith("st.global.v4") for m in moves(build(r))) for r in half
               if r["kernel"] in ("_r_out", "_r_grad_w"))
    problems = {
        "spill registers to local memory": offending(rows, builds, lambda b: b["local_bytes"] > 0),
        f"use more than {MAX_REGISTERS} registers a thread": offending(rows, builds,
                                                                       lambda b: b["regs"] > MAX_REGISTERS),
        "use atomics or fences": offending(rows, builds, lambda b: b["ptx_sync"]),
        "move half-precision values one at a time": offending(half, builds, lambda b: any(
            m.endswith((".b16", ".u16")) for m in moves(b)))}
    problems = [f"kernels {what}: {where}" for what, where in problems.items() if where]
    assert not problems, f"Triton {result['triton']} ({result['ptxas']}), sm_90 unless named: " + "\n".join(problems)


def test_triton_build_reproduces_what_the_h200_built():
    """The JIT's build here, of kernels/triton_tssa.py as the H200 profile ran it, under the
    GPU machines' Triton, at the profile's shapes, is what the H200's JIT built: registers,
    local memory (Triton's n_spills is the driver's local bytes / 4), warps, stages, shared
    memory, for every kernel."""
    result = gpu_builds(GPU_TRITON)
    if "profiled_rows" not in result:
        pytest.skip(f"this clone's git history does not hold commit {H200_PROFILE_COMMIT} (the profiled source)")
    with open(H200_PROFILE) as f:
        compiled = json.load(f)["result"]["compiled"]
    built = {}
    for r in result["profiled_rows"]:  # each kernel's builds, in the order the JIT first built them
        if r["build"] not in built.setdefault(r["kernel"], []):
            built[r["kernel"]].append(r["build"])
    assert set(compiled) == set(built)
    for kernel, on_gpu in compiled.items():
        here = [result["profiled_builds"][b] for b in built[kernel]]
        assert [(g["n_regs"], g["n_spills"], g["num_warps"], g["num_stages"], g["shared"]) for g in on_gpu] == \
            [(b["regs"], b["local_bytes"] // 4, b["num_warps"], b["num_stages"], b["shared"]) for b in here], kernel


def start_in_background(names):
    """tests/conftest.py: the builds under each Triton start when the session has chosen these tests."""
    for which in TRITONS:
        if gpu_build_missing(which) is None:
            start_gpu_build(which)
