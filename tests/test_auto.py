"""
tssa_impl="auto" (kernels/auto.py): the reference with one warning where the Triton kernels
cannot serve (this CPU; a check that raises; kernels that answer differently); where they pass,
the faster of them and the reference by GPU time (CUDA events around calls queued back to back;
the timer and the events mocked here: speed is measured by bench.py, never by a test), once per
machine and shape class: kept in the cache (kernels/auto_cache.py), read by a later run, never
read for another key nor from a damaged or foreign file; forced by NANOTOST_AUTO; under
torchrun timed by local rank 0 alone (two gloo ranks: tests/auto_ranks.py); and, in the
scripts' own flows (train.py twice: the second reads the cache), tests/test_scripts_auto.py.

    python -m pytest -q tests/test_auto.py
"""

import json
import os
import subprocess
import sys
import time
import warnings
from contextlib import nullcontext

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernels  # noqa: E402
import model  # noqa: E402
from kernels import auto, auto_cache, fused  # noqa: E402  (fused: the process's FusedOps)
from nanotost import forks  # noqa: E402  (the fork checks auto runs)
from nanotost import cli  # noqa: E402

TINY = dict(block_size=64, vocab_size=96, n_layer=2, n_head=4, n_embd=32)
ONE_LAYER = dict(TINY, n_layer=1)  # what is traced: one block


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch, tmp_path):
    """Every test asks the questions anew (the answers are kept per process), with a cache of its
    own (never the user's), forcing nothing, outside torchrun."""
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(auto, "_PICKS", {})
    monkeypatch.setenv("NANOTOST_CACHE", str(tmp_path / "cache"))
    for name in ("NANOTOST_AUTO", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def new_process():
    """What a later run starts with: nothing kept in memory (the cache on disk stays)."""
    auto._REFUSALS.clear()
    auto._PICKS.clear()


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

    def broken(fused, device, T, p):
        raise RuntimeError("PTX assembly failed\nmore lines")
    monkeypatch.setattr(forks, "kernel_differences", broken)
    triton, said = auto_warnings(picked)
    assert not triton and said == [
        "tssa_impl='auto': the Triton check raised RuntimeError: PTX assembly failed; running model.py's reference maths"]
    # a difference is said in MATH.md's words: the operator and what differs
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(forks, "kernel_differences", lambda fused, device, T, p: {
        ("tssa", "Pi"): 1e-7, ("tssa", "the gradient with respect to Pi's temperature"): 0.5,
        ("causal_tssa", "the update -Pi w f'(s)"): 1e-7})
    triton, said = auto_warnings(picked)
    assert not triton and said == [
        "tssa_impl='auto': the Triton kernels differ from model.py's operators: tssa in the gradient with respect to "
        "Pi's temperature (by 0.5 of its largest value); running model.py's reference maths"]
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(forks, "kernel_differences", lambda fused, device, T, p: {("causal_tssa", "Pi"): float("nan")})
    assert not auto_warnings(picked)[0]  # nan is no pass
    # kernels turned off by an earlier call of the process agree with the reference (it ran): still refused
    monkeypatch.setattr(auto, "_REFUSALS", {})
    monkeypatch.setattr(forks, "kernel_differences", lambda fused, device, T, p: {("causal_tssa", "Pi"): 0.0})
    kernels.ops_for("triton")
    monkeypatch.setattr(fused._OPS["triton"], "failure", "ImportError: no Triton")
    triton, said = auto_warnings(picked)
    assert not triton and "off in this process: ImportError: no Triton" in said[0]
    assert auto._PICKS == {}  # a refused device times nothing


# -----------------------------------------------------------------------------
# correct, then faster: the timer mocked

CLASS = ("causal_tssa", 4, 2, 64, 8, "float32", False)  # (form, B, H, T, p, dtype, masked)


@pytest.fixture
def timed(monkeypatch, capsys):
    """Triton passes the check here; the timer answers TIMES (seconds by candidate); returns the
    specs timed and a function giving what was printed."""
    monkeypatch.setattr(auto, "triton_refusal", lambda device: None)
    specs = []
    times = {"triton": 1e-3, "reference": 2e-3}

    def seconds(candidate, run, device, calls, rounds):
        specs.append((candidate, device))
        return times[candidate]
    monkeypatch.setattr(auto, "seconds", seconds)
    monkeypatch.setattr(auto, "measure_in_child", lambda spec: specs.append(("child", spec)) or dict(times))
    return dict(specs=specs, times=times, said=lambda: capsys.readouterr().out.splitlines())


def ask(compiled=False, shape_class=CLASS):
    """auto's pick of a shape class on this CPU (the class's own shape)."""
    return auto.triton_picked("cpu", shape_class, None, compiled)


def file_of(line):
    """The file a line of auto's names: "(..., kept in <file>)" or "(..., cached in <file>)"."""
    return line.rsplit(" in ", 1)[1].split("): running")[0]


def test_auto_runs_the_faster_of_the_kernels_that_agree(timed, tmp_path):
    w = torch.randn(3, 2, 40, 8)
    assert auto.uses_triton("causal_tssa", w)  # Triton 1 ms, the reference 2 ms
    line, = timed["said"]()
    assert line == ("tssa_impl=auto: causal_tssa at B=3 H=2 T=40 p=8 float32 on cpu: Triton 1.000 ms, the reference "
                    f"2.000 ms (wall time of forward and backward, {auto.CALLS} calls back to back, kept in "
                    f"{file_of(line)}): running Triton")
    assert os.path.dirname(file_of(line)) == str(tmp_path / "cache" / "auto")  # $NANOTOST_CACHE/auto
    assert timed["specs"] == [("triton", torch.device("cpu")), ("reference", torch.device("cpu"))]
    timed["times"]["triton"] = 3e-3  # a slower correct kernel is not picked
    assert not auto.uses_triton("causal_tssa", torch.randn(3, 2, 200, 8))  # another shape class: timed anew
    line, = timed["said"]()
    assert "Triton 3.000 ms, the reference 2.000 ms (wall time" in line and line.endswith("running the reference")
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
    """The first call inside torch.compile's trace, with no pick yet, times the compiled reference
    in a child process (a compile cannot start inside another); the graph holds the answer."""
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
                        compiled=True, backend=auto.COMPILE_BACKEND, calls=auto.CALLS,
                        rounds=auto.ROUNDS)  # the class's size
    said = timed["said"]()
    assert said[0].startswith("tssa_impl=auto: causal_tssa at B=2 H=4 T=40 p=8 float32 on cpu: ")  # eager: its own
    assert "the reference 2.000 ms (wall time of forward and backward" in said[0]
    assert said[0].endswith("running the reference")
    assert said[1].startswith("tssa_impl=auto: causal_tssa at B=2 H=4 T=64 p=8 float32 on cpu: Triton 3.000 ms, "
                              "the compiled reference 2.000 ms (")
    assert said[1].endswith("running the compiled reference")
    assert sorted(k[2] for k in auto._PICKS) == [False, True]  # eager and compiled: each its own answer


