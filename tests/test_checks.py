"""
The whole-maths check of the fused kernels (nanotost/forks.py), which tssa_impl=cpu, triton and
auto run before their kernels do: its cases reach the regimes a fork changes (Pi near 0 and
near 1, a prefix past the kernels' chunk groups, tiny and large feature scales, a padding mask);
the shipped maths passes with a wide margin; each fork a researcher makes is refused in one
line that says, in MATH.md's words, which operator differs and in what, with advice that runs
what model.py says (never tssa_impl=torch alone when model.py's parallel and decoding forms no
longer agree); and it runs the same under no_grad, inference_mode and autocast.

    python -m pytest -q tests/test_checks.py
"""

import inspect
import re

import pytest
import torch

import kernels
import model
from kernels.fused import case_size, fused_ops
from nanotost import forks
from kernels.cpu import KernelUnavailable, c_library
from test_fork import shipped_f


def c_missing():
    try:
        c_library()
    except KernelUnavailable as e:
        return f"the C kernels cannot be built here: {e}"
    return None


needs_c = pytest.mark.skipif(c_missing() is not None, reason=str(c_missing()))


@pytest.fixture(autouse=True)
def shipped(monkeypatch):
    shipped_f(monkeypatch)  # f as shipped, whatever fork model.py carries (tests/test_fork.py)


def tiny():
    return model.GPT(model.GPTConfig(block_size=24, vocab_size=31, n_layer=1, n_head=2, n_embd=16))


def edited(fn, after, line):
    """fn as a forker edits it: its source with `line` added after the first line that matches the
    regex `after`, defined in model.py's namespace (it looks up model's names as fn does)."""
    src = inspect.getsource(fn).splitlines()
    i = next(i for i, text in enumerate(src) if re.match(after, text))
    src.insert(i + 1, re.match(r"\s*", src[i]).group(0) + line)
    scope = {}
    exec("\n".join(src), vars(model), scope)
    return scope[fn.__name__]


def scaled(op, factor):
    """An operator whose update is factor times the reference's (the step rescaled), Pi unchanged."""
    def run(*args, **kwargs):
        res = op(*args, **kwargs)
        return (factor * res[0], res[1]) if isinstance(res, tuple) else factor * res
    return run


# -----------------------------------------------------------------------------
# the cases reach the regimes a fork changes


def reference_case(name):
    """Pi of the reference on a case of the check, and the case's (T, p)."""
    T, p = case_size("cpu")
    out, pi, *grads = forks.parallel(name, model.REFERENCE_OPERATORS, torch.device("cpu"), T, p, 0)
    return pi.detach(), T, p


@pytest.mark.parametrize("name", ["causal_tssa", "tssa"])
def test_the_cases_have_pi_near_0_and_1_and_features_of_every_scale(name):
    pi, T, p = reference_case(name)
    real = pi[pi > 0] if name == "tssa" else pi.flatten()  # (padding has Pi = 0)
    assert real.min() < 1e-4 and real.max() > 1 - 1e-4  # peaked: a floor or a temperature on Pi shows
    assert ((real > 0.05) & (real < 0.95)).float().mean() > 0.05  # and Pi of every size between
    w = forks.features(T, p, torch.Generator().manual_seed(0))
    s = (pi.unsqueeze(-1) * w.square()).sum(2) / pi.sum(2).unsqueeze(-1)  # (B, H, p), over all tokens
    assert s.min() < 1e-4 and s.max() > 1e4  # f'(s) near 1 and near 0: a clip of s shows


