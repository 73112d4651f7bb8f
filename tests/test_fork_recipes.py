"""
MATH.md §9's recipes, round four: the forks a researcher makes after reading the paper, each made as
§9 says and run through every script (train.py, sample.py, evaluate.py, lm_inspect.py, export.py and
a reader's --init_from), where it runs its own maths or is refused or warned in one line at the start:

  - a statistic with an input of its own (GLA / RetNet-style: the running sums decay by a gate of
    each head and token): its own forward; a fused tssa_impl, which would run no kernel in it, is
    refused in one line (cpu, triton) or said in one warning (auto);
  - a Pi that is not a membership (a sigmoid per head, one entry of model.PI_MODES): one warning at
    build naming the contract; and a Pi with parameters of its own (a learned prior per head): a
    TSSA subclass whose pi_mode is its own function, which the fused kernels refuse;
  - a new model setting (CRATE's ISTA block in place of the MLP, chosen by a field added to
    model.GPTConfig): --ffn=ista in train.py with no edit there, saved, resumed, exported and loaded;
    the stock code given its export says it is another model, not damage;
  - state outside the attention (a short causal convolution before the MLP, its inputs kept in the
    block's decoding state by Block.init_state): it decodes as it trains; with a planted bug in its
    step, train.py's start check names the block and the module, at initialisation already (it runs
    on a copy whose every module acts: the convolution starts as the identity).
And the trainers take their model settings from the config dataclasses (a field added to any of
them is a setting of its trainer), and a reader given an intact export of another model (weights
this code does not build) says so.

    python -m pytest -q tests/test_fork_recipes.py
"""

import dataclasses
import importlib
import json
import math
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import evaluate
import export
import kernels
import lm_inspect
import model
import sample
import train
import vit_train  # noqa: F401  (imported anew by test_a_field_added_...)
import lra.train  # noqa: F401
from nanotost import checkpoints, cli, forks
from test_fork import PROMPT, book, decode_equals_parallel, greedy_by_parallel_form, shipped_f  # noqa: F401
from test_train import call_main

RAN = []  # what each fork's own maths appends when it runs: the scripts ran the fork, not the shipped maths


def tiny(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=32, vocab_size=31, n_layer=2, n_head=2, n_embd=16, layer_scale_init=1.0)
    return model.GPT(model.GPTConfig(**{**cfg, **kw})).eval()


# -----------------------------------------------------------------------------
# 1. a statistic with an input of its own: sums that decay by a gate of each head and token


def gated_sums(x, decay):
    """sum_{u <= t} (prod_{u < v <= t} decay_v) x_u over the tokens (dim 2) of x (B, H, T, p), decay
    (B, H, T) in (0, 1): the running sums of a gated recurrence, all at once."""
    logs = decay.log().cumsum(dim=2)  # (B, H, T)
    T = x.shape[2]
    later = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # u > t: not summed
    weights = (logs[..., :, None] - logs[..., None, :]).masked_fill(later, -math.inf).exp()  # (B, H, T, T)
    return torch.einsum("bhtu,bhup->bhtp", weights, x)


def gated_causal_tssa(w, gamma, pos_bias, decay, state=None):
    """model.causal_tssa with every running sum gated by decay (B, H, T); given a state (a prompt before
    decoding), the sums at its last token go into it, as gated_step keeps them. Returns (out, Pi)."""
    T = w.shape[2]
    w32 = w.to(model.stat_dtype(w.dtype))
    w_sq = w32.square()  # (B, H, T, p)
    sum_sq = gated_sums(w_sq, decay)
    normed = w_sq / sum_sq.clamp_min(model.PI_NORM_EPS)
    pi = model.pi_from_logits(gamma.view(1, -1, 1) * (normed + pos_bias[None, :, :T, None]).sum(-1), "softmax")
    sum_pi_sq, sum_pi = gated_sums(pi[..., None] * w_sq, decay), gated_sums(pi[..., None], decay)[..., 0]
    out = -pi[..., None] * w32 * model.f_prime(model.token_statistic(sum_pi_sq, sum_pi))
    if state is not None:
        for running, value in zip((state.sum_sq, state.sum_pi_sq, state.sum_pi), (sum_sq, sum_pi_sq, sum_pi)):
            running.copy_(value[:, :, -1])
    return out.to(w.dtype), pi