def test_timed_at_decides_before_the_models_compile_in_this_process(timed):
    """kernels.use(..., timed_at=(B, T, dtype, compiled)), as train.py calls it: the pick of the
    class the model's causal TSSAs will call is decided at once, the compiled reference timed in
    this process (no child); the compiled model's trace then takes it without timing."""
    timed["times"]["triton"] = 3e-3  # (the reference: the Triton kernels cannot run on this CPU)
    torch.manual_seed(0)
    m = kernels.use(model.GPT(model.GPTConfig(**ONE_LAYER)), "auto", timed_at=(3, 40, "float32", True))
    assert auto._PICKS == {("cpu", ("causal_tssa", 4, 4, 64, 8, "float32", False), True): False}
    assert timed["specs"] == [("triton", torch.device("cpu")), ("reference", torch.device("cpu"))]  # here
    assert "B=4 H=4 T=64 p=8" in timed["said"]()[0]  # the class's size, as the trace would ask
    with torch.no_grad():
        torch.compile(m, backend="aot_eager")(torch.randint(0, 96, (3, 40)))
    assert len(timed["specs"]) == 2 and timed["said"]() == []  # the trace asked nothing new
    kernels.use(model.GPT(model.GPTConfig(**ONE_LAYER)), "auto", timed_at=(3, 40, "float64", True))
    assert len(auto._PICKS) == 1  # float64: the kernels never run it, nothing to decide


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


# -----------------------------------------------------------------------------
# the timer: GPU time of calls queued back to back (CUDA mocked), wall time on the CPU


