"""
nanoToST model: Token Statistics Self-Attention (TSSA) and the Token Statistics Transformer.

One file, in the order of MATH.md:
  1. the objective and the operator as plain functions: R_var (`compression_objective`, §1.3), one gradient step
     on it (`tssa`, §2-3), its causal form (`causal_tssa`, §4.1-4.3), and the recurrent state with its one-token
     step (`TSSAState`, `causal_tssa_step`, §4.4);
  2. the modules built from them: `TSSA`, the MLP, the pre-norm `Block` (§5.1);
  3. ToST-GPT (§5.2): a GPT-2 skeleton with TSSA, trained in parallel, decoded from the state;
  4. ToST-ViT (§5.3-5.4): an XCiT skeleton with TSSA;
  appendix: the baselines and variants (the short convolution, softmax attention and its KV cache, linear
     attention) and the plumbing that the fast paths need.

Symbols (MATH.md §1.1): B batch, T tokens, C = H * p model width, H heads (the K subspaces U_k), p head width.
w = U_k^T z, the features of each token in each head's basis: (B, H, T, p). Pi (B, H, T): how much each token
belongs to each head (sums to 1 over heads). s (B, H, p): the Pi-weighted second moment of each feature of each
head, the "token statistic". gamma (H,): the temperature of Pi; pos_bias (H, block_size): b, the causal form's bias.

This file is the reference and imports nothing of the project: the fused kernels (kernels/) are checked against
its functions, and put in a built model by `kernels.use`.

    python -c "import model; print(model.GPT.from_preset('tost-base'))"
"""

import math
import warnings
from collections import namedtuple
from dataclasses import dataclass, fields, is_dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# The floor inside Pi, as released: non-causal, on each feature's norm over the tokens (F.normalize's clamp, so
# PI_NORM_EPS ** 2 on the sum of squares); causal, on the running sum of squares itself, unsquared (MATH.md §3.4).
PI_NORM_EPS = 1e-12
STAT_EPS = 1e-8  # added to the Pi-weighted token count of a head (a head no token belongs to)

# -----------------------------------------------------------------------------
# 1. The objective and the operator, as plain functions.
# The operators take w = U^T z (B, H, T, p) and return the per-head update -Pi * w * f'(s) of
# the same shape (before the output projection). Pi, when returned, is detached: the theory
# holds it fixed (MATH.md §2.4); it is returned for the analysis maps and the decoding state.


def f(x):
    """The concave function of the objective (MATH.md §1.3): R_var sums f(s) over the statistics."""
    return torch.log1p(x)


def f_prime(x):
    """f'(x), the scale of the gradient step (MATH.md §2.2): the operators below look it up when
    they run, so an edit here (or `model.f_prime = ...`) changes every form at once. Change f with
    it: a TSSA refuses to be built where f_prime is not f's derivative (check_f_prime)."""
    return 1.0 / (1.0 + x)


def stat_dtype(dtype):
    """Statistics are kept in fp32 for fp16/bf16 inputs (and in fp64 for fp64 inputs)."""
    return torch.promote_types(dtype, torch.float32)


def token_statistic(sum_pi_w_sq, sum_pi):
    """s (MATH.md §1.3, §3.3), the Pi-weighted mean of w^2 over the tokens a head sees (all, or a prefix:
    §4.3), from their sums of Pi w^2 (..., p) and of Pi (...,): the objective's, each operator's and lm_inspect's."""
    return sum_pi_w_sq / (sum_pi.unsqueeze(-1) + STAT_EPS)


def compression_objective(w, pi, mask=None):
    """Variational compression term R_var(Z | Pi, U) of MATH.md §1.3 (paper eq. 4), per sample, for f above.
    w = U^T z: (B, H, T, p) features in each head's basis; pi: (B, H, T) memberships; mask: (B, T) real tokens.
        R_var = 1/2 sum_k (n_k / n) sum_i f(s_ki),  s_ki = (1/n_k) sum_j Pi[j,k] w[j,i]^2
    Returns (B,) in the dtype of w (use float64 for finite differences)."""
    m = w.new_ones(w.shape[0], w.shape[2]) if mask is None else mask.to(w.dtype)  # (B, T)
    pi = pi.to(w.dtype) * m[:, None, :]  # (B, H, T)
    n, n_k = m.sum(dim=1), pi.sum(dim=2)  # (B,), (B, H)
    s = token_statistic((pi.unsqueeze(-1) * w.square()).sum(dim=2), n_k)  # (B, H, p)
    return 0.5 * ((n_k / n[:, None]) * f(s).sum(dim=-1)).sum(dim=-1)  # (B,)


# How Pi comes from its logits (B, H, ...), over the heads (dim 1): each mode (the setting `pi`, the
# operators' pi_mode) is a function here. The paper's softmax; the ablation 1/H (MATH.md §3.3).
PI_MODES = {"softmax": lambda logits: logits.softmax(dim=1),  # fp32: logits are fp32
            "uniform": lambda logits: torch.full_like(logits, 1.0 / logits.shape[1])}


def pi_from_logits(logits, pi_mode):
    """Pi (B, H, ...), summing to 1 over the heads, from its logits by the mode PI_MODES names, or by pi_mode itself
    where it is a function (a TSSA subclass's Pi with parameters of its own: MATH.md §9)."""
    return (pi_mode if callable(pi_mode) else PI_MODES[pi_mode])(logits)


def tssa(w, gamma, return_pi=False, mask=None, pi_mode="softmax"):
    """Non-causal TSSA (MATH.md §3). w: (B, H, T, p); gamma: (H,) or (H, 1), Pi's temperature;
    mask: optional (B, T) bool, True for real tokens; padded tokens take no part in any
    statistic and get a zero output. Returns out (B, H, T, p) [and Pi (B, H, T), detached]."""
    check_shapes(w, gamma, mask)
    dtype, w = w.dtype, w.to(stat_dtype(w.dtype))  # the statistics in fp32 whatever the input dtype
    if mask is not None:
        w = w * mask[:, None, :, None]  # padded tokens contribute nothing
    w_sq = w.square()  # (B, H, T, p)
    # Pi: each feature L2-normalised over the tokens (as F.normalize: the norm floored at
    # PI_NORM_EPS), squared norm per head, then over the heads by pi_mode
    w_sq_normed = w_sq / w_sq.sum(dim=2, keepdim=True).clamp_min(PI_NORM_EPS ** 2)  # (B, H, T, p)
    logits = gamma.reshape(1, -1, 1).to(w.dtype) * w_sq_normed.sum(dim=-1)  # (B, H, T)
    pi = pi_from_logits(logits, pi_mode)  # (B, H, T), sums to 1 over H
    if mask is not None:
        pi = pi * mask[:, None, :]
    s = token_statistic((pi.unsqueeze(-1) * w_sq).sum(dim=2), pi.sum(dim=2))  # (B, H, p)
    out = (-pi.unsqueeze(-1) * w * f_prime(s.unsqueeze(2))).to(dtype)  # one gradient step on R_var (B, H, T, p)
    return (out, pi.detach()) if return_pi else out


