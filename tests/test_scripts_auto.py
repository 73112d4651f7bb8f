"""
tssa_impl="auto" in the scripts' own flows (issue 37): with the Triton kernels interpreted
(TRITON_INTERPRET=1) and kernels.auto.CHECK_ON_CPU set, the check and the timing run where each
script asks for them, and the Triton kernels are picked: train.py (at kernels.use, before its
model is compiled: eager, and compiled under bfloat16 autocast; run again, it reads the pick
from the cache and times nothing),
sample.py (prefill and steps, eval mode), evaluate.py (a no_grad main; and --tssa_impl=cpu),
lm_inspect.py, a model under inference_mode and autocast. The flows run in one background
process (tests/auto_in_scripts.py: Triton fixes interpreter mode at import), started when the
session has chosen its tests (tests/conftest.py), with the timer mocked (the Triton kernels the
faster); this file comes late in the suite so that the process has finished by then.

    python -m pytest -q tests/test_scripts_auto.py
"""

import json
import os
import sys

import pytest

import background
from test_kernels import triton_missing  # (why the Triton tests cannot run here)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IN_SCRIPTS = os.path.join(background.SCRATCH, "auto_in_scripts.json")


def start_job():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    background.start("auto in the scripts", [sys.executable, os.path.join(ROOT, "tests", "auto_in_scripts.py"),
                                             IN_SCRIPTS], env=env, cwd=ROOT,
                     nice=13)  # behind the interpreter run (waited for earlier), ahead of the GPU builds (later)


start_in_background = background.when_chosen(  # (the scripts' flows, beside the other tests; every test reads them)
    None, lambda: triton_missing() is None and start_job())


@pytest.fixture(scope="module")
def flows():
    if triton_missing():
        pytest.skip(triton_missing())
    start_job()  # a no-op where the session started it already
    background.succeeded("auto in the scripts", timeout=600)
    with open(IN_SCRIPTS) as f:
        return json.load(f)


FLOWS = {  # flow -> the operators its calls ask for, (operator, compiled), each in one or more shape classes
    "train": [["causal_tssa", False]],  # at kernels.use (timed_at), then estimate_loss under no_grad
    "train again": [["causal_tssa", False]],  # the same command: read from train's cache
    "train compiled bf16": [["causal_tssa", True]],  # at kernels.use, before torch.compile, under autocast
    "sample": [["causal_tssa", False], ["causal_tssa_step", False]],  # the start's decoding check, the prompt's
    # prefill, steps: no_grad, eval mode
    "evaluate": [["causal_tssa", False]],  # a @torch.no_grad main
    "lm_inspect": [["causal_tssa", False]],
    "inference_mode autocast": [["causal_tssa", False]],
}


@pytest.mark.parametrize("name", list(FLOWS))
def test_auto_picks_the_triton_kernels_in_the_scripts_flows(flows, name):
    r = flows[name]
    assert r["error"] is None and r["warned"] == [] and r["failure"] is None, r
    assert r["refusals"] == {"cpu": None}  # the whole check passed where the flow made its first call
    assert sorted({tuple(p[:2]) for p in r["picks"]}) == sorted(map(tuple, FLOWS[name])), r["picks"]
    assert all(p[2] for p in r["picks"]), r["picks"]  # each shape class: Triton
    assert len(r["said"]) == len(r["picks"]) and all(s.endswith("running Triton") for s in r["said"]), r["said"]
    # and the flow's own calls ran the Triton kernels (H=2, p=16; the check's are H=3, p=6)
    assert ["forward", 2, 16] in r["launched"], r["launched"]
    if name == "sample":
        assert ["step", 2, 16] in r["launched"]
    if name.startswith("train"):
        assert ["backward", 2, 16] in r["launched"]


def test_a_second_train_run_reads_the_pick_from_the_cache_and_times_nothing(flows):
    """The same train.py command run again (another out_dir) on the same machine: its line says
    "cached" and names the file the first run kept; no candidate was timed, no process started.
    (What it spends on the pick, a file read and the key's digests, is printed, not asserted.)"""
    first, again = flows["train"], flows["train again"]
    (kept,), (cached,) = first["said"], again["said"]
    assert first["timed"] == 2 and ", kept in " in kept  # the Triton kernels and the reference
    path = kept.rsplit(" kept in ", 1)[1].split("): running")[0]
    assert path.startswith(first["cache"]) and os.path.basename(os.path.dirname(path)) == "auto"
    assert again["timed"] == 0 and again["children"] == 0
    assert f"(wall time of forward and backward, cached in {path}): running Triton" in cached
    assert cached.split(": Triton ")[0] == kept.split(": Triton ")[0]  # the same shape class, device
    print(f"the second run decided in {again['deciding_s']:.3f} s (the first: {first['deciding_s']:.3f} s)")


def test_a_compiled_train_run_times_the_compiled_reference_in_its_own_process(flows):
    """train.py --compile=True decides before its torch.compile: no child process; a model whose
    first call is inside the trace (no timed_at) times it in a child."""
    assert flows["train compiled bf16"]["children"] == 0 and flows["train compiled bf16"]["timed"] == 2
    assert flows["a model, eager and compiled"]["children"] == 1


def test_evaluate_runs_with_the_c_kernels_under_its_no_grad_main_in_the_scripts_flows(flows):
    r, ref = flows["evaluate cpu"], flows["evaluate"]
    assert r["error"] is None and r["warned"] == [], r
    assert abs(r["numbers"]["loss"] - ref["numbers"]["loss"]) < 1e-4  # the same checkpoint and tokens, other kernels


def test_a_model_run_by_auto_in_the_scripts_flows_equals_the_reference_eager_and_compiled(flows):
    r = flows["a model, eager and compiled"]
    assert r["error"] is None and r["warned"] == [], r
    n = r["numbers"]
    assert abs(n["loss"] - n["reference_loss"]) <= 1e-4 * abs(n["reference_loss"])  # fp32 sums in another order
    assert abs(n["compiled_loss"] - n["loss"]) <= 1e-6 * abs(n["loss"])
    assert n["graph_breaks"] == 0  # the choice is a constant of the graph
    child, = flows["child"]  # the compiled reference was timed in its child process, as on a GPU
    assert set(child) == {"triton", "reference"} and all(t > 0 for t in child.values())