def test_the_non_causal_case_has_padding_and_the_decoding_steps_have_peaked_pi():
    pi, T, p = reference_case("tssa")
    assert (pi[0, :, 2 * T // 3:] == 0).all() and (pi[1, :, T // 2] == 0).all()  # padded tokens: no part
    prefill, (_, step_pi, *after) = forks.decoding(model.REFERENCE_OPERATORS, torch.device("cpu"), T, p)
    assert step_pi.min() < 1e-4 and step_pi.max() > 1 - 1e-4
    assert torch.allclose(prefill[2].sum(1), torch.full((forks.B,), float(T)))  # the prefill: the prompt's sums


def test_the_long_prefix_crosses_the_kernels_steps_over_chunks_and_ends_inside_a_chunk(monkeypatch):
    from kernels.cpu import CKernels
    T, p = case_size("cpu")
    assert T > 2 * CKernels.L and T % CKernels.L
    triton_tssa = pytest.importorskip("kernels.triton_tssa")
    knobs = ("BLOCK_T", "SCAN_CHUNKS", "FEATURE_BLOCK")
    for values in ([getattr(triton_tssa, k) for k in knobs], (16, 1, 4), (32, 3, 8)):  # as shipped, as tests lower
        for knob, value in zip(knobs, values):
            monkeypatch.setattr(triton_tssa, knob, value)
        T, p = case_size("triton")
        geo = triton_tssa.geometry(T, p)
        assert geo["nC"] > 2 * triton_tssa.SCAN_CHUNKS and T % geo["BT"], (values, geo)  # carries over scan steps
        assert geo["nK"] == 2 and not geo["EVEN_K"], (values, geo)  # dL/dw's column blocks, the second part-filled


@needs_c
def test_the_shipped_maths_passes_with_a_wide_margin():
    diffs = forks.kernel_differences(fused_ops("cpu"), "cpu", *case_size("cpu"))
    assert len(diffs) == 5 + 4 + 3 + 5 and max(diffs.values()) < forks.TOLERANCE / 100
    assert forks.mismatch("cpu", diffs) is None and forks.forms_agree()


# -----------------------------------------------------------------------------
# every fork refused, in MATH.md's words, with advice that runs what model.py says

TORCH = ": use tssa_impl=torch, which runs model.py's maths"
BOTH = ("; and model.py's causal_tssa and causal_tssa_step no longer compute the same maths (decoding would not run "
        "what was trained): edit both alike (MATH.md §9), then use tssa_impl=torch")


def pi_floored(monkeypatch):  # Pi floored at 0.01, in all three operators (they call model.pi_from_logits)
    pi_from_logits = model.pi_from_logits
    monkeypatch.setattr(model, "pi_from_logits", lambda logits, mode: pi_from_logits(logits, mode).clamp_min(0.01))


def pi_temperature(monkeypatch):  # a temperature inside Pi
    pi_from_logits = model.pi_from_logits
    monkeypatch.setattr(model, "pi_from_logits", lambda logits, mode: pi_from_logits(logits / 1.5, mode))


def s_clipped(monkeypatch, names=("tssa", "causal_tssa", "causal_tssa_step")):
    for name in names:
        monkeypatch.setattr(model, name, edited(getattr(model, name), r"\s*s = ", "s = s.clamp(max=100.0)"))


def step_rescaled(monkeypatch, names=("tssa", "causal_tssa", "causal_tssa_step")):
    for name in names:
        monkeypatch.setattr(model, name, scaled(getattr(model, name), 0.9))


FORKS = {  # fork -> what the one line says ({n}: a size, where the fork does not set it by itself)
    "Pi floored at 0.01": (pi_floored, "causal_tssa in Pi (by 0.01 of its largest value), tssa in Pi (by 0.01 of its "
                                       "largest value), causal_tssa's prefill in the running sum of Pi w^2 (by {n} of "
                                       "its largest value), causal_tssa_step in Pi (by {n} of its largest value)"
                                       + TORCH),
    "a temperature inside Pi": (pi_temperature, "causal_tssa in Pi (by {n} of its largest value), tssa in Pi (by {n} "
                                                "of its largest value), causal_tssa's prefill in the running sum of Pi "
                                                "w^2 (by {n} of its largest value), causal_tssa_step in Pi (by {n} of "
                                                "its largest value)" + TORCH),
    "s clipped": (s_clipped, "causal_tssa in the update -Pi w f'(s) (by {n} of its largest value), tssa in the "
                             "update -Pi w f'(s) (by {n} of its largest value), causal_tssa_step in the update -Pi w "
                             "f'(s) (by {n} of its largest value)" + TORCH),
    # 0.9 times the update: 0.1 of the larger, the kernels' own
    "the step rescaled": (step_rescaled, "causal_tssa in the update -Pi w f'(s) (by 0.1 of its largest value), tssa "
                                         "in the update -Pi w f'(s) (by 0.1 of its largest value), causal_tssa_step "
                                         "in the update -Pi w f'(s) (by 0.1 of its largest value)" + TORCH),
    "s clipped in causal_tssa alone": (lambda mp: s_clipped(mp, ["causal_tssa"]),
                                       "causal_tssa in the update -Pi w f'(s) (by {n} of its largest value)" + BOTH),
    "the step rescaled in causal_tssa_step alone": (lambda mp: step_rescaled(mp, ["causal_tssa_step"]),
                                                    "causal_tssa_step in the update -Pi w f'(s) (by 0.1 of its "
                                                    "largest value)" + BOTH),
    "the step rescaled in tssa alone": (lambda mp: step_rescaled(mp, ["tssa"]),
                                        "tssa in the update -Pi w f'(s) (by 0.1 of its largest value)" + TORCH),
}


@needs_c
@pytest.mark.parametrize("impl", ["cpu", "triton"])
@pytest.mark.parametrize("fork", list(FORKS))
def test_a_fork_is_refused_by_every_fused_implementation_in_one_line(monkeypatch, impl, fork):
    make, said = FORKS[fork]
    make(monkeypatch)
    with pytest.raises(ValueError) as e:
        kernels.use(tiny(), impl)
    expected = f"tssa_impl={impl} computes the shipped TSSA, and model.py's operators differ from it: " + said
    pattern = re.escape(expected).replace(re.escape("{n}"), r"(\d[\d.e+-]*)")
    found = re.fullmatch(pattern, str(e.value))
    assert found, str(e.value)
    assert all(float(n) > 10 * forks.TOLERANCE for n in found.groups())  # far past the shipped maths' rounding
    kernels.use(tiny(), "torch")  # what the advice runs: the reference follows the fork


def test_a_quantity_one_side_has_as_0_differs_by_1_not_by_its_ratio_to_a_floor():
    """Each head's difference relative to the larger of the two largest values: a gradient that a
    fork has as exactly 0 (a Pi its temperature does not reach) against the kernels' differs by 1,
    never by ~1e24 of a floor; 0.9 times a quantity by 0.1; opposite signs by 2."""
    small = torch.full((2, 3), 7.6e-6)
    assert forks.per_head(small, torch.zeros(2, 3), (0,)) == 1.0 == forks.per_head(torch.zeros(2, 3), small, (0,))
    assert forks.per_head(torch.ones(2, 3), torch.full((2, 3), 0.9), (0,)) == pytest.approx(0.1, rel=1e-6)
    assert forks.per_head(-torch.ones(1, 3), torch.ones(1, 3), (0,)) == 2.0
    assert forks.per_head(torch.zeros(2, 3), torch.zeros(2, 3), (0,)) == 0.0


@needs_c
def test_the_check_runs_under_no_grad_inference_mode_and_autocast(monkeypatch):
    """As evaluate.py's @torch.no_grad main asks for it: it enables what it needs itself, and
    takes nothing from the run's random numbers (exact resume)."""
    contexts = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
                "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}
    m = tiny()
    for name, context in contexts.items():
        rng = torch.get_rng_state()
        with context():
            kernels.use(m, "cpu")
            assert max(forks.kernel_differences(fused_ops("cpu"), "cpu", *case_size("cpu")).values()) < forks.TOLERANCE / 100, name
        assert torch.equal(torch.get_rng_state(), rng), name
    step_rescaled(monkeypatch, ["tssa"])  # a fork whose gradients are compared there too
    for name, context in contexts.items():
        with context(), pytest.raises(ValueError, match="tssa in the update"):
            kernels.use(m, "triton")


def test_where_no_kernels_can_run_the_check_is_left_to_the_fallback(monkeypatch):
    """Without the C kernels, tssa_impl=triton is checked by the Triton kernels where they run
    (CUDA, or TRITON_INTERPRET=1), and nowhere else: there both fall back to model.py's maths."""
    import kernels.cpu

    def no_c():
        raise KernelUnavailable("no C compiler")
    monkeypatch.setattr(kernels.cpu, "c_library", no_c)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert kernels.shipped_maths_here("cpu") is None and kernels.shipped_maths_here("triton") is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.shipped_maths_here("triton") == ("cpu", "triton")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert kernels.shipped_maths_here("triton") == ("cuda", "triton") and kernels.shipped_maths_here("cpu") is None