def causal_tssa(w, gamma, pos_bias, return_pi=False, pi_mode="softmax", state=None):
    """Causal TSSA (MATH.md §4): token j uses statistics of tokens 1..j only, via cumulative sums. w: (B, H, T, p);
    gamma: (H,) or (H, 1); pos_bias: (H, T_max) or (H, T_max, 1), added per feature before the sum. state: a
    TSSAState, when decoding: the prompt's running sums at its last token are written to it, and causal_tssa_step
    goes on from them (the prefill). Returns out (B, H, T, p) [and Pi (B, H, T), detached]."""
    check_shapes(w, gamma)
    B, H, T, p = w.shape
    bias = check_pos_bias(pos_bias, H, T, w.dtype)[:, :T]  # (H, T)
    dtype, w = w.dtype, w.to(stat_dtype(w.dtype))
    w_sq = w.square()  # (B, H, T, p)
    # Pi[j] from the prefix: features normalised by their running sum of squares (floored)
    sum_sq = prefix_sum(w_sq)  # (B, H, T, p): the sums over tokens t <= j (cumsum; appendix)
    w_sq_normed = w_sq / sum_sq.clamp_min(PI_NORM_EPS)  # (B, H, T, p)
    logits = gamma.reshape(1, -1, 1).to(w.dtype) * (w_sq_normed + bias[None, :, :, None]).sum(dim=-1)  # (B, H, T)
    pi = pi_from_logits(logits, pi_mode)  # (B, H, T)
    # the prefix statistic s_k(j), from the sums of Pi w^2 and of Pi over tokens t <= j
    sum_pi_sq, sum_pi = prefix_sum(pi.unsqueeze(-1) * w_sq), prefix_sum(pi.unsqueeze(-1))[..., 0]  # (.., p), (B, H, T)
    s = token_statistic(sum_pi_sq, sum_pi)  # (B, H, T, p)
    out = (-pi.unsqueeze(-1) * w * f_prime(s)).to(dtype)  # (B, H, T, p)
    if state is not None:  # a prompt before decoding: the sums as its last token sees them
        state.sum_sq.copy_(sum_sq[:, :, -1])
        state.sum_pi_sq.copy_(sum_pi_sq[:, :, -1])
        state.sum_pi.copy_(sum_pi[:, :, -1])
    return (out, pi.detach()) if return_pi else out


@dataclass
class TSSAState:
    """Everything causal TSSA remembers of the past (MATH.md §4.4): three running sums per
    head, the same size whatever the length, written in place (never replaced)."""

    sum_sq: torch.Tensor  # (B, H, p) running sum of w^2
    sum_pi_sq: torch.Tensor  # (B, H, p) running sum of Pi * w^2
    sum_pi: torch.Tensor  # (B, H) running sum of Pi
    pos: torch.Tensor  # () int64: tokens seen so far (one counter for all layers, advanced by GPT.step)
    conv: torch.Tensor | None = None  # (B, k - 1, C) the short convolution's last inputs (variant), or None

    @classmethod
    def zeros(cls, B, H, p, device=None, dtype=torch.float32, pos=None):
        z = lambda *shape: torch.zeros(*shape, device=device, dtype=stat_dtype(dtype))  # noqa: E731
        pos = torch.zeros((), dtype=torch.long, device=device) if pos is None else pos
        return cls(z(B, H, p), z(B, H, p), z(B, H), pos)

    def nbytes(self):  # (pos is every layer's)
        return sum(t.numel() * t.element_size() for t in state_tensors(self) if t is not self.pos)


def causal_tssa_step(w_t, gamma, pos_bias_t, state, pi_mode="softmax"):
    """One token of causal TSSA in O(H p) (MATH.md §4.4): w_t (B, H, p) its features, pos_bias_t (H,) its column of
    the position bias; the sums of `state` take it in, in place. Returns out_t (B, H, p), causal_tssa's there."""
    dtype, H = w_t.dtype, w_t.shape[1]
    w_t = w_t.to(state.sum_sq.dtype)  # the state's dtype: fp32 (fp64 for fp64 inputs)
    w_sq = w_t.square()  # (B, H, p)
    state.sum_sq.add_(w_sq)
    normed = w_sq / state.sum_sq.clamp_min(PI_NORM_EPS) + pos_bias_t.to(w_t.dtype).reshape(1, H, 1)  # (B, H, p)
    pi = pi_from_logits(gamma.to(w_t.dtype).reshape(1, H) * normed.sum(-1), pi_mode)  # (B, H)
    state.sum_pi_sq.add_(pi.unsqueeze(-1) * w_sq)
    state.sum_pi.add_(pi)
    s = token_statistic(state.sum_pi_sq, state.sum_pi)  # (B, H, p)
    return (-pi.unsqueeze(-1) * w_t * f_prime(s)).to(dtype)


# -----------------------------------------------------------------------------
# 2. The modules: x (B, T, C) -> (B, T, C)


