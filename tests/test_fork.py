"""
Forking the maths: a change to TSSA takes effect everywhere it runs, or is refused in one line.

The three forks a researcher makes first, each checked where it runs:
  - a new attention: a class (here a TSSA subclass with its own operators) and one entry in
    model.ATTENTIONS; it trains from `train.py --attn=<name>` (losses not TSSA's), samples from
    its checkpoint, decodes equal to its parallel forward; kernels.use keeps its operators
    under "torch" and a fused implementation refuses it in one line;
  - another f (x / (1 + x), so f' = 1 / (1 + x)^2): the parallel forward, the decoding step and
    the objective all follow model.f / model.f_prime, the step stays a gradient step on R_var,
    and the fused implementations refuse it;
  - the rules between settings live in model.GPTConfig alone, and train.py says them in one line.

    python -m pytest -q tests/test_fork.py
"""

import os

import pytest
import torch

import kernels
import model
import prepare_char
import sample
import train
from model import GPT, GPTConfig
from test_train import call_main  # noqa: E402  (run_cli in this process: exit code, stdout, stderr)

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--max_iters=6",
        "--eval_interval=3", "--eval_iters=2", "--log_interval=1", "--num_threads=1", "--device=cpu",
        "--dtype=float32", "--compile=False", "--warmup_iters=2", "--learning_rate=1e-2"]


def halved(op):
    """An operator whose update is half the reference's (Pi, when returned, unchanged)."""
    def run(*args, **kwargs):
        res = op(*args, **kwargs)
        return (0.5 * res[0], res[1]) if isinstance(res, tuple) else 0.5 * res
    return run


class HalfTSSA(model.TSSA):
    """A forker's attention: TSSA with its own operators (the update halved)."""

    def __init__(self, config, causal=False):
        super().__init__(config, causal)
        self.ops = model.TSSAOps(*(halved(op) for op in model.REFERENCE_OPS))


def shipped_f(monkeypatch):
    """f(x) = log(1 + x), as shipped: these tests hold in a fork that changed model.f too."""
    monkeypatch.setattr(model, "f", torch.log1p)
    monkeypatch.setattr(model, "f_prime", lambda x: 1.0 / (1.0 + x))


@pytest.fixture
def registered(monkeypatch):
    shipped_f(monkeypatch)
    monkeypatch.setitem(model.ATTENTIONS, "half", HalfTSSA)


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=24, vocab_size=31, n_layer=2, n_head=2, n_embd=16, layer_scale_init=1.0)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def decode_equals_parallel(m):
    """Prefill 5 tokens, then 15 steps: the logits of the full parallel forward (float32:
    the recurrent and parallel forms sum in other orders, 1e-5 on O(1) logits)."""
    idx = torch.randint(0, 31, (2, 20))
    with torch.no_grad():
        full, _ = m(idx)
        state = m.init_state(2)
        got = [m.prefill(idx[:, :5], state)] + [m.step(idx[:, t:t + 1], state) for t in range(5, 20)]
    torch.testing.assert_close(torch.stack(got, 1), full[:, 4:], rtol=0, atol=1e-5)
    return full


# -----------------------------------------------------------------------------
# a new attention


def test_a_registered_attention_builds_decodes_and_keeps_its_operators(registered):
    m = tiny(attn="half", short_conv=3)  # a TSSA subclass: the short convolution accepts it
    assert all(isinstance(b.attn, HalfTSSA) for b in m.blocks)
    ref = tiny(attn="tssa", short_conv=3)
    full = decode_equals_parallel(m)
    with torch.no_grad():
        assert (full - ref(torch.randint(0, 31, (2, 20)))[0]).abs().max() > 1e-3  # not TSSA's maths
    own = m.blocks[0].attn.ops
    kernels.use(m, "torch")  # the reference put back only where it is the package's
    assert m.blocks[0].attn.ops is own


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_a_fused_implementation_refuses_a_forkers_operators_in_one_line(registered, impl):
    with pytest.raises(ValueError) as e:
        kernels.use(tiny(attn="half"), impl)
    assert str(e.value) == (f"tssa_impl={impl} runs the shipped TSSA only; blocks.0.attn (HalfTSSA) has its "
                            "own operators: use tssa_impl=torch")


def test_a_registered_attention_trains_and_samples_through_the_scripts(registered, tmp_path, capsys):
    text = tmp_path / "book.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    data = str(tmp_path / "data")
    assert call_main(prepare_char, f"--input={text}", "--name=book", f"--data_dir={data}", capsys=capsys)[0] == 0
    losses, book = {}, ["--dataset=book", f"--data_dir={data}", *TINY]
    for attn in ("tssa", "half"):
        out = str(tmp_path / attn)
        code, stdout, err = call_main(train, *book, f"--out_dir={out}", f"--attn={attn}", capsys=capsys)
        assert code == 0, err
        losses[attn] = [line for line in stdout.splitlines() if line.startswith("iter ")]
        ckpt = torch.load(os.path.join(out, "ckpt.pt"), weights_only=False)
        assert ckpt["model_args"]["attn"] == attn
    assert losses["half"] and losses["half"] != losses["tssa"]  # not TSSA's losses under another name
    code, stdout, err = call_main(sample, f"--out_dir={tmp_path / 'half'}", "--max_new_tokens=8", "--num_samples=1",
                                  capsys=capsys)
    assert code == 0 and "half" in stdout, err
    code, _, err = call_main(train, *book, f"--out_dir={tmp_path / 'c'}", "--attn=half", "--tssa_impl=cpu",
                             capsys=capsys)
    assert code == 1 and "has its own operators: use tssa_impl=torch" in err and len(err.strip().splitlines()) == 1


