"""
tssa_impl="auto" (kernels/auto.py): the reference with one warning where the Triton kernels
cannot serve (this CPU; a check that raises; kernels that answer differently), the Triton
kernels where their first-call check passes (forced on the CPU under TRITON_INTERPRET=1, in a
subprocess: Triton fixes interpreter mode at import), and the GPU configs that use it.

    python -m pytest -q tests/test_auto.py
"""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import cli  # noqa: E402
import kernels  # noqa: E402
import model  # noqa: E402
from kernels import auto, fused  # noqa: E402  (fused: the process's FusedOps)

TINY = dict(block_size=64, vocab_size=96, n_layer=2, n_head=4, n_embd=32)


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    """Every test asks the question anew (the answer is kept per process)."""
    monkeypatch.setattr(auto, "_REFUSALS", {})


def auto_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if "tssa_impl='auto'" in str(w.message)]


def test_auto_on_the_cpu_runs_the_reference_with_one_warning():
    torch.manual_seed(0)
    ref = model.GPT(model.GPTConfig(**TINY)).eval()
    picked = kernels.use(model.GPT(model.GPTConfig(**TINY)), "auto").eval()
    picked.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 96, (2, 40))

    def twice():  # training form, then decoding (a prompt and steps): one warning in all
        out = [picked(idx)[0] for _ in range(2)]
        return out, picked.generate(idx[:, :8], 4, temperature=0)
    (outs, tokens), said = auto_warnings(twice)
    assert len(said) == 1 and "run on CUDA, this is a cpu device" in said[0] and "reference" in said[0]
    for out in outs:
        assert torch.equal(out, ref(idx)[0])  # the same operators: bit for bit
    assert torch.equal(tokens, ref.generate(idx[:, :8], 4, temperature=0))


def test_a_check_that_raises_or_disagrees_falls_back_with_its_cause(monkeypatch):
    monkeypatch.setattr(auto, "CHECK_ON_CPU", True)

    def broken(device):
        raise RuntimeError("PTX assembly failed\nmore lines")
    monkeypatch.setattr(auto, "differences", broken)
    ops, said = auto_warnings(lambda: auto.chosen(torch.device("cpu")))
    assert ops is model.REFERENCE_OPS and said == [
        "tssa_impl='auto': the Triton check raised RuntimeError: PTX assembly failed; running model.py's reference maths"]
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(auto, "differences", lambda device: {"tssa[1]": 0.5, "causal_tssa[0]": 1e-7})
    ops, said = auto_warnings(lambda: auto.chosen(torch.device("cpu")))
    assert ops is model.REFERENCE_OPS and len(said) == 1 and "tssa[1] by 0.5 of its largest value" in said[0]
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(auto, "differences", lambda device: {"causal_tssa[0]": float("nan")})
    assert auto_warnings(lambda: auto.chosen(torch.device("cpu")))[0] is model.REFERENCE_OPS  # nan is no pass
    # kernels turned off by an earlier call of the process agree with the reference (it ran): still refused
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(auto, "differences", lambda device: {"causal_tssa[0]": 0.0})
    kernels.ops_for("triton")
    monkeypatch.setattr(fused._OPS["triton"], "failure", "ImportError: no Triton")
    ops, said = auto_warnings(lambda: auto.chosen(torch.device("cpu")))
    assert ops is model.REFERENCE_OPS and "off in this process: ImportError: no Triton" in said[0]


def test_the_gpu_configs_use_auto_and_every_script_accepts_it():
    import train
    for name in ("tost_owt", "tost_owt_16k", "tost_owt_medium", "tost_owt_large"):
        C, _ = cli.configure(train.DEFAULTS, [os.path.join(ROOT, "config", f"{name}.py")])
        assert C.tssa_impl == "auto", name
    assert "auto" in kernels.IMPLS and kernels.ops_for("auto") is auto.AUTO_OPS


PICKS_TRITON = textwrap.dedent("""
    import warnings
    import torch
    import kernels, model
    from kernels import auto, fused, triton_tssa
    assert triton_tssa.INTERPRET
    auto.CHECK_ON_CPU = True  # the check runs here as it does on a CUDA GPU
    torch.manual_seed(0)
    cfg = model.GPTConfig(block_size=48, vocab_size=64, n_layer=1, n_head=2, n_embd=16)
    ref = model.GPT(cfg)
    picked = kernels.use(model.GPT(cfg), "auto")
    picked.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 64, (1, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any fallback is a failure here
        _, loss = picked(idx, idx)
        assert auto.chosen(idx.device).causal_tssa.__self__.impl == "triton"
        assert auto.chosen(idx.device).causal_tssa.__self__.failure is None
    # fp32 sums in another order: 1e-4 of the loss
    torch.testing.assert_close(loss, ref(idx, idx)[1], rtol=1e-4, atol=0)
    # compiled, as the GPU configs run it: the answer is a constant of the graph, the kernels custom operators
    auto._REFUSALS.clear()
    fused.PROBE_ON_CPU = True  # the operators' start-up probe runs here as on a GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, compiled_loss = torch.compile(picked, backend="aot_eager")(idx, idx)  # the graph, without a C++ build
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-6, atol=0)
    print("picked triton", auto._REFUSALS)
""")


def test_auto_picks_the_triton_kernels_where_their_check_passes():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", PICKS_TRITON], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "picked triton {'cpu': None}" in proc.stdout