def split_heads(x, H):  # (B, T, C) -> (B, H, T, C // H)
    B, T, C = x.shape
    return x.view(B, T, H, C // H).transpose(1, 2)


def merge_heads(x):  # (B, H, T, p) -> (B, T, H * p)
    B, H, T, p = x.shape
    return x.transpose(1, 2).reshape(B, T, H * p)


class TSSA(nn.Module):
    """Token Statistics Self-Attention: ONE C x C input projection (the bases U_k of all heads stacked), the
    operator, a free output projection (MATH.md §2.3); causal=True adds the learned per-head position bias b.
    self.operators: the three operator functions it runs: section 1's (REFERENCE_OPERATORS, in the appendix), a
    subclass's own (MATH.md §9), or fused versions of section 1's (kernels/). Opt-in variant (causal only,
    GPTConfig.short_conv = k > 0): a ShortConv of kernel k on the input, a channel to the k - 1 tokens before."""

    def __init__(self, config, causal=False):
        super().__init__()
        C, H = config.n_embd, config.n_head
        if C % H:
            raise ValueError(f"n_embd ({C}) must be divisible by n_head ({H})")
        if config.pi not in PI_MODES:
            raise ValueError(f"pi must be one of {', '.join(PI_MODES)}, got {config.pi!r}")
        check_f_prime()  # f and f_prime changed together, or refused in one line (MATH.md §9)
        self.n_head, self.causal, self.pi_mode = H, causal, config.pi  # pi_mode: the setting pi (PI_MODES)
        self.operators = REFERENCE_OPERATORS
        self.w_proj = nn.Linear(C, C, bias=config.bias)  # w = U^T z for all heads at once
        self.c_proj = nn.Linear(C, C, bias=config.bias)  # replaces (tau / n) [U_1 .. U_K]
        self.gamma = nn.Parameter(torch.ones(H))  # per-head temperature of Pi (MATH.md §3.1)
        if causal:
            self.pos_bias = nn.Parameter(torch.zeros(H, config.block_size))  # b (MATH.md §4.2)
        k = getattr(config, "short_conv", 0) if causal else 0  # GPTConfig only
        self.conv = ShortConv(C, k) if k else None
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, state=None, record=None):
        """x (B, T, C) -> y (B, T, C). mask: (B, T) padding (non-causal). state: a TSSAState to decode with: a prompt
        (T > 1) fills it, one token (T = 1) advances it. record: a dict, if given, gets z, w = U^T z, pi and out = y."""
        z = x if self.conv is None else self.conv(x, state)  # (B, T, C)
        w = split_heads(self.w_proj(z), self.n_head)  # (B, H, T, p)
        if not self.causal:
            out, pi = self.operators.tssa(w, self.gamma, return_pi=True, mask=mask, pi_mode=self.pi_mode)
        elif state is None or w.shape[2] > 1:  # training, or the prompt of a decoding (it fills the state)
            out, pi = self.operators.causal_tssa(w, self.gamma, self.pos_bias, return_pi=True, pi_mode=self.pi_mode,
                                                 state=state)
        else:  # one new token from the recurrent state; past block_size, the last learned bias
            pos_bias_t = self.pos_bias.index_select(1, position_index(state.pos, self.pos_bias.shape[1]))[:, 0]  # (H,)
            out = self.operators.causal_tssa_step(w[:, :, 0], self.gamma, pos_bias_t, state, self.pi_mode)
            out, pi = out.unsqueeze(2), None  # (a step records no Pi)
        y = self.dropout(self.c_proj(merge_heads(out)))  # (B, T, C)
        if record is not None:
            record.update(z=z, w=w, pi=pi, out=y)
        return y

    def init_state(self, B, pos):
        """An empty TSSAState for B sequences: the running sums (and the short convolution's inputs), zeros."""
        weight, H, C = self.w_proj.weight, self.n_head, self.w_proj.in_features
        state = TSSAState.zeros(B, H, C // H, weight.device, weight.dtype, pos)
        state.conv = None if self.conv is None else weight.new_zeros(B, self.conv.kernel_size - 1, C)
        return state


# Every attention a config can name (`attn`), and so every script's choices: the baselines add
# themselves in the appendix. A new attention is its class, (config, causal) -> module with
# forward(x, mask, state, record) and init_state(B, pos), and one entry here (MATH.md §9).
ATTENTIONS = {"tssa": TSSA}


def make_attention(config, causal, attn=None):
    """The attention of one block: `attn` if given, else config.attn; a TSSA's Pi checked once built (check_pi)."""
    attn = attn or config.attn
    if attn not in ATTENTIONS:
        raise ValueError(f"attn must be one of {', '.join(map(repr, ATTENTIONS))}, got {attn!r}")
    module = ATTENTIONS[attn](config, causal)
    if isinstance(module, TSSA):
        check_pi(module.pi_mode, module.n_head)
    return module


class MLP(nn.Module):
    def __init__(self, *, n_embd, hidden, bias=False, dropout=0.0):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch (init 1e-5 or 1.0); identity if None."""

    def __init__(self, n_embd, init):
        super().__init__()
        self.weight = None if init is None else nn.Parameter(torch.full((n_embd,), float(init)))

    def forward(self, x):
        return x if self.weight is None else self.weight * x


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample while training."""

    def __init__(self, p=0.0):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty(x.shape[0], *([1] * (x.dim() - 1)), device=x.device).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class Block(nn.Module):
    """Pre-norm block (MATH.md §5.1): x + attn_scale * Attn(ln_1(x)), then x + mlp_scale * MLP(ln_2(x)),
    the layer scales MATH.md's g_1 and g_2. Built from a model config (GPTConfig, ViTConfig or lra's
    LRAConfig: the fields read here are common to all)."""

    def __init__(self, config, causal, attn=None):
        super().__init__()
        C, ls = config.n_embd, config.layer_scale_init
        self.ln_1 = nn.LayerNorm(C, eps=config.ln_eps, bias=config.bias)
        self.attn = make_attention(config, causal, attn)
        self.attn_scale = LayerScale(C, ls)
        self.ln_2 = nn.LayerNorm(C, eps=config.ln_eps, bias=config.bias)
        self.mlp = MLP(n_embd=C, hidden=int(config.mlp_ratio * C), bias=config.bias, dropout=config.dropout)
        self.mlp_scale = LayerScale(C, ls)
        self.drop_path = DropPath(config.drop_path)

    def forward(self, x, mask=None, state=None, record=None):
        """x (B, T, C) -> (B, T, C); state and record go to the attention (see TSSA.forward)."""
        x = x + self.drop_path(self.attn_scale(self.attn(self.ln_1(x), mask=mask, state=state, record=record)))
        return x + self.drop_path(self.mlp_scale(self.mlp(self.ln_2(x))))

    def init_state(self, B, pos):
        """The block's decoding state: its attention's, and any other of its modules' that remembers tokens (§9)."""
        return self.attn.init_state(B, pos)


# -----------------------------------------------------------------------------
# 3. ToST-GPT (MATH.md §5.2, language)


@dataclass(kw_only=True)
class GPTConfig:
    block_size: int = 1024  # context length (the causal position bias ends here)
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False  # biases in Linear and LayerNorm
    attn: str = "tssa"  # a name of ATTENTIONS: "tssa", "softmax" (the GPT-2 baseline), "linear", ...
    pi: str = "softmax"  # how Pi comes from its logits, a name of PI_MODES: "softmax", "uniform" (ablation 1/H)
    layer_scale_init: float | None = 1e-5  # None: no layer scale (GPT-2)
    mlp_ratio: float = 4.0  # MLP hidden width / n_embd
    drop_path: float = 0.0  # stochastic depth (not used by the language recipes)
    ln_eps: float = 1e-5  # LayerNorm epsilon
    short_conv: int = 0  # opt-in variant (0: off): a depthwise causal convolution of this kernel on each TSSA input
    hybrid_every: int = 0  # opt-in variant (0: off): k, blocks i with (i + 1) % k == 0 use softmax attention

    def __post_init__(self):  # the rules between settings, in one place (train.py asks them too)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.short_conv < 0 or self.hybrid_every < 0:
            raise ValueError(f"short_conv and hybrid_every must be >= 0 (0: off), got {self.short_conv}, "
                             f"{self.hybrid_every}")
        if self.short_conv and not issubclass(ATTENTIONS.get(self.attn, TSSA), TSSA):
            raise ValueError(f"short_conv convolves the TSSA input: it needs a TSSA attention, got attn={self.attn!r}")


GPT_PRESETS = {  # parameter counts include the position embedding, not the padded vocab
    "tost-base": dict(n_layer=12, n_head=12, n_embd=768),  # 110M
    "tost-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 304M
    "tost-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 655M
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, attn="softmax", bias=True, layer_scale_init=None),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024, attn="softmax", bias=True, layer_scale_init=None),
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280, attn="softmax", bias=True, layer_scale_init=None),
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600, attn="softmax", bias=True, layer_scale_init=None),
}


