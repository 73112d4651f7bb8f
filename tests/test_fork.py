"""
Forking the maths: a change to TSSA takes effect everywhere it runs, or is refused in one line.

The forks a researcher makes, each made from MATH.md §9 alone and checked where it runs
(train.py, GPT.prefill and GPT.step, sample.py):
  - a new attention, built by §9's four steps: a TSSA whose running sums decay by 0.95 a token
    (its own causal operator, which also fills the decoding state, and its own step), a
    subclass that sets them, one entry in model.ATTENTIONS; it decodes as it trains after
    prompts of 1, 16 and block_size tokens, trains and samples through the scripts, and a fused
    implementation refuses it in one line; its checkpoint, where the attention is not
    registered, is one line too;
  - another Pi (a temperature inside pi_from_logits): every form follows it, tssa_impl=cpu refuses it;
  - another f (x / (1 + x), so f' = 1 / (1 + x)^2): the parallel forward, the decoding step and
    the objective all follow model.f / model.f_prime, the step stays a gradient step on R_var,
    and the fused implementations refuse it; f edited alone (f_prime left) is refused in one
    line by every script that builds a model;
  - a new Pi by §9's recipe (a function, one entry in model.PI_MODES): the trainers offer it,
    it trains, samples and decodes as it trains; tssa_impl=cpu and triton refuse it in one line,
    auto runs it by model.py with one warning;
  - states of one's own (a tuple, a dict): they train, start over for a new prompt and sample
    through the scripts; a state GPT.prefill cannot start over (not tensors in a dataclass,
    tuple, list or dict; not zeros at first; a Python number it changes; tensors replaced, not
    written in place) is told at the start in one line that names init_state or the state;
  - a TSSA subclass with its own forward: the start check names that forward; lm_inspect.py
    draws a subclass's checkpoint, and says in one line where a block's s is not model.py's;
  - the causal statistics changed in causal_tssa only (the step left as shipped): train.py and
    sample.py say at the start, in one line, that the step differs and what to edit; train.py
    trains, sample.py samples by the parallel form;
  - an operator replaced from a script (model.causal_tssa = ...) changes GPT.forward;
  - an attention written for training alone (it cannot decode): told at the start, sampled by
    its parallel form;
  - the rules between settings live in model.GPTConfig alone, and train.py says them in one line.
And the checkpoints of other versions and forks (an attention, a Pi, a tokenizer, a model
argument this version does not know) are one line from sample.py, evaluate.py, lm_inspect.py.

    python -m pytest -q tests/test_fork.py
"""

import os
import re
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

import evaluate
import kernels
import lm_inspect
import model
import prepare_char
import sample
import train
from model import GPT, GPTConfig
from nanotost import checkpoints, forks, loading
from nanotost import textdata as td
from test_train import call_main  # noqa: E402  (run_cli in this process: exit code, stdout, stderr)

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--max_iters=6",
        "--eval_interval=3", "--eval_iters=2", "--log_interval=1", "--num_threads=1", "--device=cpu",
        "--dtype=float32", "--compile=False", "--warmup_iters=2", "--learning_rate=1e-2"]
PROMPT = "line 17: the qui"  # 16 characters of the book below


# -----------------------------------------------------------------------------
# a new attention, as MATH.md §9 builds one: a TSSA whose running sums decay by DECAY a token
DECAY = 0.95


def decayed_prefix_sum(x):
    """sum_{u <= t} DECAY^(t - u) x_u over the tokens (dim 2) of x (B, H, T, p)."""
    t = torch.arange(x.shape[2], device=x.device)
    weights = (DECAY ** (t[:, None] - t[None, :]).clamp_min(0).to(x.dtype)).tril()  # (T, T)
    return torch.einsum("tu,bhup->bhtp", weights, x)


def decayed_causal_tssa(w, gamma, pos_bias, return_pi=False, pi_mode="softmax", state=None):
    """model.causal_tssa, copied, with decayed prefix sums; given a state (the prefill), the sums
    at the last token go into it, as decayed_causal_tssa_step keeps them (§9, step 1)."""
    model.check_shapes(w, gamma)
    B, H, T, p = w.shape
    bias = model.check_pos_bias(pos_bias, H, T, w.dtype)[:, :T]  # (H, T)
    w_stat = w.to(model.stat_dtype(w.dtype))
    w_sq = w_stat.square()  # (B, H, T, p)
    sum_sq = decayed_prefix_sum(w_sq)
    w_sq_normed = w_sq / sum_sq.clamp_min(model.PI_NORM_EPS)
    logits = gamma.reshape(1, -1, 1).to(w_sq.dtype) * (w_sq_normed + bias[None, :, :, None]).sum(dim=-1)  # (B, H, T)
    pi = model.pi_from_logits(logits, pi_mode)
    sum_pi_sq, sum_pi = decayed_prefix_sum(pi.unsqueeze(-1) * w_sq), decayed_prefix_sum(pi.unsqueeze(-1))
    s = sum_pi_sq / (sum_pi + model.STAT_EPS)
    out = (-pi.unsqueeze(-1) * w_stat * model.f_prime(s)).to(w.dtype)
    if state is not None:
        state.sum_sq.copy_(sum_sq[:, :, -1])
        state.sum_pi_sq.copy_(sum_pi_sq[:, :, -1])
        state.sum_pi.copy_(sum_pi[:, :, -1, 0])
    return (out, pi.detach()) if return_pi else out


