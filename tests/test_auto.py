"""
tssa_impl="auto" (kernels/auto.py): the reference with one warning where the Triton kernels
cannot serve (this CPU; a check that raises; kernels that answer differently); where they pass,
the faster of them and the reference at the call's shape (the timer mocked here: speed is
measured by bench.py, never by a test), once per device and shape class; and, in the scripts'
own flows, the Triton kernels picked: tests/test_scripts_auto.py.

    python -m pytest -q tests/test_auto.py
"""

import os
import sys
import warnings

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import cli  # noqa: E402
import kernels  # noqa: E402
import model  # noqa: E402
from kernels import auto, check, fused  # noqa: E402  (fused: the process's FusedOps)

TINY = dict(block_size=64, vocab_size=96, n_layer=2, n_head=4, n_embd=32)
ONE_LAYER = dict(TINY, n_layer=1)  # what is traced: one block


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    """Every test asks the questions anew (the answers are kept per process)."""
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(auto, "_PICKS", {})


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
    assert auto._PICKS == {}  # nothing timed where the check refused


def test_a_check_that_raises_or_disagrees_falls_back_with_its_cause(monkeypatch):
    monkeypatch.setattr(auto, "CHECK_ON_CPU", True)
    w = torch.randn(2, 3, 40, 8)

    def picked():
        return auto.uses_triton("causal_tssa", w)

    def broken(device, impl):
        raise RuntimeError("PTX assembly failed\nmore lines")
    monkeypatch.setattr(check, "differences", broken)
    triton, said = auto_warnings(picked)
    assert not triton and said == [
        "tssa_impl='auto': the Triton check raised RuntimeError: PTX assembly failed; running model.py's reference maths"]
    # a difference is said in MATH.md's words: the operator and what differs
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(check, "differences", lambda device, impl: {
        ("tssa", "Pi"): 1e-7, ("tssa", "the gradient with respect to Pi's temperature"): 0.5,
        ("causal_tssa", "the update -Pi w f'(s)"): 1e-7})
    triton, said = auto_warnings(picked)
    assert not triton and said == [
        "tssa_impl='auto': the Triton kernels differ from model.py's operators: tssa in the gradient with respect to "
        "Pi's temperature (by 0.5 of its largest value); running model.py's reference maths"]
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(check, "differences", lambda device, impl: {("causal_tssa", "Pi"): float("nan")})
    assert not auto_warnings(picked)[0]  # nan is no pass
    # kernels turned off by an earlier call of the process agree with the reference (it ran): still refused
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(check, "differences", lambda device, impl: {("causal_tssa", "Pi"): 0.0})
    kernels.ops_for("triton")
    monkeypatch.setattr(fused._OPS["triton"], "failure", "ImportError: no Triton")
    triton, said = auto_warnings(picked)
    assert not triton and "off in this process: ImportError: no Triton" in said[0]
    assert auto._PICKS == {}  # a refused device times nothing


# -----------------------------------------------------------------------------
# correct, then faster: the timer mocked


@pytest.fixture
def timed(monkeypatch, capsys):
    """Triton passes the check here; the timer answers TIMES (seconds by candidate); returns the
    specs timed and a function giving what was printed."""
    monkeypatch.setattr(auto, "triton_refusal", lambda device: None)
    specs = []
    times = {"triton": 1e-3, "reference": 2e-3}

    def seconds(candidate, run, device, repeats):
        specs.append((candidate, device))
        return times[candidate]
    monkeypatch.setattr(auto, "seconds", seconds)
    monkeypatch.setattr(auto, "measure_in_child", lambda spec: specs.append(("child", spec)) or dict(times))
    return dict(specs=specs, times=times, said=lambda: capsys.readouterr().out.splitlines())


def test_auto_runs_the_faster_of_the_kernels_that_agree(timed):
    w = torch.randn(3, 2, 40, 8)
    assert auto.uses_triton("causal_tssa", w)  # Triton 1 ms, the reference 2 ms
    assert timed["said"]() == ["tssa_impl=auto: causal_tssa at B=3 H=2 T=40 p=8 float32 on cpu: Triton 1.000 ms, "
                               "the reference 2.000 ms (forward and backward): running Triton"]
    assert timed["specs"] == [("triton", torch.device("cpu")), ("reference", torch.device("cpu"))]
    timed["times"]["triton"] = 3e-3  # a slower correct kernel is not picked
    assert not auto.uses_triton("causal_tssa", torch.randn(3, 2, 200, 8))  # another shape class: timed anew
    assert timed["said"]()[0].endswith("Triton 3.000 ms, the reference 2.000 ms (forward and backward): "
                                       "running the reference")
    # the answer is kept per (device, shape class): B and T up to powers of two, H, p, dtype, mask
    assert auto.uses_triton("causal_tssa", torch.randn(4, 2, 33, 8))  # B 3 -> 4, T 40 -> 64: the first class
    assert not auto.uses_triton("causal_tssa", torch.randn(3, 2, 256, 8))
    assert len(timed["specs"]) == 4 and timed["said"]() == []
    assert auto.uses_triton("tssa", w, masked=True) is False  # another operator, another class: timed, slower
    assert auto.uses_triton("causal_tssa_step", w[:, :, 0]) is False
    assert timed["said"]()[1].startswith("tssa_impl=auto: causal_tssa_step at B=3 H=2 T=1 p=8 float32 on cpu")
    assert len(auto._PICKS) == 4 and len(timed["specs"]) == 8