DecodeState = namedtuple("DecodeState", "pos layers")  # tokens seen (() int64), each block's state (Block.init_state)


class GPT(nn.Module):
    """A decoder-only language model: token + position embeddings, causal blocks, tied head."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c, causal=True, attn=self.attention_of_block(c, i)) for i in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.ln_eps, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by 1/sqrt(2L)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def attention_of_block(c, i):
        """The attention of block i: config.attn, or softmax for every hybrid_every-th block."""
        if c.hybrid_every and (i + 1) % c.hybrid_every == 0:
            return "softmax"
        return c.attn

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in GPT_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(GPT_PRESETS)}")
        return cls(GPTConfig(**{**GPT_PRESETS[name], "vocab_size": 50257, **overrides}))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def get_num_params(self, non_embedding=False):
        """Parameters (tied head counted once); non_embedding drops the position table."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        """idx: (B, T) token ids, T <= block_size. Without targets: (logits (B, T, V), None).
        With targets (B, T) (-1: not scored): (None, the mean cross-entropy)."""
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}; "
                             "crop the input or build the model with a larger block_size")
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x), None
        return None, self.loss(x, targets)

    def loss(self, x, targets):
        """The mean cross-entropy of the logits lm_head(x) (x (B, T, C)) against targets (B, T), -1
        not scored; the softmax in fp32 under autocast."""
        logits = self.lm_head(x).float()  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    # Decoding (MATH.md §4.4): the prompt runs in parallel once and fills each block's state;
    # then every token is one `step` from the states, O(1) for TSSA whatever the length.

    def init_state(self, B):
        pos = torch.zeros((), dtype=torch.long, device=self.wte.weight.device)
        return DecodeState(pos, [block.init_state(B, pos) for block in self.blocks])

    def prefill(self, idx, state):
        """Start decoding after the prompt idx (B, T): its first block_size tokens in parallel,
        any rest token by token. Starts `state` over. Returns the next token's logits (B, V)."""
        for tensor in state_tensors(state):  # a new prompt starts over: the same buffers, zeroed (appendix)
            tensor.zero_()
        T = min(idx.shape[1], self.config.block_size)
        x = self.drop(self.wte(idx[:, :T]) + self.wpe(torch.arange(T, device=idx.device)))
        for block, layer in zip(self.blocks, state.layers):
            x = block(x, state=layer)  # each block writes the prompt into its state
        state.pos.fill_(T)
        logits = self.lm_head(self.ln_f(x[:, -1]))
        for t in range(T, idx.shape[1]):
            logits = self.step(idx[:, t:t + 1], state)
        return logits

    def step(self, tok, state):
        """One token tok (B, 1) -> the next token's logits (B, V); the states advance in place.
        Past block_size, the last learned position is reused (embedding, and TSSA's bias)."""
        x = self.drop(self.wte(tok) + self.wpe(position_index(state.pos, self.config.block_size)))  # (B, 1, C)
        for block, layer in zip(self.blocks, state.layers):
            x = block(x, state=layer)
        state.pos.add_(1)
        return self.lm_head(self.ln_f(x[:, -1]))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, tokenizer_vocab_size=None):
        """idx (B, T) followed by max_new_tokens sampled tokens: (B, T + max_new_tokens).
        temperature 0: greedy; top_k: draw among the k likeliest; tokenizer_vocab_size: the ids
        of the tokenizer (those above it only pad config.vocab_size, and are never drawn)."""
        state = self.init_state(idx.shape[0])
        kv_caches = [part.max_len for part in state_parts(state) if hasattr(part, "max_len")]  # of block_size tokens
        window = min(kv_caches, default=idx.shape[1] + max_new_tokens)  # the tokens the states hold: TSSA's, all
        logits = self.prefill(idx[:, -window:], state)  # (B, V): the prompt, in parallel, fills the state
        for _ in range(max_new_tokens):
            tok = sample_token(logits[:, :tokenizer_vocab_size], temperature, top_k)  # (B, 1)
            idx = torch.cat([idx, tok], dim=1)
            if idx.shape[1] <= window:
                logits = self.step(tok, state)  # one token from the state, O(1) for TSSA
            else:  # a full KV cache: the last block_size tokens again, in parallel (GPT-2's sliding window)
                logits = self.prefill(idx[:, -window:], state)
        return idx