def decayed_causal_tssa_step(w_t, gamma, pos_bias_t, state, pi_mode="softmax"):
    """model.causal_tssa_step after each running sum is multiplied by DECAY."""
    for running in (state.sum_sq, state.sum_pi_sq, state.sum_pi):
        running.mul_(DECAY)
    return model.causal_tssa_step(w_t, gamma, pos_bias_t, state, pi_mode)


class DecayedTSSA(model.TSSA):
    """§9, step 2: a TSSA subclass with its own operators (the non-causal form kept)."""

    def __init__(self, config, causal=False):
        super().__init__(config, causal)
        self.operators = model.TSSAOperators(model.tssa, decayed_causal_tssa, decayed_causal_tssa_step)


def shipped_f(monkeypatch):
    """f(x) = log(1 + x), as shipped: these tests hold in a fork that changed model.f too."""
    monkeypatch.setattr(model, "f", torch.log1p)
    monkeypatch.setattr(model, "f_prime", lambda x: 1.0 / (1.0 + x))


@pytest.fixture
def registered(monkeypatch):
    shipped_f(monkeypatch)
    monkeypatch.setitem(model.ATTENTIONS, "decayed", DecayedTSSA)  # §9, step 3


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=32, vocab_size=31, n_layer=2, n_head=2, n_embd=16, layer_scale_init=1.0)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def to_edit(m):
    """What a failing comparison of the forms says to edit: the first attention's forms (§9)."""
    step, parallel, prefill = forks.decoding_forms(m.blocks[0].attn)
    return f"decoding differs from GPT.forward: edit {step} and {parallel} together; the prefill is {prefill}"


def decode_equals_parallel(m, prompt):
    """A prompt of `prompt` tokens, then one step per token to block_size: the logits of the full
    parallel forward (float32: the two forms sum in other orders, 1e-5 on O(1) logits). A prompt
    of block_size tokens: the state it leaves equals the state of a 1-token prompt and steps."""
    T = m.config.block_size
    idx = torch.randint(0, 31, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = m(idx)
        state, stepped = m.init_state(2), m.init_state(2)
        got = [m.prefill(idx[:, :prompt], state)] + [m.step(idx[:, t:t + 1], state) for t in range(prompt, T)]
        torch.testing.assert_close(torch.stack(got, 1), full[:, prompt - 1:], rtol=0, atol=1e-5,
                                   msg=lambda text: f"{text}\n{to_edit(m)}")
        m.prefill(idx[:, :1], stepped)
        for t in range(1, T):
            m.step(idx[:, t:t + 1], stepped)
    for a, b in zip(state.layers, stepped.layers):
        for name in ("sum_sq", "sum_pi_sq", "sum_pi") if isinstance(a, model.TSSAState) else ():
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6,
                                       msg=lambda text: f"{text}\n{to_edit(m)} ({name} after {prompt} tokens)")
    return full


def test_math_section_9_decayed_attention_decodes_as_it_trains_after_prompts_of_1_16_and_block_size(registered):
    m = tiny(attn="decayed")
    assert all(isinstance(b.attn, DecayedTSSA) for b in m.blocks)
    for prompt in (1, 16, m.config.block_size):
        full = decode_equals_parallel(m, prompt)
    with torch.no_grad():  # its own maths: not TSSA's logits (by far more than the 1e-5 decoding agrees to)
        assert (full - tiny(attn="tssa")(torch.randint(0, 31, (2, 32), generator=torch.Generator().manual_seed(1)))[0]
                ).abs().max() > 1e-3
    assert forks.decoding_differs(m) is None and forks.decoding_differs(tiny(attn="decayed", short_conv=3)) is None
    own = m.blocks[0].attn.operators
    kernels.use(m, "torch")  # the reference put back only where it is the package's
    assert m.blocks[0].attn.operators is own


def without_prefill(w, gamma, pos_bias, return_pi=False, pi_mode="softmax", state=None):
    """decayed_causal_tssa that leaves the decoding state as it was (issue 38's fork, before §9 said)."""
    return decayed_causal_tssa(w, gamma, pos_bias, return_pi, pi_mode)


class ForgotPrefill(DecayedTSSA):
    def __init__(self, config, causal=False):
        super().__init__(config, causal)
        self.operators = self.operators._replace(causal_tssa=without_prefill)