def gated_step(w_t, gamma, pos_bias_t, decay_t, state):
    """model.causal_tssa_step after each running sum is multiplied by this token's decay_t (B, H)."""
    for running in (state.sum_sq, state.sum_pi_sq):
        running.mul_(decay_t[..., None])
    state.sum_pi.mul_(decay_t)
    return model.causal_tssa_step(w_t, gamma, pos_bias_t, state)


class GatedTSSA(model.TSSA):
    """§9: a statistic with an input of its own. The decay of each head's sums at each token is
    sigmoid(gate(x)), which the operators' signatures have no slot for: its own forward, which records
    z, w, pi and out as TSSA.forward does (for lm_inspect.py). Its state is TSSA's."""

    def __init__(self, config, causal=False):
        super().__init__(config, causal)
        self.gate = nn.Linear(config.n_embd, config.n_head)

    def forward(self, x, mask=None, state=None, record=None):
        RAN.append("gated")
        w = model.split_heads(self.w_proj(x), self.n_head)  # (B, H, T, p)
        decay = torch.sigmoid(self.gate(x).float() + 3.0).transpose(1, 2)  # (B, H, T), about 0.95
        if state is None or x.shape[1] > 1:  # training, or a prompt (it fills the state)
            out, pi = gated_causal_tssa(w, self.gamma, self.pos_bias, decay, state)
        else:
            bias = self.pos_bias.index_select(1, model.position_index(state.pos, self.pos_bias.shape[1]))[:, 0]
            out, pi = gated_step(w[:, :, 0], self.gamma, bias, decay[:, :, 0], state).unsqueeze(2), None
        y = self.dropout(self.c_proj(model.merge_heads(out)))
        if record is not None:
            record.update(z=x, w=w, pi=pi, out=y)
        return y


# -----------------------------------------------------------------------------
# 2. a Pi that is no membership (a PI_MODES entry), and a Pi with parameters (a subclass)


def sigmoid_pi(logits):
    """Each head's share by a sigmoid of its own logit: no sum to 1 over the heads."""
    RAN.append("sigmoid")
    return torch.sigmoid(logits)


class PriorPiTSSA(model.TSSA):
    """§9: a Pi with parameters of its own, a learned prior per head: Pi = softmax over the heads of the
    logits plus the prior. Its pi_mode is its own function, which every operator calls (pi_from_logits)."""

    def __init__(self, config, causal=False):
        super().__init__(config, causal)
        self.prior = nn.Parameter(torch.zeros(config.n_head))
        self.pi_mode = self.pi_with_prior

    def pi_with_prior(self, logits):  # (B, H, ...) -> (B, H, ...)
        RAN.append("prior")
        return (logits + self.prior.view(1, -1, *[1] * (logits.dim() - 2))).softmax(dim=1)


# -----------------------------------------------------------------------------
# 3. a new model setting: CRATE's ISTA block in place of the MLP, chosen by GPTConfig.ffn


def add_field(patch, cls, name, annotation, default):
    """The field `name` added to the config dataclass cls in place, as a forker's edit of model.py adds it:
    every name bound to cls (train.py's GPTConfig, checkpoints', hub's) sees it; undone with `patch`."""
    forked = dataclasses.make_dataclass(cls.__name__, [(name, annotation, dataclasses.field(default=default))],
                                        bases=(cls,), kw_only=True)
    for attr in ("__init__", "__repr__", "__eq__", "__dataclass_fields__"):
        patch.setattr(cls, attr, forked.__dict__[attr])
    patch.setattr(cls, "__annotations__", {**cls.__dict__.get("__annotations__", {}), name: annotation})
    patch.setattr(cls, name, default, raising=False)