def sample_token(logits, temperature, top_k=None):
    """A token per row of logits (B, V): the argmax at temperature 0, else a draw from the softmax of
    logits / temperature among the top_k largest (all if None), the largest moved to 0 (tiny T: the argmax)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if temperature < torch.finfo(torch.float32).tiny:  # 0, or a T that float32 would round to 0: greedy
        return logits.argmax(dim=-1, keepdim=True)
    logits = (logits.float() - logits.amax(dim=-1, keepdim=True).float()) / temperature  # (B, V), at most 0
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1)


# -----------------------------------------------------------------------------
# 4. ToST-ViT (MATH.md §5.3, vision): XCiT skeleton with TSSA, no local patch interaction


class ConvPatchEmbed(nn.Module):
    """log2(patch) 3x3 stride-2 convs with BatchNorm and GELU between: channels ... C/4, C/2, C."""

    def __init__(self, *, patch_size, in_chans, n_embd):
        super().__init__()
        n = int(math.log2(patch_size))
        if 2 ** n != patch_size or n < 1:
            raise ValueError(f"patch_size must be a power of two >= 2, got {patch_size}")
        chans = [in_chans] + [n_embd // 2 ** (n - 1 - i) for i in range(n)]
        layers = []
        for i in range(n):
            conv = nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1, bias=False)
            layers += [conv, nn.BatchNorm2d(chans[i + 1])]
            if i < n - 1:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x):  # (B, 3, H, W) -> (B, C, H / patch, W / patch)
        return self.proj(x)


class FourierPositionalEncoding(nn.Module):
    """2-D sinusoidal features of the normalised patch coordinates, mapped to C by a 1x1 conv.
    Row i of Hp (1-based) sits at 2 pi i / (Hp + 1e-6), as released (columns alike)."""

    def __init__(self, *, n_embd, hidden=32, temperature=10000.0, eps=1e-6):
        super().__init__()
        self.hidden, self.temperature, self.eps = hidden, temperature, eps
        self.proj = nn.Conv2d(2 * hidden, n_embd, kernel_size=1)

    def forward(self, B, Hp, Wp, device):  # -> (B, C, Hp, Wp)
        y = torch.arange(1, Hp + 1, device=device, dtype=torch.float32)[:, None].expand(Hp, Wp)
        x = torch.arange(1, Wp + 1, device=device, dtype=torch.float32)[None, :].expand(Hp, Wp)
        y, x = y / (Hp + self.eps) * 2 * math.pi, x / (Wp + self.eps) * 2 * math.pi  # just under (0, 2 pi]
        freqs = self.temperature ** (2 * (torch.arange(self.hidden, device=device) // 2) / self.hidden)
        def features(coord):  # (Hp, Wp) -> (hidden, Hp, Wp), sin on even channels, cos on odd
            a = coord[None] / freqs[:, None, None]
            return torch.where(torch.arange(self.hidden, device=device)[:, None, None] % 2 == 0, a.sin(), a.cos())
        pe = torch.cat([features(y), features(x)], dim=0)[None].expand(B, -1, -1, -1)
        return self.proj(pe.to(self.proj.weight.dtype))


class ClassAttention(nn.Module):
    """Softmax attention of the class token (query) over all tokens; O(T). Only the class token is updated."""

    def __init__(self, *, n_embd, n_head, bias=True, dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.q = nn.Linear(n_embd, n_embd, bias=bias)
        self.kv = nn.Linear(n_embd, 2 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, record=None):
        """x (B, 1 + N, C), the class token first -> (B, 1, C); record["attn"]: (B, H, 1 + N)."""
        q = split_heads(self.q(x[:, :1]), self.n_head)  # (B, H, 1, p)
        k, v = (split_heads(t, self.n_head) for t in self.kv(x).chunk(2, dim=-1))  # (B, H, 1+N, p)
        acc = torch.promote_types(q.dtype, torch.float32)  # scores in fp32 at least (bf16 runs)
        attn = (q.to(acc) @ k.to(acc).transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)  # (B, H, 1, 1+N)
        y = attn.to(v.dtype) @ v  # (B, H, 1, p)
        if record is not None:
            record["attn"] = attn[:, :, 0]
        return self.dropout(self.c_proj(merge_heads(y)))


class ClassAttentionBlock(nn.Module):
    """XCiT's class-attention block (tokens_norm=True), as released in ToST (MATH.md §5.4); x = [c, p] (class, patches):
        n = LN1(x);           x = x + drop_path(g1 * [attn_c(n), n_p])   (patches: p + g1 LN1(p))
        x = LN2(x)            on the residual stream, every token
        x = x + drop_path([g2 * MLP(x_c), x_p])                          (patches: doubled)
    The class token leaves as LN2(c') + g2 MLP(LN2(c')); the next block's LN1 undoes the 2."""

    def __init__(self, *, n_embd, n_head, mlp_ratio=4.0, layer_scale_init=1.0, dropout=0.0, drop_path=0.0, eps=1e-6):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = ClassAttention(n_embd=n_embd, n_head=n_head, dropout=dropout)
        self.attn_scale = LayerScale(n_embd, layer_scale_init)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = MLP(n_embd=n_embd, hidden=int(mlp_ratio * n_embd), bias=True, dropout=dropout)
        self.mlp_scale = LayerScale(n_embd, layer_scale_init)
        self.drop_path = DropPath(drop_path)

    def forward(self, x, record=None):  # x (B, 1 + N, C) -> same; record["attn"] (B, H, 1 + N)
        n = self.ln_1(x)
        a = self.attn(n, record)  # (B, 1, C)
        x = x + self.drop_path(self.attn_scale(torch.cat([a, n[:, 1:]], dim=1)))
        x = self.ln_2(x)
        return x + self.drop_path(torch.cat([self.mlp_scale(self.mlp(x[:, :1])), x[:, 1:]], dim=1))


@dataclass(kw_only=True)
class ViTConfig:
    img_size: int = 224  # default size; any size divisible by patch_size works at run time
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    n_layer: int = 12
    n_head: int = 8
    n_embd: int = 384
    mlp_ratio: float = 4.0
    dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth rate of every ToST block (released: T 0, S 0.05, M 0.15)
    cls_drop_path: float = 0.0  # of the class-attention blocks (XCiT, and so the release: 0)
    ln_eps: float = 1e-6  # LayerNorm epsilon everywhere in the ViT (as released)
    layer_scale_init: float | None = 1.0  # 1.0 for 12 layers, 1e-5 for 24 (MATH.md §5.3); None: none
    attn: str = "tssa"  # a name of ATTENTIONS ("softmax", "linear": ViT baselines at the same size)
    pi: str = "softmax"  # a name of PI_MODES
    bias: bool = True  # biases in the blocks' Linear and LayerNorm layers (as released)
    n_cls_layers: int = 2