def test_the_cpu_timer_warms_up_then_takes_the_median_of_windows_of_calls_back_to_back(monkeypatch):
    clock = iter([0.0, 3.0, 10.0, 19.0, 20.0, 26.0])  # three windows of 3 calls: 1, 3 and 2 s a call
    monkeypatch.setattr(auto.time, "perf_counter", lambda: next(clock))
    calls = []
    assert auto.seconds("triton", lambda: calls.append(1), "cpu", 3, 3) == 2.0
    assert len(calls) == 1 + 3 * 3  # one warm-up (compiles, builds), then the windows


class FakeCuda:
    """torch.cuda as the GPU timer uses it, on the CPU: a GPU clock (ms) that each call advances by
    its GPU time, a host clock (s) that it advances by its host time, events that read the GPU
    clock, and a log of what the host did, in order."""

    def __init__(self, monkeypatch):
        self.gpu_ms, self.host_s, self.log = 0.0, 0.0, []
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.at = None

            def record(self):
                cuda.log.append("record")
                self.at = cuda.gpu_ms

            def synchronize(self):
                cuda.log.append("wait for the event")

            def elapsed_time(self, end):
                return end.at - self.at
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.log.append("synchronize"))
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: self.log.append(("sleep", cycles)))
        monkeypatch.setattr(torch.cuda, "device", lambda device: nullcontext())
        monkeypatch.setattr(auto.time, "perf_counter", lambda: self.host_s)

    def call(self, gpu_ms, host_s):
        """A call that costs gpu_ms on the GPU and host_s on the host (launches, allocations)."""
        def run():
            self.log.append("call")
            self.gpu_ms += gpu_ms() if callable(gpu_ms) else gpu_ms
            self.host_s += host_s
        return run