def test_what_the_kernels_never_run_is_never_timed(timed):
    w = torch.randn(2, 2, 40, 8)
    assert not auto.uses_triton("causal_tssa", w.double()) and not auto.uses_triton("causal_tssa", w, pi_mode="uniform")
    assert timed["specs"] == [] and auto._REFUSALS == {}


def test_inside_torch_compile_the_reference_is_timed_compiled_and_the_choice_is_a_constant(timed):
    """The first call inside torch.compile's trace times the compiled reference (in a child
    process: a compile cannot start inside another); the graph holds the answer, no break."""
    timed["times"]["triton"] = 3e-3  # here the reference is faster (the Triton kernels cannot run on this CPU)
    torch.manual_seed(0)
    m = kernels.use(model.GPT(model.GPTConfig(**ONE_LAYER)), "auto")
    idx = torch.randint(0, 96, (2, 40))
    with torch.no_grad():
        eager = m(idx)[0]
        explained = torch._dynamo.explain(m)(idx)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(m, backend="aot_eager")(idx)[0]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)  # the reference both times
    (_, spec), = [s for s in timed["specs"] if s[0] == "child"]
    assert spec == dict(device="cpu", form="causal_tssa", shape=(2, 4, 64, 8), dtype="float32", masked=False,
                        compiled=True, backend=auto.COMPILE_BACKEND, repeats=auto.REPEATS)  # the class's size
    said = timed["said"]()
    assert said[0].startswith("tssa_impl=auto: causal_tssa at B=2 H=4 T=40 p=8 float32 on cpu: ")  # eager: its own
    assert said[0].endswith("the reference 2.000 ms (forward and backward): running the reference")
    assert said[1].startswith("tssa_impl=auto: causal_tssa at B=2 H=4 T=64 p=8 float32 on cpu: ")
    assert said[1].endswith("Triton 3.000 ms, the compiled reference 2.000 ms (forward and backward): running the "
                            "compiled reference")
    assert sorted(k[2] for k in auto._PICKS) == [False, True]  # eager and compiled: each its own answer


def test_compiled_lengths_of_one_shape_class_share_a_graph_and_an_answer(timed):
    """Under torch.compile the answer depends on the shape class alone: sequences of other
    lengths in one class do not recompile the model once its length is dynamic, nor time again."""
    timed["times"]["triton"] = 3e-3  # the reference (the Triton kernels cannot run on this CPU)
    torch.manual_seed(0)
    m = kernels.use(model.GPT(model.GPTConfig(**ONE_LAYER)), "auto")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    compiled = torch.compile(m, backend=backend)
    with torch.no_grad():
        for T in (33, 40, 50, 64):  # one class: T up to 64
            compiled(torch.randint(0, 96, (2, T)))
    assert len(graphs) == 2  # the first length, then one graph with the length dynamic
    assert len([s for s in timed["specs"] if s[0] == "child"]) == 1 and len(timed["said"]()) == 1


def test_the_timer_warms_up_then_takes_the_median_of_its_repeats(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # three timed calls: 1, 3 and 2 seconds
    monkeypatch.setattr(auto.time, "perf_counter", lambda: next(clock))
    calls = []
    assert auto.seconds("triton", lambda: calls.append(1), "cpu", 3) == 2.0
    assert len(calls) == 4  # one warm-up (compiles, builds), then REPEATS


def test_the_gpu_configs_use_auto_and_every_script_accepts_it():
    import train
    for name in ("tost_owt", "tost_owt_16k", "tost_owt_medium", "tost_owt_large"):
        C, _ = cli.configure(train.DEFAULTS, [os.path.join(ROOT, "config", f"{name}.py")])
        assert C.tssa_impl == "auto", name
    assert "auto" in kernels.IMPLS and kernels.ops_for("auto") is auto.AUTO_OPS