# -----------------------------------------------------------------------------
# another f


def saturating_f(monkeypatch):
    """f(x) = x / (1 + x), f'(x) = 1 / (1 + x)^2, put in model.py's place."""
    monkeypatch.setattr(model, "f", lambda x: x / (1.0 + x))
    monkeypatch.setattr(model, "f_prime", lambda x: 1.0 / (1.0 + x) ** 2)


@pytest.mark.parametrize("kind", [dict(attn="tssa"), dict(attn="tssa", short_conv=3), dict(hybrid_every=2)])
def test_another_f_changes_the_parallel_forward_and_the_decoding_step_alike(monkeypatch, kind):
    shipped_f(monkeypatch)
    before = decode_equals_parallel(tiny(**kind))
    saturating_f(monkeypatch)
    after = decode_equals_parallel(tiny(**kind))  # the step follows f' to 1e-5, as the parallel form
    # and f' did change the forward: by more than 10x the 1e-5 within which decoding agrees
    # (at init the attention's share of the logits is small: c_proj starts at std 0.02 / sqrt(2L))
    assert (after - before).abs().max() > 1e-4


@pytest.mark.parametrize("causal", [False, True])
def test_another_f_is_still_one_gradient_step_on_its_objective(monkeypatch, causal):
    """The operator equals -n * dR_var/dw with Pi held fixed (MATH.md §2.2) for f as defined:
    float64 autograd of compression_objective against the operator, to 1e-6 relative: the
    operator adds STAT_EPS to n_k where the objective floors n_k at it (1e-8 / n_k in s), the
    rest is rounding. Causal: the last token of each prefix (its own objective)."""
    saturating_f(monkeypatch)
    torch.manual_seed(0)
    B, H, T, p = 2, 3, 7, 4
    w = torch.randn(B, H, T, p, dtype=torch.float64)
    temp, bias = torch.rand(H, dtype=torch.float64) + 0.5, torch.zeros(H, T, dtype=torch.float64)
    out, pi = model.causal_tssa(w, temp, bias, return_pi=True) if causal else model.tssa(w, temp, return_pi=True)
    ends = range(1, T + 1) if causal else [T]
    for j in ends:
        wj = w[:, :, :j].clone().requires_grad_()
        grad, = torch.autograd.grad(model.compression_objective(wj, pi[:, :, :j]).sum(), wj)
        # dR/dw_t = (1/n) Pi_t w_t f'(s): the update -Pi w f'(s) is -n times it
        torch.testing.assert_close(out[:, :, j - 1], -j * grad[:, :, j - 1], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_the_fused_implementations_refuse_another_f(monkeypatch, impl):
    saturating_f(monkeypatch)
    with pytest.raises(ValueError, match=rf"^tssa_impl={impl} computes f'\(s\) = 1 / \(1 \+ s\) .*use tssa_impl=torch"):
        kernels.use(tiny(), impl)
    kernels.use(tiny(), "torch")  # the reference follows it: nothing to refuse
    shipped_f(monkeypatch)
    kernels.use(tiny(), impl)  # the shipped f: nothing to refuse (the kernels may still fall back)


def test_the_c_kernels_refuse_model_pys_operators_edited(monkeypatch):
    """A fork that edits causal_tssa itself (here: its update halved) while f stays: the C
    kernels, which compute the shipped maths, are refused in one line; the reference runs it."""
    shipped_f(monkeypatch)
    kernels.use(tiny(), "cpu")  # the shipped maths: nothing to refuse
    monkeypatch.setattr(model, "causal_tssa", halved(model.causal_tssa))
    with pytest.raises(ValueError, match=r"^tssa_impl=cpu computes the shipped TSSA, and model.py's operators "
                                         r"differ from it: causal_tssa in the update -Pi w f'\(s\) \(by [\d.]+ of its "
                                         r"largest value\); .* then use tssa_impl=torch$"):
        kernels.use(tiny(), "cpu")


# -----------------------------------------------------------------------------
# rules between settings: one place


@pytest.mark.parametrize("argv,words", [
    (["--attn=softmax", "--short_conv=4"], "short_conv convolves the TSSA input: it needs a TSSA attention"),
    (["--n_head=3"], "n_embd (32) must be divisible by n_head (3)"),
    (["--attn=nope"], "attn must be one of"),
])
def test_train_says_the_models_rules_in_one_line(argv, words, tmp_path, capsys):
    code, _, err = call_main(train, f"--out_dir={tmp_path / 'o'}", *TINY, *argv, capsys=capsys)
    assert code == 1 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before any work