def test_the_gpu_timer_counts_the_gpu_time_of_calls_queued_back_to_back(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    costs = iter([100.0, 1.0] + [1.0] * 4 + [5.0] * 4 + [2.0] * 4)  # warm-up, probe, windows: 1, 5, 2 ms a call
    assert auto.seconds("triton", cuda.call(lambda: next(costs), 0.01), "cuda:0", 4, 3) == pytest.approx(2e-3)
    window = [("sleep", int(2 * 4 * 0.01 * auto.SLEEP_CYCLES_PER_S)), "record", *["call"] * 4, "record",
              "wait for the event"]  # the GPU sleeps longer than the host takes to queue the 4 calls
    assert cuda.log == ["call", "synchronize", "call", "synchronize", *window * 3]  # no wait between the calls


def test_the_faster_by_gpu_time_wins_not_by_wall_time(monkeypatch, capsys):
    """The figures of issue 44 at B16 T1K: Triton 0.384 ms of GPU time and 1.383 ms of the host's
    per call, the reference 0.542 ms and 1.243 ms. A synchronised call's wall time would pick the
    reference; a training step that keeps the GPU's queue full feels the GPU time: Triton."""
    cuda = FakeCuda(monkeypatch)
    cost = {"triton": (0.384, 1.383e-3), "reference": (0.542, 1.243e-3)}  # (GPU ms, host s) a call
    monkeypatch.setattr(auto, "triton_refusal", lambda device: None)
    monkeypatch.setattr(auto, "runner", lambda spec, ops: cuda.call(
        *cost["reference" if ops.causal_tssa is model.causal_tssa else "triton"]))
    monkeypatch.setattr(auto_cache, "device_identity", lambda device: ("NVIDIA H200 sm_90 132 SMs", 12080, "12.8"))
    assert auto.triton_picked("cuda:0", ("causal_tssa", 16, 12, 1024, 64, "bfloat16", False), None, False)
    line, = capsys.readouterr().out.splitlines()
    assert line.startswith("tssa_impl=auto: causal_tssa at B=16 H=12 T=1024 p=64 bfloat16 on cuda:0: Triton 0.384 ms, "
                           "the reference 0.542 ms (GPU time of forward and backward, 10 calls back to back, kept in ")
    assert line.endswith("running Triton") and "synchronize" not in cuda.log[-8:]


# -----------------------------------------------------------------------------
# the cache: kept, read by a later run, never for another key nor from a damaged file


def test_a_pick_is_kept_on_disk_and_a_later_run_reads_it_without_timing(timed, monkeypatch):
    assert ask()  # timed: Triton 1 ms, the reference 2 ms
    path = file_of(timed["said"]()[0])
    with open(path, encoding="utf-8") as f:
        entry = json.load(f)  # data: JSON
    assert entry["key"] == auto_cache.key("cpu", CLASS, False, auto.COMPILE_BACKEND, auto.TIMER)
    assert (entry["pick"], entry["triton_s"], entry["reference_s"], entry["failed"]) == ("triton", 1e-3, 2e-3, None)
    new_process()
    timed["times"]["triton"] = 3e-3  # timed now, it would lose: the cache answers, not a timing
    assert ask() and len(timed["specs"]) == 2
    assert timed["said"]() == [f"tssa_impl=auto: causal_tssa at B=4 H=2 T=64 p=8 float32 on cpu: Triton 1.000 ms, "
                               f"the reference 2.000 ms (wall time of forward and backward, cached in {path}): "
                               f"running Triton"]
    monkeypatch.setenv("NANOTOST_AUTO", "measure")  # timed anew, and that answer kept
    new_process()
    assert not ask() and len(timed["specs"]) == 4 and file_of(timed["said"]()[0]) == path
    monkeypatch.delenv("NANOTOST_AUTO")
    new_process()
    assert not ask() and len(timed["specs"]) == 4 and "cached in" in timed["said"]()[0]


def edited_kernels(mp, tmp_path):
    """The kernels' source edited: a copy of the package with one line more in triton_tssa.py."""
    copy = tmp_path / "kernels_copy"
    copy.mkdir()
    for name in os.listdir(auto_cache.KERNELS):
        if name.endswith((".py", ".c")):
            text = open(os.path.join(auto_cache.KERNELS, name), encoding="utf-8").read()
            (copy / name).write_text(text + ("# an edit\n" if name == "triton_tssa.py" else ""), encoding="utf-8")
    mp.setattr(auto_cache, "KERNELS", str(copy))


def identity(gpu=None, driver=None, cuda=None):
    """device_identity with one part changed (another GPU, driver or CUDA runtime)."""
    real = auto_cache.device_identity

    def changed(device):
        g, d, c = real(device)
        return gpu or g, driver or d, cuda or c
    return changed


# key field -> a change of what it reads (the machine, the software, the code, the run), and,
# for the shape class, the class asked instead
LEVERS = {
    "gpu": lambda mp, tmp: mp.setattr(auto_cache, "device_identity", identity(gpu="NVIDIA H100 sm_90 132 SMs")),
    "driver": lambda mp, tmp: mp.setattr(auto_cache, "device_identity", identity(driver=12080)),
    "cuda": lambda mp, tmp: mp.setattr(auto_cache, "device_identity", identity(cuda="12.8")),
    "torch": lambda mp, tmp: mp.setattr(torch, "__version__", "2.99.0"),
    "triton": lambda mp, tmp: mp.setattr(auto_cache, "triton_version", lambda: "9.9.0"),
    "kernels": edited_kernels,
    "maths": lambda mp, tmp: mp.setattr(model, "f_prime", lambda s: 1.0 / (1.0 + s) ** 2),  # a fork's f
    "reference": lambda mp, tmp: mp.setattr(auto, "COMPILE_BACKEND", "aot_eager"),  # (asked compiled)
    "timer": lambda mp, tmp: mp.setattr(auto, "TIMER", "another way of timing"),
    "shape_class: form": lambda mp, tmp: ("tssa", *CLASS[1:]),
    "shape_class: B": lambda mp, tmp: (CLASS[0], 8, *CLASS[2:]),
    "shape_class: H": lambda mp, tmp: (*CLASS[:2], 4, *CLASS[3:]),
    "shape_class: T": lambda mp, tmp: (*CLASS[:3], 128, *CLASS[4:]),
    "shape_class: p": lambda mp, tmp: (*CLASS[:4], 16, *CLASS[5:]),
    "shape_class: dtype": lambda mp, tmp: (*CLASS[:5], "bfloat16", CLASS[6]),
    "shape_class: masked": lambda mp, tmp: (*CLASS[:6], True),
}


@pytest.mark.parametrize("field", list(LEVERS))
def test_a_kept_pick_is_not_read_when_any_key_field_differs(timed, monkeypatch, tmp_path, field):
    """A pick kept under one key is timed anew when one thing it depends on changes (the key then
    differs in that field alone), and read again once that thing is back."""
    compiled = field == "reference"
    key = lambda shape_class=CLASS: auto_cache.key("cpu", shape_class, compiled, auto.COMPILE_BACKEND,  # noqa: E731
                                                   auto.TIMER)
    before = key()
    assert ask(compiled) is True
    kept = file_of(timed["said"]()[0])
    with monkeypatch.context() as mp:
        shape_class = LEVERS[field](mp, tmp_path) or CLASS
        after = key(shape_class)
        assert {k for k in before if before[k] != after[k]} == {field.split(":")[0]}
        timed["times"]["triton"] = 3e-3
        new_process()
        assert ask(compiled, shape_class) is False and len(timed["specs"]) == 4  # timed anew
        assert file_of(timed["said"]()[0]) != kept
    new_process()
    assert ask(compiled) is True and len(timed["specs"]) == 4  # the first pick, read again
    line, = timed["said"]()
    assert "cached in" in line and file_of(line) == kept


def test_the_maths_digest_follows_model_pys_operators_as_they_run(monkeypatch):
    """Every change of the maths a TSSA call runs changes the digest: another f (two forks: two
    digests), an operator replaced, a guard's value; and model.py as shipped gives its own again."""
    shipped = auto_cache.maths_digest()
    seen = {shipped}
    for name, value in [("f_prime", lambda s: 1.0 / (1.0 + s) ** 2), ("f_prime", lambda s: 1.0 / (2.0 + s)),
                        ("causal_tssa", lambda *a, **k: model.tssa(*a[:2])), ("STAT_EPS", 1e-6)]:
        with monkeypatch.context() as mp:
            mp.setattr(model, name, value)
            seen.add(auto_cache.maths_digest())
    assert len(seen) == 5 and auto_cache.maths_digest() == shipped


def good_entry(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def changed(**fields):
    """A damage: the kept entry with some fields changed."""
    return lambda entry: json.dumps({**entry, **fields}).encode()


DAMAGES = {  # what may stand at a pick's file instead of it (a crash, a disk error, a hand, another program)
    "not UTF-8": lambda entry: b"\xff\xfe\x00garbage",
    "not JSON": lambda entry: b"import os; os.system('echo pwned')",
    "cut short": lambda entry: json.dumps(entry).encode()[:40],
    "empty": lambda entry: b"",
    "a list": lambda entry: b"[1, 2, 3]",
    "another key": lambda entry: json.dumps({**entry, "key": {**entry["key"], "gpu": "another GPU"}}).encode(),
    "no key": changed(key=None),
    "a time that is text": changed(triton_s="fast"),
    "a time that is NaN": changed(triton_s=float("nan")),
    "a negative time": changed(reference_s=-1.0),
    "a time that is a bool": changed(reference_s=True),
    "a pick that is no candidate": changed(pick="__import__('os')"),
    "a failed timing that picked Triton": changed(pick="triton", failed="it failed"),
    "no shape": changed(shape=None),
    "larger than a pick": lambda entry: json.dumps(entry).encode() + b" " * auto_cache.MAX_BYTES,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_or_foreign_cache_file_is_timed_anew_in_one_line(timed, damage):
    assert ask()
    path = file_of(timed["said"]()[0])
    damaged = DAMAGES[damage](good_entry(path))
    with open(path, "wb") as f:
        f.write(damaged)
    new_process()
    timed["times"]["triton"] = 3e-3
    assert ask() is False and len(timed["specs"]) == 4  # timed anew, never read
    ignored, kept = timed["said"]()
    assert ignored.startswith(f"tssa_impl=auto: ignoring the cached pick {path} (")
    assert ignored.endswith("); timing anew")
    assert file_of(kept) == path and good_entry(path)["pick"] == "reference"  # replaced by a good one


def test_a_cache_that_cannot_be_read_or_written_is_one_line_each_and_the_run_goes_on(timed):
    assert ask()
    path = file_of(timed["said"]()[0])
    os.remove(path)
    os.mkdir(path)  # a folder in the file's place: neither read nor replaced
    new_process()
    assert ask() is True and len(timed["specs"]) == 4
    said = timed["said"]()
    assert said[0].startswith(f"tssa_impl=auto: ignoring the cached pick {path} (")
    assert said[1].startswith(f"tssa_impl=auto: could not keep the pick in {path}: ")
    assert said[2].endswith("running Triton") and len(said) == 3


def test_a_failed_timing_runs_the_reference_on_this_runs_ranks_and_a_later_run_times_again(timed, monkeypatch):
    def out_of_memory(candidate, run, device, calls, rounds):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore")
    with monkeypatch.context() as mp:
        mp.setattr(auto, "seconds", out_of_memory)
        assert ask() is False
    assert timed["said"]() == ["tssa_impl=auto: causal_tssa at B=4 H=2 T=64 p=8 float32 on cpu: the timing raised "
                               "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB; running the reference"]
    with monkeypatch.context() as mp:  # another rank of this run, on this node: the failure is its answer
        mp.setenv("LOCAL_RANK", "1")
        mp.setenv("LOCAL_WORLD_SIZE", "2")
        new_process()
        assert ask() is False and timed["specs"] == [] and timed["said"]() == []
    monkeypatch.setattr(auto_cache, "STARTED", time.time() + 1)  # a later run: times it
    new_process()
    assert ask() is True and len(timed["specs"]) == 2 and "kept in" in timed["said"]()[0]


# -----------------------------------------------------------------------------
# forcing, and the ranks of a node


@pytest.mark.parametrize("force", ["triton", "torch"])
def test_nanotost_auto_forces_a_pick_without_timing(timed, monkeypatch, force):
    monkeypatch.setenv("NANOTOST_AUTO", force)
    timed["times"]["triton"] = 3e-3 if force == "triton" else 1e-3  # what a timing would have picked: the other
    assert ask() is (force == "triton") and timed["specs"] == []
    running = "Triton" if force == "triton" else "the reference"
    assert timed["said"]() == [f"tssa_impl=auto: causal_tssa at B=4 H=2 T=64 p=8 float32 on cpu: running {running} "
                               f"(NANOTOST_AUTO={force}: nothing timed)"]


def test_forcing_triton_still_checks_the_kernels_and_a_wrong_value_is_one_line(monkeypatch):
    monkeypatch.setattr(auto, "CHECK_ON_CPU", True)
    monkeypatch.setattr(auto, "triton_refusal", lambda device: "the Triton kernels differ from model.py's operators")
    monkeypatch.setenv("NANOTOST_AUTO", "triton")
    triton, said = auto_warnings(ask)
    assert triton is False and said == ["tssa_impl='auto': the Triton kernels differ from model.py's operators; "
                                        "running model.py's reference maths"]
    monkeypatch.setenv("NANOTOST_AUTO", "fastest")
    with pytest.raises(cli.ConfigError, match="NANOTOST_AUTO must be one of triton, torch, measure"):
        kernels.use(model.GPT(model.GPTConfig(**TINY)), "auto")


def test_two_torchrun_ranks_of_a_node_run_local_rank_0s_pick(tmp_path):
    """Two gloo ranks as torchrun starts them (tests/auto_ranks.py), whose own timings would
    disagree: local rank 0 times, rank 1 waits for its file, and both run rank 0's pick."""
    out = tmp_path / "ranks.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "auto_ranks.py"), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        ranks = json.load(f)
    zero, one = ranks["0"], ranks["1"]
    assert zero["timed"] == ["triton", "reference"] and one["timed"] == []  # only local rank 0 timed
    assert one["waited"] and not zero["waited"]  # rank 1 waited for rank 0's file
    assert zero["picks"] == one["picks"] == [True]  # rank 0's pick (rank 1's own timing says the reference)
    assert zero["gathered"] == one["gathered"] == [[True], [True]]  # over the gloo group: every rank the same
    assert len(zero["said"]) == 1 and zero["said"][0].endswith("running Triton") and one["said"] == []


def test_the_gpu_configs_use_auto_and_every_script_accepts_it():
    import train
    for name in ("tost_owt", "tost_owt_16k", "tost_owt_medium", "tost_owt_large"):
        cfg, _ = cli.configure(train.DEFAULTS, [os.path.join(ROOT, "config", f"{name}.py")])
        assert cfg.tssa_impl == "auto", name
    assert "auto" in kernels.IMPLS and kernels.ops_for("auto") is auto.AUTO_OPS
