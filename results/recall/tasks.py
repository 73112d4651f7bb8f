"""
Data generators of the in-context recall suite: each returns a batch of token ids and the
targets a GPT is scored on, with -1 (GPT's ignore_index) at every position that is not
scored, so the loss and the accuracy count the answers only.

  mqar    multi-query associative recall: K (key, value) pairs, then Q queries, each a key of
          the context followed by its value. Keys and values come from two disjoint ranges of
          the vocabulary; the answer to a query key is the value bound to it.
  copy    a random segment of L tokens, a separator, the same segment again: every token of
          the second copy is scored.
  niah    needle in a haystack: n - 3 random filler tokens with one needle (MARK, v) hidden
          at a random depth, then MARK at the end; the answer is v. The filler is drawn from
          the same tokens as v, so only the token after the marker tells which one it is.

Every generator is a pure function of its arguments (a torch.Generator seeded by `seed`),
vectorised over the batch. `chance` is the accuracy of a guess that knows the format but
binds nothing to anything: MQAR 1/K (one of the K values in the context, uniformly; the
queries are drawn with replacement, so no elimination helps), copy and NIAH
1/(number of tokens the answer is drawn from).

    from results.recall.tasks import mqar
    x, y = mqar(batch=4, n_pairs=8, n_queries=8, n_keys=64, n_values=64, seed=0)
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """Where the token ranges of a task sit in its vocabulary (half-open ranges)."""

    vocab_size: int
    keys: tuple[int, int] = (0, 0)
    values: tuple[int, int] = (0, 0)
    special: int = 0  # separator (copy) or marker (niah)


def _gen(seed):
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


def mqar_layout(n_keys, n_values):
    """Token 0 is unused (never in a sequence); keys are 1..n_keys, values follow."""
    return Layout(vocab_size=1 + n_keys + n_values, keys=(1, 1 + n_keys), values=(1 + n_keys, 1 + n_keys + n_values))


def mqar(batch, n_pairs, n_queries, n_keys, n_values, seed):
    """x, y (batch, 2 * (n_pairs + n_queries)) int64. x: k1 v1 ... kK vK q1 a1 ... qQ aQ, with
    K = n_pairs distinct keys, K distinct values, each query q a key of the pairs (uniformly,
    with replacement) and a its value. y[t] = a at each query position t, -1 elsewhere."""
    if n_pairs > n_keys or n_pairs > n_values:
        raise ValueError(f"n_pairs ({n_pairs}) needs at least as many keys ({n_keys}) and values ({n_values})")
    lay, g = mqar_layout(n_keys, n_values), _gen(seed)
    keys = torch.rand(batch, n_keys, generator=g).argsort(-1)[:, :n_pairs] + lay.keys[0]  # (B, K) distinct
    vals = torch.rand(batch, n_values, generator=g).argsort(-1)[:, :n_pairs] + lay.values[0]  # (B, K) distinct
    which = torch.randint(0, n_pairs, (batch, n_queries), generator=g)  # (B, Q) pair asked for
    q_keys, q_vals = keys.gather(1, which), vals.gather(1, which)  # (B, Q)
    context = torch.stack([keys, vals], dim=2).reshape(batch, 2 * n_pairs)
    queries = torch.stack([q_keys, q_vals], dim=2).reshape(batch, 2 * n_queries)
    x = torch.cat([context, queries], dim=1)  # (B, T)
    y = torch.full_like(x, -1)
    y[:, 2 * n_pairs::2] = q_vals  # at each query key: its value (the next input token)
    return x, y


def copy_layout(n_tokens):
    """Token 0 is the separator; the segment's tokens are 1..n_tokens."""
    return Layout(vocab_size=1 + n_tokens, values=(1, 1 + n_tokens), special=0)


def copy(batch, length, n_tokens, seed):
    """x, y (batch, 2 * length + 1). x: s_1 .. s_L SEP s_1 .. s_L; y[t] = x[t + 1] on the
    L positions from SEP on (the second copy, each token predicted from the one before it),
    -1 elsewhere (the first copy is random: nothing to score)."""
    lay, g = copy_layout(n_tokens), _gen(seed)
    seg = torch.randint(lay.values[0], lay.values[1], (batch, length), generator=g)  # (B, L)
    sep = torch.full((batch, 1), lay.special, dtype=torch.long)
    x = torch.cat([seg, sep, seg], dim=1)  # (B, 2L + 1)
    y = torch.full_like(x, -1)
    y[:, length:2 * length] = seg  # x[L] = SEP predicts s_1, ..., x[2L - 1] = s_{L-1} predicts s_L
    return x, y


def niah_layout(n_tokens):
    """Token 0 is the marker; filler and needle values share the tokens 1..n_tokens."""
    return Layout(vocab_size=1 + n_tokens, values=(1, 1 + n_tokens), special=0)


def niah(batch, length, n_tokens, seed, depth=None):
    """x, y (batch, length). x: filler with (MARK, v) at a random position (or at `depth`, a
    fraction of the haystack), and MARK as the last token; y = v at the last position, -1
    elsewhere. The marker appears exactly twice."""
    if length < 4:
        raise ValueError(f"length must be at least 4 (needle, filler, query), got {length}")
    lay, g = niah_layout(n_tokens), _gen(seed)
    x = torch.randint(lay.values[0], lay.values[1], (batch, length), generator=g)  # (B, n)
    v = torch.randint(lay.values[0], lay.values[1], (batch,), generator=g)  # (B,)
    last_start = length - 3  # the needle's MARK at 0 .. n - 3, so v at most at n - 2
    if depth is None:
        pos = torch.randint(0, last_start + 1, (batch,), generator=g)
    else:
        pos = torch.full((batch,), round(depth * last_start), dtype=torch.long)
    rows = torch.arange(batch)
    x[rows, pos] = lay.special
    x[rows, pos + 1] = v
    x[:, -1] = lay.special
    y = torch.full_like(x, -1)
    y[:, -1] = v
    return x, y


def chance(task, **kw):
    """Accuracy of the format-aware guess that binds nothing (see the module docstring)."""
    if task == "mqar":
        return 1.0 / kw["n_pairs"]
    if task in ("copy", "niah"):
        return 1.0 / kw["n_tokens"]
    raise ValueError(f"unknown task {task!r}; choose from mqar, copy, niah")