VIT_PRESETS = {
    "tost-t": dict(n_layer=12, n_head=4, n_embd=192, drop_path=0.0),  # 5.8M
    "tost-s": dict(n_layer=12, n_head=8, n_embd=384, drop_path=0.05),  # 22.6M
    "tost-m": dict(n_layer=24, n_head=8, n_embd=512, layer_scale_init=1e-5, drop_path=0.15),  # 71.5M (released)
}


class ToSTViT(nn.Module):
    """Image classifier: conv patch embedding + Fourier positions, ToST blocks over patch
    tokens, class token with class-attention layers, LayerNorm, linear head."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = c = config
        self.patch_embed = ConvPatchEmbed(patch_size=c.patch_size, in_chans=c.in_chans, n_embd=c.n_embd)
        self.pos_embed = FourierPositionalEncoding(n_embd=c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c, causal=False) for _ in range(c.n_layer))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.n_embd))
        self.cls_blocks = nn.ModuleList(
            ClassAttentionBlock(n_embd=c.n_embd, n_head=c.n_head, mlp_ratio=c.mlp_ratio,
                                layer_scale_init=c.layer_scale_init, dropout=c.dropout,
                                drop_path=c.cls_drop_path, eps=c.ln_eps)
            for _ in range(c.n_cls_layers))
        self.norm = nn.LayerNorm(c.n_embd, eps=c.ln_eps)
        self.head = nn.Linear(c.n_embd, c.num_classes)
        self.apply(self._init_weights)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in VIT_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(VIT_PRESETS)}")
        return cls(ViTConfig(**{**VIT_PRESETS[name], **overrides}))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def reset_classifier(self, num_classes):
        """New head for transfer learning (the paper's fine-tuning setting)."""
        self.config = replace(self.config, num_classes=num_classes)
        self.head = nn.Linear(self.config.n_embd, num_classes).to(self.head.weight.device)
        self._init_weights(self.head)

    def forward(self, images, record=None):
        """images: (B, 3, H, W), H and W divisible by patch_size -> logits (B, classes). record: a dict, if given,
        receives "layers" (per ToST block the maps of TSSA.forward: z (B, N, C), w (B, H, N, p), pi (B, H, N), out
        (B, N, C)), "cls_attn" (per class-attention layer, (B, H, N) over the patches) and "grid" (Hp, Wp)."""
        P = self.config.patch_size
        if images.dim() != 4 or images.shape[-2] % P or images.shape[-1] % P:
            raise ValueError(f"images must be (B, C, H, W) with H, W divisible by {P}, got {tuple(images.shape)}")
        B = images.shape[0]
        x = self.patch_embed(images)  # (B, C, Hp, Wp)
        Hp, Wp = x.shape[-2:]
        x = x + self.pos_embed(B, Hp, Wp, images.device)
        x = self.drop(x.flatten(2).transpose(1, 2))  # (B, N, C)
        layers = [None if record is None else {} for _ in self.blocks]
        for block, maps in zip(self.blocks, layers):
            x = block(x, record=maps)
        x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, 1 + N, C)
        cls_maps = [None if record is None else {} for _ in self.cls_blocks]
        for block, maps in zip(self.cls_blocks, cls_maps):
            x = block(x, record=maps)
        if record is not None:  # the class token's attention over the patches
            record.update(layers=layers, cls_attn=[m["attn"][:, :, 1:] for m in cls_maps], grid=(Hp, Wp))
        return self.head(self.norm(x[:, 0]))


# =============================================================================
# Appendix. What the sections above use but need not show: the short convolution (a ToST variant), the softmax
# baseline (GPT-2) with its KV cache, linear attention (Katharopoulos et al. 2020) with its state; then the
# operators' plumbing (TSSAOperators), checks (shapes, f_prime against f, Pi a membership) and the fast paths'
# (torch.compile's scans, CUDA graphs' device-side positions and in-place states).


class ShortConv(nn.Module):
    """Depthwise causal convolution over time (opt-in ToST variant, GPTConfig.short_conv): y_t = sum_{j < k} a_j *
    x_{t - j}, one kernel of size k per channel, zeros before the first token. Initialised to the identity (a_0 = 1,
    the rest 0): the variant starts as the paper's TSSA. Decoding keeps the last k - 1 inputs in state.conv."""

    def __init__(self, n_embd, kernel_size):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(F.pad(torch.ones(n_embd, 1), (kernel_size - 1, 0)))  # (C, k): 1 where it meets x_t

    def forward(self, x, state=None):
        """x (B, T, C) -> y (B, T, C). With a decoding state, state.conv (B, k - 1, C) holds
        the inputs before x, and afterwards the last k - 1 inputs (written in place)."""
        B, T, C = x.shape
        k = self.kernel_size
        past = x.new_zeros(B, k - 1, C) if state is None else state.conv.to(x.dtype)
        xp = torch.cat([past, x], dim=1)  # (B, k - 1 + T, C)
        y = F.conv1d(xp.transpose(1, 2), self.weight.to(x.dtype)[:, None, :], groups=C)  # (B, C, T)
        if state is not None:
            state.conv.copy_(xp[:, xp.shape[1] - (k - 1):])
        return y.transpose(1, 2)


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention through F.scaled_dot_product_attention (the baseline:
    flash / memory-efficient / cuDNN kernels where available). Decoding keeps a KVCache."""

    def __init__(self, config, causal=False):
        super().__init__()
        C, H = config.n_embd, config.n_head
        if C % H:
            raise ValueError(f"n_embd ({C}) must be divisible by n_head ({H})")
        self.n_head, self.causal, self.dropout_p = H, causal, config.dropout
        self.max_len = getattr(config, "block_size", 0)  # the KV cache's length when decoding
        self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)
        self.c_proj = nn.Linear(C, C, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask=None, state=None, record=None):
        """x (B, T, C) -> (B, T, C). mask: (B, T) keys to keep. state: a KVCache (decoding)."""
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=-1))  # (B, H, T, p)
        attn_mask, is_causal = (None if mask is None else mask[:, None, None, :]), self.causal
        if state is not None:
            k, v, attn_mask = state.write(k, v)
            is_causal = attn_mask is None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                           dropout_p=self.dropout_p if self.training else 0.0)
        return self.dropout(self.c_proj(merge_heads(y)))

    def init_state(self, B, pos):
        return KVCache(pos, self.max_len)


@dataclass
class KVCache:
    """Keys and values of the past tokens, for softmax decoding: buffers of max_len tokens made at the prompt and
    written in place afterwards, so a step's shapes never change."""

    pos: torch.Tensor  # () int64, shared with the other layers
    max_len: int
    k: torch.Tensor | None = None  # (B, H, max_len, p)
    v: torch.Tensor | None = None

    def write(self, k, v):
        """Store k, v (B, H, T, p) of new tokens. Returns the keys and values to attend to and the mask of visible
        positions: None for a prompt (causal over itself, at 0..T-1); for one token (at pos), every one up to pos."""
        T = k.shape[2]
        if self.k is None:
            self.k, self.v = (t.new_zeros(*t.shape[:2], self.max_len, t.shape[3]) for t in (k, v))
        if T > 1:
            self.k[:, :, :T], self.v[:, :, :T] = k, v
            return k, v, None
        self.k.index_copy_(2, self.pos.view(1), k)
        self.v.index_copy_(2, self.pos.view(1), v)
        visible = torch.arange(self.max_len, device=k.device) <= self.pos  # (max_len,)
        return self.k, self.v, visible.view(1, 1, 1, -1)

    def nbytes(self):  # allocated
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