class ISTA(nn.Module):
    """CRATE's sparsification step (Yu et al. 2023): one step of ISTA towards a sparse, non-negative
    code of x in a learned dictionary D (C x C), started at x itself: relu(x + eta D^T (x - D x) - eta lambda)."""

    def __init__(self, n_embd, step=0.1, sparsity=0.1):
        super().__init__()
        self.dictionary = nn.Parameter(torch.randn(n_embd, n_embd) / math.sqrt(n_embd))
        self.step, self.sparsity = step, sparsity

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        RAN.append("ista")
        residual = x - x @ self.dictionary.T  # x - D x, each token a row
        return F.relu(x + self.step * residual @ self.dictionary - self.step * self.sparsity)


class IstaBlock(model.Block):
    """model.Block as a forker edits it: the MLP is ISTA where config.ffn says so."""

    def __init__(self, config, causal, attn=None):
        super().__init__(config, causal, attn)
        if getattr(config, "ffn", "mlp") == "ista":
            self.mlp = ISTA(config.n_embd)


# -----------------------------------------------------------------------------
# 4. state outside the attention: a short causal convolution before the MLP (GPTConfig.mlp_conv)


class CausalConv(nn.Module):
    """y_t = sum_j a_j x_{t - j} per channel over the last k tokens (zeros before the first), the identity
    at first; decoding keeps the last k - 1 inputs in `past` (B, k - 1, C), written in place."""

    def __init__(self, n_embd, kernel_size):
        super().__init__()
        weight = torch.zeros(n_embd, kernel_size)
        weight[:, -1] = 1.0
        self.weight = nn.Parameter(weight)

    def forward(self, x, past=None):
        RAN.append("conv")
        B, T, C = x.shape
        k = self.weight.shape[1]
        xp = torch.cat([x.new_zeros(B, k - 1, C) if past is None else past.to(x.dtype), x], dim=1)
        y = F.conv1d(xp.transpose(1, 2), self.weight.to(x.dtype)[:, None, :], groups=C).transpose(1, 2)
        if past is not None:
            past.copy_(xp[:, xp.shape[1] - (k - 1):])
        return y


class ConvBlock(model.Block):
    """model.Block as §9 says a forker adds state outside the attention: Block.init_state returns the
    attention's state beside the convolution's (a tuple), and Block.forward hands each its part."""

    def __init__(self, config, causal, attn=None):
        super().__init__(config, causal, attn)
        k = getattr(config, "mlp_conv", 0) if causal else 0
        self.mlp_conv = CausalConv(config.n_embd, k) if k else None

    def init_state(self, B, pos):
        attn_state = super().init_state(B, pos)
        if self.mlp_conv is None:
            return attn_state
        weight = self.mlp_conv.weight
        return attn_state, weight.new_zeros(B, weight.shape[1] - 1, weight.shape[0])

    def forward(self, x, mask=None, state=None, record=None):
        attn_state, past = state if self.mlp_conv is not None and state is not None else (state, None)
        x = x + self.drop_path(self.attn_scale(self.attn(self.ln_1(x), mask=mask, state=attn_state, record=record)))
        h = self.ln_2(x) if self.mlp_conv is None else self.mlp_conv(self.ln_2(x), self.past_for(past, x))
        return x + self.drop_path(self.mlp_scale(self.mlp(h)))

    def past_for(self, past, x):
        return past


class PlantedBugBlock(ConvBlock):
    """ConvBlock with a bug planted in its step: one token is convolved with zeros for its past."""

    def past_for(self, past, x):
        return past if x.shape[1] > 1 else None


# -----------------------------------------------------------------------------
# the forks, as §9 makes each: installed on `patch`, the trainer's arguments, the name of its maths in RAN, what
# a fused tssa_impl says, and what the stock code says of its export


def fresh(name):
    """The script module `name` imported anew, as a process that starts it does (its settings read model.py's
    configs as they are now); the module every other test holds stays where it is."""
    held = sys.modules.pop(name)
    try:
        return importlib.import_module(name)
    finally:
        sys.modules[name] = held
        if "." in name:  # (the package's attribute too: lra.train)
            package, _, attr = name.rpartition(".")
            setattr(sys.modules[package], attr, held)