def test_a_decayed_attention_without_its_prefill_is_named_by_the_check(registered, monkeypatch):
    """Sums decayed in the parallel form and in the step, but the state a prompt leaves not
    written: the check names the prefill and the function to edit."""
    monkeypatch.setitem(model.ATTENTIONS, "forgot", ForgotPrefill)
    line = forks.decoding_differs(tiny(attn="forgot"))
    assert line.startswith("blocks.0.attn (ForgotPrefill): the state its prefill leaves differs from the sums its "
                           "step keeps") and "without_prefill given state= must write the running sums" in line, line
    assert "as decayed_causal_tssa_step keeps them" in line, line


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_a_fused_implementation_refuses_a_forkers_operators_in_one_line(registered, impl):
    with pytest.raises(ValueError) as e:
        kernels.use(tiny(attn="decayed"), impl)
    assert str(e.value) == (f"tssa_impl={impl} runs the shipped TSSA only; blocks.0.attn (DecayedTSSA) has its "
                            "own operators: use tssa_impl=torch")


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """A prepared character dataset: --dataset and --data_dir for train.py."""
    folder = tmp_path_factory.mktemp("book")
    text = folder / "book.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    code = prepare_char.main([f"--input={text}", "--name=book", f"--data_dir={folder / 'data'}"])
    assert code in (None, 0)
    return ["--dataset=book", f"--data_dir={folder / 'data'}", *TINY]


def spying(function, name, calls):
    """function, which also appends (name, tokens, whether a decoding state came) to calls."""
    def spy(w, *args, **kwargs):
        state = kwargs.get("state", args[2] if name.endswith("step") else None)
        calls.append((name, w.shape[2] if w.dim() == 4 else 1, state is not None))
        return function(w, *args, **kwargs)
    return spy


def greedy_by_parallel_form(out_dir, n, prompt=PROMPT):
    """What n greedy tokens after the prompt are by the parallel form (a full forward per token) of
    the checkpoint in out_dir, as the maths running now computes them."""
    gpt, ckpt = loading.load_language_model(out_dir, "cpu")
    encode, decode = td.load_tokenizer(ckpt["tokenizer"])
    idx = torch.tensor([encode(prompt)])
    out = forks.generate_in_parallel(gpt, idx, n, temperature=0, tokenizer_vocab_size=ckpt["tokenizer"]["vocab_size"])
    return decode(out[0].tolist())