# causal linear attention (Katharopoulos et al. 2020), the linear-time softmax-free baseline:
# phi(x) = elu(x) + 1 > 0 on queries and keys, y_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps)
# with S_t = sum_{s <= t} phi(k_s) v_s^T (p x p per head) and z_t = sum_{s <= t} phi(k_s).
LINEAR_EPS = 1e-6  # added to the denominator phi(q) . z (positive: phi > 0)
LINEAR_CHUNK = 64  # tokens per chunk of the parallel causal form


def elu_feature_map(x):
    return F.elu(x) + 1.0


@dataclass
class LinearState:
    """Everything causal linear attention remembers of the past: H p x p, constant size."""

    S: torch.Tensor  # (B, H, p, p) running sum of phi(k) v^T
    z: torch.Tensor  # (B, H, p) running sum of phi(k)
    pos: torch.Tensor  # () int64, shared with the other layers

    def nbytes(self):
        return self.S.numel() * self.S.element_size() + self.z.numel() * self.z.element_size()


def causal_linear_attention(q, k, v, S0=None, z0=None, chunk=LINEAR_CHUNK):
    """Parallel causal form, chunked: q, k feature-mapped (>= 0), v, all (B, H, T, p); S0 (B, H, p, p) and z0 (B, H, p)
    the sums of earlier tokens, or None. Within a chunk the masked product (phi(q) phi(k)^T) v; across chunks the
    sums of the earlier chunks. Time linear in T, memory (T / chunk) p^2 per head. Sums in fp32 (at least, autocast
    off). Returns y (B, H, T, p) in that dtype and the sums after the last token (S, z)."""
    B, H, T, p = q.shape
    dt, c = stat_dtype(v.dtype), min(chunk, T)
    n = -(-T // c)  # chunks
    pad = n * c - T  # zero keys and values add nothing; padded queries are dropped
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (F.pad(t.to(dt), (0, 0, 0, pad)).view(B, H, n, c, p) for t in (q, k, v))
        kv = k.transpose(-1, -2) @ v  # (B, H, n, p, p): each chunk's sum of phi(k) v^T
        ks = k.sum(3)  # (B, H, n, p)
        S0 = q.new_zeros(B, H, 1, p, p) if S0 is None else S0.to(dt)[:, :, None]
        z0 = q.new_zeros(B, H, 1, p) if z0 is None else z0.to(dt)[:, :, None]
        S_before = torch.cat([S0, S0 + kv.cumsum(2)[:, :, :-1]], dim=2)  # (B, H, n, p, p): earlier chunks
        z_before = torch.cat([z0, z0 + ks.cumsum(2)[:, :, :-1]], dim=2)  # (B, H, n, p)
        a = (q @ k.transpose(-1, -2)).tril()  # (B, H, n, c, c): within the chunk, s <= t
        num = a @ v + q @ S_before  # (B, H, n, c, p)
        den = a.sum(-1) + (q * z_before[:, :, :, None, :]).sum(-1)  # (B, H, n, c)
        y = (num / (den.unsqueeze(-1) + LINEAR_EPS)).reshape(B, H, n * c, p)[:, :, :T]
    return y, (S_before[:, :, -1] + kv[:, :, -1], z_before[:, :, -1] + ks[:, :, -1])


def linear_attention(q, k, v, mask=None):
    """Non-causal form: every token sees every real token. q, k feature-mapped, (B, H, T, p); mask (B, T) bool, True for
    real tokens: padded keys add nothing, padded outputs are 0. Sums in fp32 (at least, autocast off)."""
    dt = stat_dtype(v.dtype)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        if mask is not None:
            k = k * mask[:, None, :, None]
        S = k.transpose(-1, -2) @ v  # (B, H, p, p)
        y = (q @ S) / ((q * k.sum(2, keepdim=True)).sum(-1, keepdim=True) + LINEAR_EPS)  # (B, H, T, p)
    return y if mask is None else y * mask[:, None, :, None]


class LinearAttention(SoftmaxAttention):
    """Linear attention (Katharopoulos et al. 2020) with the softmax baseline's projections (q, k, v and an output
    projection): feature map elu + 1 on q and k, no softmax. Causal decoding keeps a LinearState (H p x p + H p
    floats, whatever the length); non-causal (vision, LRA) takes the padding mask."""

    def forward(self, x, mask=None, state=None, record=None):
        """x (B, T, C) -> (B, T, C). state: a LinearState to continue from (decoding)."""
        q, k, v = (split_heads(t, self.n_head) for t in self.c_attn(x).chunk(3, dim=-1))  # (B, H, T, p)
        q, k = elu_feature_map(q), elu_feature_map(k)
        if not self.causal:
            y = linear_attention(q, k, v, mask)
        elif state is None:
            y, _ = causal_linear_attention(q, k, v)
        else:  # the prompt or one new token, from the sums so far (written back in place)
            y, (S, z) = causal_linear_attention(q, k, v, state.S, state.z)
            state.S.copy_(S)
            state.z.copy_(z)
        return self.dropout(self.c_proj(merge_heads(y.to(x.dtype))))

    def init_state(self, B, pos):
        H, weight = self.n_head, self.c_attn.weight
        p, dt = weight.shape[1] // H, stat_dtype(weight.dtype)
        return LinearState(weight.new_zeros(B, H, p, p, dtype=dt), weight.new_zeros(B, H, p, dtype=dt), pos)


ATTENTIONS.update(softmax=SoftmaxAttention, linear=LinearAttention)

# The three operators a TSSA runs (TSSA.operators). Section 1's are looked up by name each time they
# run (as f_prime is), so `model.causal_tssa = my_version` changes every form that uses it.
TSSAOperators = namedtuple("TSSAOperators", "tssa causal_tssa causal_tssa_step")
REFERENCE_OPERATORS = TSSAOperators(lambda *a, **k: tssa(*a, **k), lambda *a, **k: causal_tssa(*a, **k),
                                    lambda *a, **k: causal_tssa_step(*a, **k))


def check_shapes(w, gamma, mask=None):
    """Refuse w that is not (B, H, T, p), a gamma without one value per head, a padding mask not (B, T)."""
    if w.dim() != 4:
        raise ValueError(f"w must have shape (B, H, T, p), got {tuple(w.shape)}")
    H = w.shape[1]
    if gamma.numel() != H:
        raise ValueError(f"gamma (Pi's temperature) must have one value per head ({H}), got shape {tuple(gamma.shape)}")
    if mask is not None and mask.shape != (w.shape[0], w.shape[2]):
        raise ValueError(f"mask must have shape (B, T) = {(w.shape[0], w.shape[2])}, got {tuple(mask.shape)}")


def check_pos_bias(pos_bias, H, T, dtype):
    """pos_bias (H, T_max) or (H, T_max, 1) covering T tokens; returns it as (H, T_max)."""
    if pos_bias.dim() == 3:
        pos_bias = pos_bias.squeeze(-1)
    if pos_bias.dim() != 2 or pos_bias.shape[0] != H:
        raise ValueError(f"pos_bias must have shape (H, T_max) or (H, T_max, 1) with H={H}, "
                         f"got {tuple(pos_bias.shape)}")
    if T > pos_bias.shape[1]:
        raise ValueError(f"sequence length {T} exceeds the position bias length (block_size) {pos_bias.shape[1]}")
    return pos_bias.to(stat_dtype(dtype))


def check_f_prime():
    """Refuse (ValueError, one line) an f_prime that is not the derivative of f, which autograd takes
    at a few points in float64: f edited and f_prime not would step on one objective, measure another."""
    with torch.device("cpu"), torch.inference_mode(False), torch.enable_grad():  # (whatever a caller set)
        x = torch.tensor([0.0, 0.5, 2.0, 10.0, 1e3], dtype=torch.float64, requires_grad=True)
        df = torch.autograd.grad(f(x).sum(), x)[0]
        given = torch.as_tensor(f_prime(x.detach()), dtype=torch.float64).expand_as(df)
        i = (given - df).abs().argmax()
    if not torch.allclose(given, df, rtol=1e-6, atol=1e-12):
        raise ValueError(f"model.f_prime is not the derivative of model.f (at x = {x[i]:g}: f_prime gives "
                         f"{given[i]:.6g}, f's derivative {df[i]:.6g}): change f and f_prime together (MATH.md §9)")


def check_pi(pi_mode, H):
    """Warn where Pi by pi_mode does not sum to 1 over H heads on a few logits: no membership (MATH.md §9)."""
    with torch.device("cpu"), torch.no_grad():  # (a model built on the meta device too)
        try:
            pi = pi_from_logits(torch.linspace(-6.0, 6.0, 4 * H).view(2, H, 2), pi_mode)  # (2, H, 2)
            gap = float((pi.sum(dim=1) - 1).abs().max())
        except (RuntimeError, NotImplementedError):  # a subclass's Pi of parameters on the meta device: tried when real
            return
    if not gap <= 1e-4:
        name = getattr(pi_mode, "__qualname__", f"model.PI_MODES[{pi_mode!r}]")  # (a subclass's function, or a name)
        warnings.warn(f"Pi by {name} does not sum to 1 over the heads (off by up to {gap:.2g}), as MATH.md §9 asks of "
                      "a membership: R_var's head weights n_k / n and lm_inspect.py's page assume it; it runs as it is")


def prefix_sum(x, block=32):
    """x.cumsum(2) for x (B, H, T, p): causal_tssa's sums over tokens t <= j; under torch.compile, nested scans of at
    most `block` tokens (Inductor sends a longer one over B H p < 64 rows per SM to a kernel torch 2.11 can't build)."""
    T = x.shape[2]
    if T <= block or not torch.compiler.is_compiling():
        return x.cumsum(2)
    blocks = F.pad(x, (0, 0, 0, -T % block)).unflatten(2, (-1, block)).cumsum(3)  # (B, H, n, block, p)
    before = F.pad(prefix_sum(blocks[:, :, :, -1], block)[:, :, :-1], (0, 0, 1, 0))  # (B, H, n, p): earlier blocks
    return (blocks + before.unsqueeze(3)).flatten(2, 3)[:, :, :T]


def position_index(pos, length):
    """The decoding position pos (() int64) as a (1,) index into a table of `length`, past its end the last:
    on the device, so that a step reads nothing back to the host (a CUDA graph replays it: kernels/cuda_graph.py)."""
    return pos.clamp(max=length - 1).view(1)


def state_parts(state):
    """Each part of a decoding state, nested: tensors in dataclasses, tuples, lists or dicts (§9); else TypeError."""
    yield state
    if is_dataclass(state) or isinstance(state, (tuple, list, dict)):
        parts = ([getattr(state, field.name) for field in fields(state)] if is_dataclass(state) else
                 state.values() if isinstance(state, dict) else state)
        for part in parts:
            yield from state_parts(part)
    elif not (state is None or isinstance(state, (torch.Tensor, bool, int, float, str))):
        raise TypeError(f"a decoding state is tensors in a dataclass, tuple, list or dict, not {type(state).__name__}")


def state_tensors(state):  # every tensor of a decoding state (None, numbers and strings beside them hold none)
    return (part for part in state_parts(state) if isinstance(part, torch.Tensor))
