"""
The Long Range Arena classifier: a bidirectional encoder built from model.py's blocks
(causal=False) with TSSA or softmax attention, padding masks all the way through, masked
mean pooling and an MLP head. Retrieval runs both documents through the same encoder
(two towers, shared weights) and classifies [u, v, u * v, u - v].

    tokens (B, T) + mask (B, T) -> embeddings + learned positions -> L blocks -> LayerNorm
      -> mean over real tokens (B, C) -> Linear, GELU, Linear -> logits (B, classes)

Padded tokens never matter: TSSA leaves them out of Pi and of its second moments (the mask
argument of model.tssa), softmax attention does not attend to them (SDPA's mask), and the
pooling skips them. So the outputs at real tokens do not depend on how much padding follows
(lra/test_lra.py checks this through the whole model).

norm="post" gives post-norm blocks (x = LN(x + f(x))), which the ToST paper uses for
Pathfinder; model.Block is pre-norm.
"""

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from model import GPT, MLP, Block, make_attention
from nanotost import checkpoints


@dataclass(kw_only=True)
class LRAConfig:
    vocab_size: int
    num_classes: int
    max_len: int  # length of the learned position table
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    mlp_hidden: int = 128  # hidden width of each block's MLP
    dropout: float = 0.1
    attn: str = "tssa"  # a name of model.ATTENTIONS: "tssa", "softmax", "linear", ...
    pi: str = "softmax"  # TSSA's Pi, a name of model.PI_MODES: "softmax" | "uniform"
    norm: str = "pre"  # "pre" | "post"
    two_tower: bool = False  # retrieval: two documents, one shared encoder
    bias: bool = True
    layer_scale_init: float | None = None  # None: no layer scale
    drop_path: float = 0.0  # (model.Block reads these three as well)
    ln_eps: float = 1e-5

    @property
    def mlp_ratio(self):
        return self.mlp_hidden / self.n_embd


class PostNormBlock(nn.Module):
    """x = LN(x + Attn(x)); x = LN(x + MLP(x)) (the original Transformer's order)."""

    def __init__(self, c: LRAConfig):
        super().__init__()
        self.attn = make_attention(c, causal=False)
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.mlp = MLP(n_embd=c.n_embd, hidden=c.mlp_hidden, bias=c.bias, dropout=c.dropout)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)

    def forward(self, x, mask=None):
        x = self.ln_1(x + self.attn(x, mask=mask))
        return self.ln_2(x + self.mlp(x))


class LRAEncoder(nn.Module):
    """tokens (B, T), mask (B, T) -> per-token features (B, T, C) and pooled (B, C)."""

    def __init__(self, c: LRAConfig):
        super().__init__()
        if c.norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {c.norm!r}")
        if c.norm == "pre" and int(c.mlp_hidden / c.n_embd * c.n_embd) != c.mlp_hidden:  # Block takes a ratio
            raise ValueError(f"mlp_hidden {c.mlp_hidden} is not representable as a ratio of n_embd {c.n_embd}")
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = nn.Embedding(c.max_len, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        if c.norm == "pre":
            self.blocks = nn.ModuleList(Block(c, causal=False) for _ in range(c.n_layer))
            self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        else:
            self.blocks = nn.ModuleList(PostNormBlock(c) for _ in range(c.n_layer))
            self.ln_f = nn.Identity()  # post-norm blocks end in a LayerNorm already

    def forward(self, tokens, mask=None):
        """mask: (B, T) bool, True for real tokens; None when every token is real (lets
        SDPA use its fastest kernels)."""
        B, T = tokens.shape
        if T > self.pos_emb.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_len {self.pos_emb.num_embeddings}")
        pos = torch.arange(T, device=tokens.device)
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x, mask=mask)
        x = self.ln_f(x)
        if mask is None:
            return x, x.mean(dim=1)
        m = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        pooled = (x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)  # (B, C): mean over real tokens
        return x, pooled


class LRAClassifier(nn.Module):
    def __init__(self, config: LRAConfig):
        super().__init__()
        self.config = c = config
        self.encoder = LRAEncoder(c)
        head_in = 4 * c.n_embd if c.two_tower else c.n_embd
        self.head = nn.Sequential(nn.Linear(head_in, c.n_embd), nn.GELU(), nn.Dropout(c.dropout),
                                  nn.Linear(c.n_embd, c.num_classes))
        self.apply(GPT._init_weights)  # normal(0, 0.02) weights, zero biases, as the GPT

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, towers):
        """towers: [(tokens (B, T), mask (B, T) or None)], two of them for retrieval (their
        T may differ). Returns logits (B, num_classes)."""
        if len(towers) != (2 if self.config.two_tower else 1):
            raise ValueError(f"expected {2 if self.config.two_tower else 1} inputs, got {len(towers)}")
        pooled = [self.encoder(tokens, mask)[1] for tokens, mask in towers]
        if self.config.two_tower:
            u, v = pooled
            features = torch.cat([u, v, u * v, u - v], dim=-1)  # (B, 4C)
        else:
            features = pooled[0]
        return self.head(features)

    def loss(self, towers, labels):
        logits = self(towers)
        return logits, F.cross_entropy(logits.float(), labels)


checkpoints.register_kind("lra", LRAConfig, LRAClassifier)  # what lra/train.py's checkpoints hold