def test_a_registered_attention_trains_and_samples_its_own_maths_through_the_scripts(registered, book, tmp_path,
                                                                                      capsys, monkeypatch):
    losses = {}
    for attn in ("tssa", "decayed"):
        out = str(tmp_path / attn)
        code, stdout, err = call_main(train, *book, f"--out_dir={out}", f"--attn={attn}", capsys=capsys)
        assert code == 0 and "warning" not in err, err  # its decoding agrees: nothing to say
        losses[attn] = [line for line in stdout.splitlines() if line.startswith("iter ")]
        assert checkpoints.load_checkpoint(out, "language")["model_args"]["attn"] == attn
    assert losses["decayed"] and losses["decayed"] != losses["tssa"]  # not TSSA's losses under another name
    # sample.py after a 16-token prompt: the fork's prefill, then its step per token (which decode as
    # its parallel form computes: test_math_section_9_...)
    calls = []
    for name in ("decayed_causal_tssa", "decayed_causal_tssa_step"):
        monkeypatch.setattr(sys.modules[__name__], name, spying(globals()[name], name, calls))
    code, stdout, err = call_main(sample, f"--out_dir={tmp_path / 'decayed'}", f"--start={PROMPT}",
                                  "--max_new_tokens=12", "--num_samples=1", "--temperature=0", capsys=capsys)
    assert code == 0 and "warning" not in err, err
    assert len(PROMPT) == 16 and ("decayed_causal_tssa", 16, True) in calls  # the prefill, given the state
    assert calls.count(("decayed_causal_tssa_step", 1, True)) >= 2 * 11  # 2 layers x the 11 steps after it
    assert greedy_by_parallel_form(str(tmp_path / "decayed"), 12) in stdout
    code, _, err = call_main(train, *book, f"--out_dir={tmp_path / 'c'}", "--attn=decayed", "--tssa_impl=cpu",
                             capsys=capsys)
    assert code == 1 and "has its own operators: use tssa_impl=torch" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()  # refused before any work
    # the same checkpoint where the attention is not registered (it was, in a script that trained it)
    monkeypatch.delitem(model.ATTENTIONS, "decayed")
    code, _, err = call_main(sample, f"--out_dir={tmp_path / 'decayed'}", capsys=capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "names attn='decayed', an attention this version does not know" in err
    assert "register its class in model.ATTENTIONS (MATH.md §9)" in err
    # lm_inspect.py draws the subclass (its Pi, its R_var), and says that the page's s is not its own
    monkeypatch.setitem(model.ATTENTIONS, "decayed", DecayedTSSA)
    out = tmp_path / "decayed"
    code, stdout, err = call_main(lm_inspect, f"--out_dir={out}", "--n_windows=2", "--batch_size=2", capsys=capsys)
    assert code == 0 and (out / "inspect" / "index.html").exists(), err
    assert len(err.strip().splitlines()) == 1 and (": warning: blocks.0.attn (DecayedTSSA): its output is not c_proj "
                                                   "of -Pi w f'(s) for model.py's statistic s") in err, err


# -----------------------------------------------------------------------------
# the causal statistics changed in causal_tssa only (the step left as shipped)


def test_a_fork_of_causal_tssa_alone_is_told_at_the_start_and_sampled_by_its_parallel_form(book, tmp_path, capsys,
                                                                                           monkeypatch):
    shipped_f(monkeypatch)
    monkeypatch.setattr(model, "causal_tssa", decayed_causal_tssa)  # as a forker's script does
    out = str(tmp_path / "fork")
    code, stdout, err = call_main(train, *book, f"--out_dir={out}", capsys=capsys)
    assert code == 0 and "iter 5:" in stdout, err  # told, and trained
    assert len(err.strip().splitlines()) == 1 and "training goes on (it runs the parallel form)" in err, err
    assert ("warning: decoding differs from the parallel form: blocks.0.attn (TSSA): its decoding step differs from "
            "its parallel form") in err and "edit model.causal_tssa_step and model.causal_tssa together" in err
    def no_step(*args):
        raise AssertionError("sample.py decoded with GPT.step: the shipped step, not the fork's maths")
    monkeypatch.setattr(GPT, "step", no_step)
    code, stdout, err = call_main(sample, f"--out_dir={out}", f"--start={PROMPT}", "--max_new_tokens=12",
                                  "--num_samples=1", "--temperature=0", capsys=capsys)
    assert code == 0 and len(err.strip().splitlines()) == 1, err
    assert "its decoding step differs" in err and "sampling by the parallel form instead" in err
    assert greedy_by_parallel_form(out, 12) in stdout  # the fork's own maths, by its parallel form


SHIPPED_STEP = model.causal_tssa_step


def decayed_shipped_step(w_t, gamma, pos_bias_t, state, pi_mode="softmax"):
    """decayed_causal_tssa_step on the shipped step, to put in model.causal_tssa_step's place."""
    for running in (state.sum_sq, state.sum_pi_sq, state.sum_pi):
        running.mul_(DECAY)
    return SHIPPED_STEP(w_t, gamma, pos_bias_t, state, pi_mode)


def test_an_operator_replaced_from_a_script_changes_every_form(monkeypatch):
    """model.causal_tssa (or the step) replaced after import: GPT.forward and decoding follow it,
    as they follow an edit of model.py (MATH.md §9)."""
    shipped_f(monkeypatch)
    m = tiny()
    idx = torch.randint(0, 31, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = m(idx)[0]
        monkeypatch.setattr(model, "causal_tssa", decayed_causal_tssa)
        after = m(idx)[0]
    monkeypatch.setattr(model, "causal_tssa_step", decayed_shipped_step)
    assert (after - before).abs().max() > 1e-3  # (100x the 1e-5 within which decoding agrees)
    decode_equals_parallel(m, 5)  # the replaced step is the decayed one: decoding agrees with the new forward


class ParallelOnly(model.LinearAttention):
    """A forker's attention written for training alone: it cannot decode."""

    def init_state(self, B, pos):
        raise NotImplementedError("no decoding state yet")


def test_an_attention_that_cannot_decode_is_told_at_the_start_and_sampled_by_its_parallel_form(monkeypatch, tmp_path,
                                                                                              capsys):
    monkeypatch.setitem(model.ATTENTIONS, "parallel_only", ParallelOnly)
    write_checkpoint(tmp_path, lambda ckpt: None, attn="parallel_only")
    code, stdout, err = call_main(sample, f"--out_dir={tmp_path}", "--start=ab", "--max_new_tokens=6",
                                  "--num_samples=1", capsys=capsys)
    assert code == 0 and len(err.strip().splitlines()) == 1, err
    text = stdout.split("-" * 60 + "\n")[1]
    assert text.startswith("ab") and len(text) == 2 + 6 + 1, text  # the prompt, 6 new characters, print's newline
    assert ("blocks.0.attn (ParallelOnly): its step raised NotImplementedError (no decoding state yet): edit "
            "ParallelOnly.forward of one token from a state (MATH.md §9); sampling by the parallel form instead") in err


# -----------------------------------------------------------------------------
# another Pi


def tempered_pi(logits, pi_mode):
    """pi_from_logits with a temperature of 2 inside (the uniform ablation unchanged)."""
    if pi_mode == "uniform":
        return torch.full_like(logits, 1.0 / logits.shape[1])
    return (logits / 2.0).softmax(dim=1)


def test_another_pi_runs_in_every_form_and_the_c_kernels_refuse_it(monkeypatch, book, tmp_path, capsys):
    shipped_f(monkeypatch)
    before = decode_equals_parallel(tiny(), 16)
    monkeypatch.setattr(model, "pi_from_logits", tempered_pi)
    after = decode_equals_parallel(tiny(), 16)  # the step follows it as the parallel form does
    assert (after - before).abs().max() > 1e-4
    code, _, err = call_main(train, *book, f"--out_dir={tmp_path / 'c'}", "--tssa_impl=cpu", capsys=capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "use tssa_impl=torch" in err, err
    assert not (tmp_path / "c").exists()  # refused before any work


# -----------------------------------------------------------------------------
# another f


def saturating_f(monkeypatch):
    """f(x) = x / (1 + x), f'(x) = 1 / (1 + x)^2, put in model.py's place."""
    monkeypatch.setattr(model, "f", lambda x: x / (1.0 + x))
    monkeypatch.setattr(model, "f_prime", lambda x: 1.0 / (1.0 + x) ** 2)


@pytest.mark.parametrize("kind", [dict(attn="tssa"), dict(attn="tssa", short_conv=3), dict(hybrid_every=2)])
def test_another_f_changes_the_parallel_forward_and_the_decoding_step_alike(monkeypatch, kind):
    shipped_f(monkeypatch)
    before = decode_equals_parallel(tiny(**kind), 5)
    saturating_f(monkeypatch)
    after = decode_equals_parallel(tiny(**kind), 5)  # the step follows f' to 1e-5, as the parallel form
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
    gamma, bias = torch.rand(H, dtype=torch.float64) + 0.5, torch.zeros(H, T, dtype=torch.float64)
    out, pi = model.causal_tssa(w, gamma, bias, return_pi=True) if causal else model.tssa(w, gamma, return_pi=True)
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
    """A fork that edits causal_tssa itself (here: its sums decayed) while f stays: the C kernels,
    which compute the shipped maths, are refused in one line; the reference runs it."""
    shipped_f(monkeypatch)
    kernels.use(tiny(), "cpu")  # the shipped maths: nothing to refuse
    monkeypatch.setattr(model, "causal_tssa", decayed_causal_tssa)
    with pytest.raises(ValueError, match=r"^tssa_impl=cpu computes the shipped TSSA, and model.py's operators "
                                         r"differ from it: causal_tssa in Pi \(by [\d.]+ of its largest value\), .*; "
                                         r"and model.py's causal_tssa and causal_tssa_step no longer compute the same "
                                         r"maths .* then use tssa_impl=torch$"):
        kernels.use(tiny(), "cpu")


# -----------------------------------------------------------------------------
# checkpoints of other versions and forks: one line naming the field, never a traceback or a guess


def write_checkpoint(folder, change, **model_args):
    """A train.py-like checkpoint of a tiny char model, with `change` applied to it (a dict)."""
    args = dict(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16, **model_args)
    gpt = GPT(GPTConfig(**args))
    ckpt = dict(kind="language", model=gpt.state_dict(), model_args=args, iter_num=3, config={"dataset": "book"},
                tokenizer=dict(tokenizer="char", chars="abc \n", vocab_size=5, dataset="book"))
    change(ckpt)
    checkpoints.save_checkpoint(ckpt, os.path.join(folder, "ckpt.pt"))
    return gpt


CHANGES = {  # field -> (the change, what the one line says: the registries as they are when it runs)
    "attn": (lambda c: c["model_args"].update(attn="not_an_attention"),
             lambda: f"names attn='not_an_attention', an attention this version does not know "
                     f"({', '.join(model.ATTENTIONS)}): "
                     "register its class in model.ATTENTIONS (MATH.md §9), or use the version of nanoToST that "
                     "wrote it"),
    "pi": (lambda c: c["model_args"].update(pi="not_a_pi"),
           lambda: f"names pi='not_a_pi', a Pi this version does not know ({', '.join(model.PI_MODES)}): add its "
                   "function to model.PI_MODES (MATH.md §9), or use the version of nanoToST that wrote it"),
    "tokenizer": (lambda c: c["tokenizer"].update(tokenizer="llama"),
                  "names tokenizer 'llama', which this version does not know (it reads char, gpt2"),
    "model argument": (lambda c: c["model_args"].update(not_a_field=10000.0),
                       "(model_args not_a_field are not GPTConfig fields)"),
    "model argument's value": (lambda c: c["model_args"].update(short_conv=-1),
                               "holds model_args this version refuses (short_conv must not be negative, got -1)"),
}


@pytest.mark.parametrize("script", [sample, evaluate, lm_inspect], ids=lambda s: s.__name__)
@pytest.mark.parametrize("field", CHANGES)
def test_a_checkpoint_naming_what_this_version_does_not_know_is_one_line(script, field, tmp_path, capsys):
    write_checkpoint(tmp_path, CHANGES[field][0])
    code, _, err = call_main(script, f"--out_dir={tmp_path}", capsys=capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    said = CHANGES[field][1]
    assert (said() if callable(said) else said) in err, err


OLD_NAMES = (("w_proj.", "c_in."), ("attn_scale.weight", "ls_1.gamma"), ("mlp_scale.weight", "ls_2.gamma"),
             ("attn.gamma", "attn.temp"))  # (now, before issue 38 / issue 46)


def test_a_checkpoint_of_the_names_before_issues_38_and_46_loads_with_the_same_weights(tmp_path):
    """Parameters renamed (TSSA.c_in -> w_proj, Block.ls_1/ls_2.gamma -> attn_scale/mlp_scale.weight,
    TSSA.temp -> gamma, MATH.md's symbol): a checkpoint that holds the old names loads, each tensor
    where it belongs (trainkit.RENAMED)."""
    def old(key):
        for now, before in OLD_NAMES:
            key = key.replace(now, before)
        return key
    gpt = write_checkpoint(tmp_path, lambda c: c.update(model={old(key): value for key, value in c["model"].items()}))
    stored = checkpoints.load_checkpoint(str(tmp_path / "ckpt.pt"), "language")["model"]
    assert "blocks.0.ls_1.gamma" in stored and "blocks.0.attn.temp" in stored and "blocks.0.attn.gamma" not in stored
    loaded, _ = loading.load_language_model(str(tmp_path), "cpu")
    for key, value in gpt.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


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


# -----------------------------------------------------------------------------
# f edited alone: the first thing a reader of §1 tries


def lazy_f(monkeypatch):
    """f(x) = x / (1 + x) put in model.py's place, f_prime left as shipped (1 / (1 + x))."""
    shipped_f(monkeypatch)
    monkeypatch.setattr(model, "f", lambda x: x / (1.0 + x))


LAZY_F = (r"model\.f_prime is not the derivative of model\.f \(at x = .*\): change f and f_prime together "
          r"\(MATH\.md §9\)")


def test_f_edited_without_f_prime_builds_no_model():
    """Every model with a TSSA (language, vision, LRA) refuses to be built, in one line that
    names MATH.md §9; with f and f_prime both changed (or both shipped) it builds."""
    from lra.encoder import LRAClassifier, LRAConfig
    builds = [lambda: tiny(), lambda: tiny(hybrid_every=2),
              lambda: model.ToSTViT(model.ViTConfig(n_layer=1, n_embd=16)),
              lambda: LRAClassifier(LRAConfig(vocab_size=5, num_classes=2, max_len=8, n_layer=1, n_embd=16, n_head=2))]
    with pytest.MonkeyPatch.context() as patch:
        lazy_f(patch)
        for build in builds:
            with pytest.raises(ValueError, match="^" + LAZY_F + "$"):
                build()
        saturating_f(patch)  # f' changed with it: the model builds
        for build in builds:
            build()
    tiny(attn="softmax")  # (no TSSA, nothing to check)


@pytest.mark.parametrize("script", [train, sample, evaluate, lm_inspect], ids=lambda s: s.__name__)
def test_f_edited_without_f_prime_is_one_line_from_every_script(script, book, tmp_path, capsys, monkeypatch):
    """train.py before any work (no out_dir), and the scripts that load a checkpoint (written before
    the edit): one line, not the old operator run with the new objective."""
    if script is not train:
        write_checkpoint(tmp_path, lambda ckpt: None)
    lazy_f(monkeypatch)
    argv = [*book, f"--out_dir={tmp_path / 'out'}"] if script is train else [f"--out_dir={tmp_path}"]
    code, _, err = call_main(script, *argv, capsys=capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert re.search(LAZY_F, err), err
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# a new Pi, by §9's recipe: a function of the logits and one entry in model.PI_MODES


def half_temperature_pi(logits):
    """Pi from its logits at half their scale: a softmax over the heads (dim 1) of logits / 2."""
    return (logits / 2.0).softmax(dim=1)


@pytest.fixture
def new_pi(monkeypatch):
    shipped_f(monkeypatch)
    monkeypatch.setitem(model.PI_MODES, "half", half_temperature_pi)


def test_math_section_9_a_new_pi_decodes_as_it_trains_and_changes_the_model(new_pi):
    torch.manual_seed(0)
    m = tiny(pi="half")
    assert all(b.attn.pi_mode == "half" for b in m.blocks)
    for prompt in (1, 16, m.config.block_size):
        full = decode_equals_parallel(m, prompt)
    assert (full - decode_equals_parallel(tiny(), 1)).abs().max() > 1e-4  # its own Pi, not the softmax's
    assert forks.decoding_differs(m) is None


def test_a_new_pi_trains_and_samples_through_the_scripts_and_the_fused_kernels_say_so(new_pi, book, tmp_path,
                                                                                      capsys, monkeypatch):
    out = tmp_path / "half"
    code, stdout, err = call_main(train, *book, f"--out_dir={out}", "--pi=half", capsys=capsys)
    assert code == 0 and "warning" not in err and "iter 5:" in stdout, err  # the trainer offers it
    assert checkpoints.load_checkpoint(str(out), "language")["model_args"]["pi"] == "half"
    code, stdout, err = call_main(sample, f"--out_dir={out}", f"--start={PROMPT}", "--max_new_tokens=12",
                                  "--num_samples=1", "--temperature=0", capsys=capsys)
    assert code == 0 and "warning" not in err, err  # it decodes as it trains: by its state
    assert greedy_by_parallel_form(str(out), 12) in stdout
    for impl in ("cpu", "triton"):  # the kernels compute a softmax Pi: one line, before any work
        code, _, err = call_main(train, *book, f"--out_dir={tmp_path / impl}", "--pi=half", f"--tssa_impl={impl}",
                                 capsys=capsys)
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert (f"tssa_impl={impl} computes Pi by a softmax over the heads, and blocks.0.attn (TSSA) takes pi='half': "
                "use tssa_impl=torch, which runs model.PI_MODES['half']") in err
        assert not (tmp_path / impl).exists()
    code, _, err = call_main(sample, f"--out_dir={out}", "--tssa_impl=cpu", "--max_new_tokens=2", capsys=capsys)
    assert code == 1 and "computes Pi by a softmax over the heads" in err and len(err.strip().splitlines()) == 1
    with pytest.warns(RuntimeWarning) as said:  # auto: model.py's maths, said once
        code, stdout, err = call_main(train, *book, f"--out_dir={tmp_path / 'auto'}", "--pi=half",
                                      "--tssa_impl=auto", capsys=capsys)
    assert code == 0 and "iter 5:" in stdout, err
    lines = [str(w.message) for w in said if "tssa_impl='auto'" in str(w.message)]
    assert lines == ["tssa_impl='auto': pi='half' is model.py's alone (the Triton kernels compute a softmax Pi); "
                     "running model.py's reference maths"], lines


def test_a_warning_of_the_kernels_is_one_line_attributed_to_the_line_that_ran_the_model(new_pi):
    """Shown as Python shows it (formatwarning, no filter): the file and line of the caller outside
    torch, model.py and kernels/ (here: this test), and no second line quoting a source line."""
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: shown.append(
            warnings.formatwarning(message, category, filename, lineno, line))  # what Python writes to stderr
        kernels.use(tiny(pi="half"), "auto")  # the line said
    err = "".join(shown)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{__file__}:") and ": RuntimeWarning: tssa_impl='auto': pi='half'" in err, err


# -----------------------------------------------------------------------------
# states of one's own (MATH.md §9, step 2): tensors in a tuple, a dict, ...


class TupleState(model.LinearAttention):
    """Linear attention whose decoding state is a tuple (S, z) of its running sums."""

    def init_state(self, B, pos):
        linear = super().init_state(B, pos)
        return linear.S, linear.z

    def forward(self, x, mask=None, state=None, record=None):
        sums = None if state is None else model.LinearState(*self.sums(state), pos=None)  # the same tensors
        return super().forward(x, mask, sums, record)

    def sums(self, state):
        return state


class DictState(TupleState):
    """The same, its state a dict {"S": ..., "z": ...}."""

    def init_state(self, B, pos):
        return dict(zip("Sz", super().init_state(B, pos)))

    def sums(self, state):
        return state["S"], state["z"]


class ObjectState(TupleState):
    """The same, its state a plain object: GPT.prefill cannot start it over."""

    def init_state(self, B, pos):
        S, z = super().init_state(B, pos)
        return SimpleNamespace(S=S, z=z)

    def sums(self, state):
        return state.S, state.z


class OnesState(TupleState):
    """The same, with a third tensor made as ones: not the zeros a new prompt starts from."""

    def init_state(self, B, pos):
        return (*super().init_state(B, pos), torch.ones(1))

    def sums(self, state):
        return state[:2]


class ReplacedState(DictState):
    """The dict state, its sums replaced after each call instead of written in place."""

    def forward(self, x, mask=None, state=None, record=None):
        y = super().forward(x, mask, state, record)
        if state is not None:
            state.update(S=state["S"].clone(), z=state["z"].clone())
        return y


class CountedState(model.LinearAttention):
    """Linear attention plus (the token's position) * a fixed direction on its output, the position
    counted in its state by a Python int: the parallel form and the steps from a new state agree,
    but a new prompt in the same state (which GPT.prefill starts over by zeroing tensors) goes on
    counting. (The direction is not constant over the channels, which a LayerNorm would undo.)"""

    def init_state(self, B, pos):
        linear = super().init_state(B, pos)
        linear.seen = 0
        return linear

    def forward(self, x, mask=None, state=None, record=None):
        first = 0 if state is None else state.seen
        if state is not None:
            state.seen += x.shape[1]
        positions = torch.arange(first, first + x.shape[1], dtype=x.dtype)[:, None]  # (T, 1)
        return super().forward(x, mask, state, record) + positions * torch.linspace(-0.1, 0.1, x.shape[-1])


STATES = {"tuple": TupleState, "dict": DictState}
BAD_STATES = {  # what the start check says of a state GPT.prefill cannot start over
    "object": (ObjectState, "blocks.0.attn (ObjectState): GPT.prefill cannot start its state over for a new prompt "
                            "(a decoding state is tensors in a dataclass, tuple, list or dict, not SimpleNamespace): "
                            "make ObjectState.init_state return tensors in one of those (MATH.md §9)"),
    "ones": (OnesState, "blocks.0.attn (OnesState): OnesState.init_state gives a state that is not all zeros, while "
                        "GPT.prefill starts a new prompt from zeros: make it zeros (MATH.md §9)"),
    "replaced": (ReplacedState, "blocks.0.attn (ReplacedState): its decoding state's tensors are replaced, not "
                                "written in place"),
    "counted": (CountedState, "blocks.0.attn (CountedState): GPT.prefill then GPT.step differ from GPT.forward by "),
}


@pytest.mark.parametrize("kind", STATES)
def test_math_section_9_a_state_of_its_own_decodes_as_it_trains_and_starts_over(kind, monkeypatch):
    monkeypatch.setitem(model.ATTENTIONS, kind, STATES[kind])
    m = tiny(attn=kind)
    assert isinstance(m.init_state(1).layers[0], (tuple, dict))
    for prompt in (1, 16, m.config.block_size):  # each prompt in a new state
        decode_equals_parallel(m, prompt)
    idx = torch.randint(0, 31, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        state = m.init_state(2)
        m.prefill(idx[:, :9], state)
        again = m.prefill(idx[:, :4], state)  # a new prompt in the same state: started over
        torch.testing.assert_close(again, m(idx[:, :4])[0][:, -1], rtol=0, atol=1e-5)
    assert forks.decoding_differs(m) is None


@pytest.mark.parametrize("kind", BAD_STATES)
def test_a_state_generate_cannot_start_over_is_told_at_the_start_and_sampled_by_the_parallel_form(kind, monkeypatch,
                                                                                                 tmp_path, capsys):
    cls, said = BAD_STATES[kind]
    monkeypatch.setitem(model.ATTENTIONS, kind, cls)
    assert forks.decoding_differs(tiny(attn=kind)).startswith(said)
    write_checkpoint(tmp_path, lambda ckpt: None, attn=kind, layer_scale_init=1.0)  # (1e-5 would hide a difference)
    code, stdout, err = call_main(sample, f"--out_dir={tmp_path}", "--start=ab", "--max_new_tokens=6",
                                  "--num_samples=1", "--temperature=0", capsys=capsys)
    assert code == 0 and len(err.strip().splitlines()) == 1, err
    assert said in err and err.strip().endswith("sampling by the parallel form instead (a full forward per token)")
    assert greedy_by_parallel_form(str(tmp_path), 6, "ab") in stdout


def test_a_state_of_its_own_trains_and_samples_through_the_scripts(book, tmp_path, capsys, monkeypatch):
    """The tuple state through train.py (its start check says nothing) and sample.py, which
    decodes by GPT.prefill and GPT.step (no parallel form), as the parallel form computes."""
    monkeypatch.setitem(model.ATTENTIONS, "tuple", TupleState)
    out = tmp_path / "tuple"
    code, stdout, err = call_main(train, *book, f"--out_dir={out}", "--attn=tuple", capsys=capsys)
    assert code == 0 and "warning" not in err and "iter 5:" in stdout, err
    parallel = forks.generate_in_parallel
    monkeypatch.setattr(forks, "generate_in_parallel", None)  # sample.py must not need it
    code, stdout, err = call_main(sample, f"--out_dir={out}", f"--start={PROMPT}", "--max_new_tokens=12",
                                  "--num_samples=1", "--temperature=0", capsys=capsys)
    assert code == 0 and "warning" not in err, err
    monkeypatch.setattr(forks, "generate_in_parallel", parallel)
    assert greedy_by_parallel_form(str(out), 12) in stdout


# -----------------------------------------------------------------------------
# a TSSA subclass with its own forward


class HalfStepTSSA(model.TSSA):
    """A TSSA whose own forward halves the output of a decoding step (not of the parallel form)."""

    def forward(self, x, mask=None, state=None, record=None):
        y = super().forward(x, mask, state, record)
        return 0.5 * y if state is not None and x.shape[1] == 1 else y


class ScaledInputTSSA(model.TSSA):
    """A TSSA whose own forward scales its input by 2 first: it decodes as it trains, and records
    z, w, pi and out as TSSA.forward does (its step built from model.py's s)."""

    def forward(self, x, mask=None, state=None, record=None):
        return super().forward(2.0 * x, mask, state, record)


def test_the_start_check_names_the_forward_a_tssa_subclass_runs(monkeypatch):
    shipped_f(monkeypatch)
    monkeypatch.setitem(model.ATTENTIONS, "half_step", HalfStepTSSA)
    line = forks.decoding_differs(tiny(attn="half_step"))
    assert line.startswith("blocks.0.attn (HalfStepTSSA): its decoding step differs from its parallel form"), line
    assert line.endswith("edit HalfStepTSSA.forward of one token from a state and HalfStepTSSA.forward together "
                         "(MATH.md §9)") and "model.causal_tssa" not in line, line


def test_lm_inspect_draws_a_tssa_subclass_with_its_own_forward(book, tmp_path, capsys, monkeypatch):
    shipped_f(monkeypatch)
    monkeypatch.setitem(model.ATTENTIONS, "scaled", ScaledInputTSSA)
    out = tmp_path / "scaled"
    code, _, err = call_main(train, *book, f"--out_dir={out}", "--attn=scaled", "--max_iters=2", capsys=capsys)
    assert code == 0 and "warning" not in err, err
    code, stdout, err = call_main(lm_inspect, f"--out_dir={out}", "--n_windows=2", "--batch_size=2", capsys=capsys)
    assert code == 0 and err == "" and (out / "inspect" / "index.html").exists(), err  # its s is model.py's: no word
    assert "layer 2: entropy of Pi" in stdout