def gated(patch):
    patch.setitem(model.ATTENTIONS, "gated", GatedTSSA)
    return ["--attn=gated"]


def sigmoid(patch):
    patch.setitem(model.PI_MODES, "sigmoid", sigmoid_pi)
    return ["--pi=sigmoid"]


def prior(patch):
    patch.setitem(model.ATTENTIONS, "prior", PriorPiTSSA)
    return ["--attn=prior"]


def ista(patch):
    add_field(patch, model.GPTConfig, "ffn", str, "mlp")
    patch.setattr(model, "Block", IstaBlock)
    return ["--ffn=ista"]


def conv(patch, block=ConvBlock):
    add_field(patch, model.GPTConfig, "mlp_conv", int, 0)
    patch.setattr(model, "Block", block)
    return ["--mlp_conv=3"]


PI_WARNING = ("warning: Pi by model.PI_MODES['sigmoid'] does not sum to 1 over the heads (off by up to ", "), as "
              "MATH.md §9 asks of a membership: R_var's head weights n_k / n and lm_inspect.py's page assume it")
FORKS = {  # name: (install, its maths in RAN, the warnings of every script that builds it, of lm_inspect.py, cpu's
    #              refusal, what the stock code says of its export)
    "gated": (gated, "gated", [], ["its output is not c_proj of -Pi w f'(s) for model.py's statistic s"],
              "tssa_impl=cpu would run no kernel: blocks.0.attn (GatedTSSA) has a forward of its own that calls none "
              "of its operators (its own maths): use tssa_impl=torch",
              "names attn='gated', an attention this version does not know"),
    "sigmoid": (sigmoid, "sigmoid", [PI_WARNING], [],
                "tssa_impl=cpu computes Pi by a softmax over the heads, and blocks.0.attn (TSSA) takes pi='sigmoid'",
                "names pi='sigmoid', a Pi this version does not know"),
    "prior": (prior, "prior", [], [],
              "tssa_impl=cpu computes Pi by a softmax over the heads, and blocks.0.attn (PriorPiTSSA) takes its own "
              "Pi, PriorPiTSSA.pi_with_prior: use tssa_impl=torch, which runs it",
              "names attn='prior', an attention this version does not know"),
    "ista": (ista, "ista", [], [], None, "is a model this code does not build: its model_args ffn='ista' are not "
                                         "GPTConfig fields here (a fork's or another version's model"),
    "conv": (conv, "conv", [], [], None, "is a model this code does not build: its model_args mlp_conv=3 are not "
                                         "GPTConfig fields here (a fork's or another version's model"),
}


def said(err, expected):
    """Whether stderr holds exactly the lines expected (each given as the parts it holds)."""
    lines = err.strip().splitlines()
    parts = [(e,) if isinstance(e, str) else e for e in expected]
    return len(lines) == len(parts) and all(all(p in line for p in part) for line, part in zip(lines, parts))


