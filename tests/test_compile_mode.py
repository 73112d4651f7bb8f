"""
Issue 52, item 1: the trainers' compile_mode (torch.compile's mode: "reduce-overhead" replays the
compiled micro-step as CUDA graphs) reaches torch.compile from each trainer's own flow, is refused
in one line where the run does not compile, and the compiled micro-step with the Triton kernels is
one graph with no host sync (what CUDA graphs need: a sync inside a captured step would break the
capture, and a graph break would leave the kernels between graphs, launched from the host).

    python -m pytest -q tests/test_compile_mode.py
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nanotost import trainkit as tk  # noqa: E402
from test_error_classes import TRAINERS  # noqa: E402
from test_errors import call, data, refused  # noqa: E402, F401  (data: the fixture)


@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
@pytest.mark.parametrize("script", sorted(TRAINERS))
def test_compile_mode_reaches_torch_compile_in_every_trainer(script, mode, data, monkeypatch):
    """Each trainer, run as its command line runs it, hands torch.compile the mode given (the
    compile itself stands aside: the model runs eagerly, so the test takes seconds)."""
    seen = []

    def recorded(module, **kwargs):
        seen.append(kwargs.get("mode"))
        return module

    monkeypatch.setattr(torch, "compile", recorded)
    code, message = call(script, *TRAINERS[script](str(data)), "--out_dir=out", "--max_iters=1", "--eval_interval=1",
                         "--compile=True", f"--compile_mode={mode}", monkeypatch=monkeypatch)
    assert (code, message) == (0, "")
    assert seen == [mode]


@pytest.mark.parametrize("script", sorted(TRAINERS))
def test_compile_mode_is_read_by_a_compiled_run_alone(script, data, monkeypatch):
    message = refused(script, *TRAINERS[script](str(data)), "--out_dir=out", "--max_iters=1",
                      "--compile_mode=reduce-overhead", root=data, monkeypatch=monkeypatch)
    assert message == (f"{script}: --compile_mode: torch.compile's mode, read by a compiled run alone: add "
                       "--compile=True, or drop it")
    message = refused(script, *TRAINERS[script](str(data)), "--out_dir=out", "--max_iters=1", "--compile=True",
                      "--compile_mode=fastest", root=data, monkeypatch=monkeypatch)
    assert message == (f"{script}: compile_mode must be one of {', '.join(tk.COMPILE_MODES)}, got 'fastest'")


STEP_SCRIPT = textwrap.dedent("""
    import warnings
    import torch, torch._dynamo, model, kernels
    from torch.utils._python_dispatch import TorchDispatchMode
    from kernels import fused, triton_tssa
    assert triton_tssa.INTERPRET
    fused.PROBE_ON_CPU = True
    warnings.filterwarnings("error", "tssa_impl")  # a fallback to the reference would warn

    # what reads a tensor's value on the host (a sync on a GPU): .item(), bool(), equal, nonzero
    SYNCS = ("_local_scalar_dense", "is_nonzero", "equal", "nonzero", "allclose")

    class HostReads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen, self.ops = [], 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            if func.__name__.split(".")[0] in SYNCS:
                self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with HostReads() as found:  # (the detector sees what it looks for)
        torch.ones(2).sum().item()
    assert found.seen == ["_local_scalar_dense.default"], found.seen

    calls = []
    forward = triton_tssa.TritonKernels.forward.__func__
    triton_tssa.TritonKernels.forward = classmethod(lambda cls, *a, **k: calls.append(1) or forward(cls, *a, **k))
    torch.manual_seed(0)
    m = kernels.use(model.GPT(model.GPTConfig(block_size=32, vocab_size=50, n_layer=2, n_head=2, n_embd=32)), "triton")
    x = torch.randint(0, 50, (2, 32))
    explained = torch._dynamo.explain(m)(x, x)  # train.py's micro-step: the model's forward and loss
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="aot_eager")  # (Dynamo and AOTAutograd, without Inductor's C++ build)

    def micro_step():  # train.py's: the loss over the accumulation, then its backward
        _, loss = compiled(x, x)
        (loss / 2).backward()

    micro_step()  # compile and warm: the first call's checks and builds happen here, before any capture
    calls.clear()
    with HostReads() as found:
        micro_step()
    assert found.seen == [], f"host reads in the compiled micro-step: {found.seen}"
    assert found.ops > 50, found.ops  # (the mode sees the compiled graphs' ops)
    assert sum(calls) == 2, f"the Triton kernels ran {sum(calls)} times, not once a layer"
    print("ok")
""")


def test_the_compiled_micro_step_with_triton_is_one_graph_with_no_host_sync(tmp_path):
    """train.py's micro-step (forward, loss, backward) of a ToST model with tssa_impl=triton,
    compiled: no graph break, and after the first call not one op that reads a value back to
    the host (a GPU sync), the kernels running once a layer (interpreted on the CPU)."""
    pytest.importorskip("triton", reason="triton is not installed (its interpreter runs the kernels on the CPU)")
    env = dict(os.environ, TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", STEP_SCRIPT], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