@pytest.mark.parametrize("name", FORKS)
def test_a_fork_made_as_section_9_says_runs_its_own_maths_in_every_script_or_is_refused_in_one_line(
        name, book, tmp_path, capsys, monkeypatch):
    """Each fork trains (train.py: its own maths, warned where §9 says), samples from its decoding state
    as its parallel form computes (sample.py), is scored and drawn (evaluate.py, lm_inspect.py), exported
    and loaded (export.py, --init_from); a fused tssa_impl that cannot run it is one line before any work;
    the stock code given its export says in one line what it is."""
    shipped_f(monkeypatch)
    install, maths, warned, inspected, fused, stock = FORKS[name]
    with pytest.MonkeyPatch.context() as fork:
        argv = install(fork)
        trainer = fresh("train")  # (its settings read GPTConfig's fields when it starts)
        out, exported = tmp_path / "run", tmp_path / "export"
        RAN.clear()
        code, stdout, err = call_main(trainer, *book, f"--out_dir={out}", "--max_iters=2", "--eval_interval=2", *argv,
                                      capsys=capsys)
        assert code == 0 and "iter 1:" in stdout and said(err, warned) and maths in RAN, err
        args = checkpoints.load_checkpoint(str(out), "language")["model_args"]
        assert all(str(args[a[2:].split("=")[0]]) == a.split("=")[1] for a in argv), args  # saved
        RAN.clear()
        code, stdout, err = call_main(sample, f"--out_dir={out}", f"--start={PROMPT}", "--max_new_tokens=6",
                                      "--num_samples=1", "--temperature=0", capsys=capsys)
        assert code == 0 and said(err, warned) and maths in RAN, err  # it decodes as it trains: no other word
        text = greedy_by_parallel_form(str(out), 6)
        assert text in stdout
        capsys.readouterr()  # (what loading that model said)
        RAN.clear()
        data_dir = next(a for a in book if a.startswith("--data_dir="))
        code, stdout, err = call_main(evaluate, f"--out_dir={out}", data_dir, "--max_tokens=64", capsys=capsys)
        assert code == 0 and said(err, warned) and maths in RAN, err
        code, stdout, err = call_main(lm_inspect, f"--out_dir={out}", "--n_windows=2", "--batch_size=2",
                                      capsys=capsys)
        assert code == 0 and (out / "inspect" / "index.html").exists() and said(err, warned + inspected), err
        code, stdout, err = call_main(export, f"--out_dir={out}", f"--to={exported}", capsys=capsys)
        assert code == 0 and said(err, warned), err
        code, stdout, err = call_main(sample, f"--init_from={exported}", f"--start={PROMPT}", "--max_new_tokens=6",
                                      "--num_samples=1", "--temperature=0", capsys=capsys)
        assert code == 0 and said(err, warned) and text in stdout, err  # the export is the same model
        if name == "ista":  # a new model setting: resumed from its checkpoint (--ffn taken from there)
            code, stdout, err = call_main(trainer, *book, f"--out_dir={out}", "--init_from=resume", "--max_iters=3",
                                          "--eval_interval=3", capsys=capsys)
            assert code == 0 and "resumed from" in stdout and "iter 2:" in stdout, err
            assert checkpoints.load_checkpoint(str(out), "language")["config"]["ffn"] == "ista"
        if fused:  # the kernels compute the shipped TSSA: one line, before any work
            code, _, err = call_main(trainer, *book, f"--out_dir={tmp_path / 'cpu'}", *argv, "--tssa_impl=cpu",
                                     capsys=capsys)
            assert code == 1 and said(err, warned + [fused]) and not (tmp_path / "cpu").exists(), err
    code, _, err = call_main(sample, f"--init_from={exported}", "--max_new_tokens=2", capsys=capsys)
    assert code == 1 and said(err, [stock]) and "download it again" not in err, err


# -----------------------------------------------------------------------------
# each fork decodes as it trains, after prompts of 1, 16 and block_size tokens, and its maths is its own


@pytest.mark.parametrize("name", FORKS)
def test_math_section_9_each_fork_decodes_as_it_trains_and_changes_the_model(name, monkeypatch):
    shipped_f(monkeypatch)
    settings = {"gated": dict(attn="gated"), "sigmoid": dict(pi="sigmoid"), "prior": dict(attn="prior"),
                "ista": dict(ffn="ista"), "conv": dict(mlp_conv=3)}[name]
    FORKS[name][0](monkeypatch)
    m = tiny(**settings)
    for prompt in (1, m.config.block_size):
        full = decode_equals_parallel(m, prompt)
    assert forks.decoding_differs(m) is None
    if name == "prior":  # (its prior starts at 0, the softmax's Pi: trained, it moves)
        for block in m.blocks:
            block.attn.prior.data = torch.tensor([1.0, -1.0])
        full = decode_equals_parallel(m, 16)
    if name == "conv":  # (its convolution starts as the identity: trained, it mixes the tokens)
        for block in m.blocks:
            block.mlp_conv.weight.data.normal_(generator=torch.Generator().manual_seed(0))
        full = decode_equals_parallel(m, 16)
    monkeypatch.undo()
    shipped_f(monkeypatch)
    assert (full - decode_equals_parallel(tiny(), 16)).abs().max() > 1e-3  # not the shipped maths


# -----------------------------------------------------------------------------
# state outside the attention, with a planted bug: named at train.py's start, at initialisation


def test_a_planted_bug_in_the_step_of_a_state_outside_the_attention_is_named_at_train_start(book, tmp_path, capsys,
                                                                                            monkeypatch):
    """The convolution before the MLP starts as the identity, so at initialisation its state changes
    nothing; the start check runs on a copy whose every module acts, and names the block and the
    module where the two forms first differ, and where §9 says such state goes. train.py trains on;
    sample.py samples by the parallel form."""
    shipped_f(monkeypatch)
    with pytest.MonkeyPatch.context() as fork:
        argv = conv(fork, PlantedBugBlock)
        trainer = fresh("train")
        m = tiny(mlp_conv=3)
        rng = torch.get_rng_state()
        line = forks.decoding_differs(m)
        assert torch.equal(torch.get_rng_state(), rng)  # (the run's random numbers untouched)
        assert line.startswith("blocks.0.mlp_conv (CausalConv), outside the attention, gives other outputs when "
                               "decoding than in the parallel form (by "), line
        assert line.endswith("a module that remembers earlier tokens keeps them in the block's decoding state beside "
                             "the attention's (Block.init_state makes it, Block.forward hands it on; MATH.md §9, "
                             "state outside the attention)"), line
        out = tmp_path / "planted"
        code, stdout, err = call_main(trainer, *book, f"--out_dir={out}", "--max_iters=2", "--eval_interval=2", *argv,
                                      capsys=capsys)
        assert code == 0 and "iter 1:" in stdout and said(err, [("warning: decoding differs from the parallel form: "
                                                                 "blocks.0.mlp_conv (CausalConv), outside the "
                                                                 "attention", "training goes on")]), err
        code, stdout, err = call_main(sample, f"--out_dir={out}", f"--start={PROMPT}", "--max_new_tokens=6",
                                      "--num_samples=1", "--temperature=0", capsys=capsys)
        assert code == 0 and said(err, [("blocks.0.mlp_conv (CausalConv)", "sampling by the parallel form")]), err
        assert greedy_by_parallel_form(str(out), 6) in stdout


def test_the_block_and_the_module_are_named_where_a_state_outside_the_attention_is_wrong(monkeypatch):
    """A block's own state that GPT.prefill cannot start over (not zeros) names the block's
    init_state, not its attention's; the attention's own faults still name the attention."""
    shipped_f(monkeypatch)

    class OnesBlock(ConvBlock):
        def init_state(self, B, pos):
            attn_state, past = super().init_state(B, pos)
            return attn_state, past + 1.0
    conv(monkeypatch, OnesBlock)
    line = forks.decoding_differs(tiny(mlp_conv=3))
    assert line == ("blocks.0 (OnesBlock): OnesBlock.init_state gives a state that is not all zeros, while "
                    "GPT.prefill starts a new prompt from zeros: make it zeros (MATH.md §9)"), line


def test_a_kv_cache_inside_a_blocks_own_state_still_bounds_what_generate_keeps(monkeypatch):
    """A softmax block (hybrid_every) whose state is (its KV cache, the convolution's inputs): past
    block_size GPT.generate encodes the last block_size tokens again, as for a KV cache alone
    (model.state_parts finds its max_len), and gives the tokens of the parallel form."""
    shipped_f(monkeypatch)
    conv(monkeypatch)
    m = tiny(mlp_conv=3, hybrid_every=2, block_size=8)
    assert isinstance(m.init_state(1).layers[1][0], model.KVCache)
    idx = torch.randint(0, 31, (2, 3), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(m.generate(idx, 12, temperature=0), forks.generate_in_parallel(m, idx, 12, temperature=0),
                               rtol=0, atol=0)


# -----------------------------------------------------------------------------
# the fused implementations and a forward of its own; Pi's contract at build


def test_a_forward_that_calls_none_of_its_operators_is_refused_by_cpu_and_triton_and_said_by_auto(monkeypatch):
    shipped_f(monkeypatch)
    gated(monkeypatch)
    for impl in ("cpu", "triton"):
        with pytest.raises(ValueError, match=rf"^tssa_impl={impl} would run no kernel: blocks\.0\.attn \(GatedTSSA\) "
                                             "has a forward of its own that calls none of its operators"):
            kernels.use(tiny(attn="gated"), impl)
    with pytest.warns(RuntimeWarning) as shown:
        kernels.use(tiny(attn="gated"), "auto")
    assert [str(w.message) for w in shown] == ["tssa_impl='auto': GatedTSSA has a forward of its own that calls none "
                                               "of its operators: it runs its own maths, no kernel"]

    class ScaledInput(model.TSSA):  # a forward of its own that runs its operators: the kernels take it
        def forward(self, x, mask=None, state=None, record=None):
            return super().forward(2.0 * x, mask, state, record)
    monkeypatch.setitem(model.ATTENTIONS, "scaled", ScaledInput)
    m = kernels.use(tiny(attn="scaled"), "cpu")
    assert m.blocks[0].attn.operators == kernels.ops_for("cpu")


@pytest.mark.parametrize("pi,warns", [("softmax", False), ("uniform", False), ("sigmoid", True), ("prior", False),
                                      ("half", True)])
def test_a_pi_that_does_not_sum_to_1_over_the_heads_is_one_warning_at_build(pi, warns, monkeypatch, capsys):
    """Every Pi, a name of model.PI_MODES or a subclass's own function: a warning where it does not sum
    to 1 over the heads, one line from a script's build (cli.build), none from a meta build (checkpoints)."""
    sigmoid(monkeypatch)
    prior(monkeypatch)

    class HalfPi(PriorPiTSSA):  # a subclass's own Pi, at half a membership
        def pi_with_prior(self, logits):
            return 0.5 * super().pi_with_prior(logits)
    monkeypatch.setitem(model.ATTENTIONS, "half", HalfPi)
    config = model.GPTConfig(n_layer=3, n_head=4, n_embd=16, block_size=8, vocab_size=11,
                             **({"attn": pi} if pi in ("prior", "half") else {"pi": pi}))
    with torch.device("meta"):
        model.GPT(config)  # (a meta build tries what it can: a subclass's parameters are not there)
    capsys.readouterr()
    cli.build(model.GPT, config)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == int(warns), lines
    if warns:
        assert "does not sum to 1 over the heads" in lines[0] and "MATH.md §9" in lines[0], lines


# -----------------------------------------------------------------------------
# the trainers' model settings: the config dataclasses' fields, one list


@pytest.mark.parametrize("name,config", [("train", model.GPTConfig), ("vit_train", model.ViTConfig),
                                         ("lra.train", "LRAConfig")])
def test_a_field_added_to_a_model_config_is_a_setting_of_its_trainer(name, config, monkeypatch):
    """Every field of the model's config is a setting of its trainer (but what the trainer derives from
    its data), and a field added to the config is one more, with its default, checked by the config's
    own rules: no edit to the trainer."""
    from lra.encoder import LRAConfig
    config = LRAConfig if config == "LRAConfig" else config
    derived = {"GPTConfig": {"vocab_size"}, "ViTConfig": {"num_classes", "in_chans"},
               "LRAConfig": {"vocab_size", "num_classes", "max_len", "two_tower"}}[config.__name__]
    assert set(sys.modules[name].MODEL_KEYS) == {f.name for f in dataclasses.fields(config)} - derived
    with pytest.MonkeyPatch.context() as fork:
        add_field(fork, config, "tested_field", float, 0.25)
        script = fresh(name)
        assert script.DEFAULTS["tested_field"] == 0.25 and script.MODEL_KEYS[-1] == "tested_field"
        assert set(script.DEFAULTS) == set(sys.modules[name].DEFAULTS) | {"tested_field"}
    assert "tested_field" not in fresh(name).DEFAULTS


def test_a_resume_takes_a_model_setting_its_checkpoint_holds_in_model_args_alone(book, tmp_path, capsys, monkeypatch):
    """A checkpoint written before a model field became a setting (its config lacks it): resumed, the
    setting is read from its model_args."""
    shipped_f(monkeypatch)
    out = tmp_path / "run"
    code, _, err = call_main(train, *book, f"--out_dir={out}", "--max_iters=2", "--eval_interval=2", "--mlp_ratio=2.0",
                             capsys=capsys)
    assert code == 0, err
    ckpt = checkpoints.load_checkpoint(str(out), "language")
    full = torch.load(str(out / "ckpt.pt"), weights_only=True)
    for key in ("mlp_ratio", "ln_eps", "drop_path"):
        full["config"].pop(key)
    checkpoints.save_checkpoint(full, str(out / "ckpt.pt"))
    code, stdout, err = call_main(train, *book, f"--out_dir={out}", "--init_from=resume", "--max_iters=4",
                                  "--eval_interval=2", capsys=capsys)
    assert code == 0 and "resumed from" in stdout, err
    assert checkpoints.load_checkpoint(str(out), "language")["model_args"]["mlp_ratio"] == ckpt["model_args"][
        "mlp_ratio"] == 2.0


# -----------------------------------------------------------------------------
# exports describe what they hold; another model's intact export is another model


class AlwaysIstaBlock(model.Block):
    """model.Block edited by a forker with no field of its own: ISTA in place of the MLP in every model."""

    def __init__(self, config, causal, attn=None):
        super().__init__(config, causal, attn)
        self.mlp = ISTA(config.n_embd)


def test_an_export_describes_its_own_fields_and_another_models_weights_are_not_damage(book, tmp_path, capsys,
                                                                                      monkeypatch):
    """The card and config.json's architecture say a fork's own field (ffn='ista'), and the card lists
    every model argument; a fork that changed the model without a field of its own (ISTA always): its
    export, intact, is another model to the stock code (the weights it has and lacks), not damage; its
    weights beside another model's config.json are still damage."""
    shipped_f(monkeypatch)
    made = {}
    for name, install in (("field", ista), ("edit", lambda fork: fork.setattr(model, "Block", AlwaysIstaBlock) or [])):
        with pytest.MonkeyPatch.context() as fork:
            argv = install(fork)
            out, made[name] = tmp_path / f"run-{name}", tmp_path / f"export-{name}"
            code, _, err = call_main(fresh("train"), *book, f"--out_dir={out}", "--max_iters=2", "--eval_interval=2",
                                     *argv, capsys=capsys)
            assert code == 0, err
            assert call_main(export, f"--out_dir={out}", f"--to={made[name]}", capsys=capsys)[0] == 0
    config = json.loads((made["field"] / "config.json").read_text())
    assert config["architecture"] == "ToST-GPT, with ffn='ista'"
    card = (made["field"] / "README.md").read_text()
    assert "every field of GPTConfig" in card and "`ffn='ista'`" in card and "`n_layer=2`" in card
    code, _, err = call_main(sample, f"--init_from={made['edit']}", "--max_new_tokens=2", capsys=capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"{made['edit']} is another model than this code builds of its model_args" in err, err
    assert "exported at commit" in err and "the weights have blocks.0.mlp.dictionary" in err, err
    assert "download it again" not in err, err
    (made["edit"] / "model.safetensors").write_bytes((made["field"] / "model.safetensors").read_bytes())
    code, _, err = call_main(sample, f"--init_from={made['edit']}", "--max_new_tokens=2", capsys=capsys)
    assert code == 1 and "are not of one model" in err and "download it again" in err, err
