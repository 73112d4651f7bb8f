"""
Triton kernels of TSSA (CUDA; TRITON_INTERPRET=1 runs them on the CPU, slowly: that is how the
tests run them). Imported only when tssa_impl="triton" asks for them; kernels/fused.py falls
back to model.py's reference, with a warning, when Triton is missing or a launch fails.

Streaming kernels: four launches each way, every one a grid of (batch row, chunk group, head)
programs that streams its head's tokens once, with no atomics, no look-back and no program
that works while the others wait. TritonKernels.forward and .backward only allocate
(torch.empty) and launch; launch_plan() states each launch's grid and the bytes it moves.

    python -m pytest -q tests/test_kernels.py -k triton   # under the interpreter, in a subprocess
"""

import contextlib
import os

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # tokens per chunk, at most (tile height; fewer when p is large)
GROUP_CHUNKS = 4  # chunks a program streams, at least (more when a row has many)
MAX_GROUPS = 64  # chunk groups (programs) per batch row and head, at most
CARRY_GROUPS = 16  # group totals a carry walk loads per step (tests lower it to cross steps)
NUM_STAGES = 2  # software pipeline depth of every chunk loop (the next tile loads during this one)
# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this file is imported
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# -----------------------------------------------------------------------------
# The streaming kernels
#
# Tokens are cut into chunks of BT, chunks into groups of G consecutive chunks. Every launch
# runs one program per (batch row b, group g, head h), heads fastest, and each program loops
# over its group's chunks, one (BT, P) tile of w (P = p rounded up to a power of two, masked)
# at a time, pipelined (tl.range's num_stages). A running sum over tokens is
#   (the group's carry) + (the group's earlier chunks, in registers) + (a scan inside the tile).
# The group's carry is the sum of the other groups' totals, which an earlier launch wrote: the
# program that needs it walks those totals itself (at most MAX_GROUPS vectors of p floats, in a
# fixed order), so no launch waits on one program's scan and none needs an atomic.
#
#   forward : F1 _k_sum_sq   group totals of w^2                                     -> tS
#             F2 _k_u        carries of S (walk tS); u (B, H, T); chunk carries of S  -> cS
#             F3 _k_pi       Pi = the softmax across heads of temp * u, read as a (BT, H) tile
#                            of every head's u; group totals of Pi w^2 and Pi          -> tMN
#             F4 _k_out      carries of M, N (walk tMN); out; chunk carries of M, N    -> cMN
#   backward: B1 _k_sum_gm   chunks last to first: dL/dM, dL/dN; their group totals   -> tG;
#                            the part of dL/dPi from inside the group                  -> y
#             B2 _k_gpi      dL/dPi = that part + the later groups' (walk tG); y = Pi dL/dPi
#             B3 _k_grad_logit  the softmax backward across heads from a (BT, H) tile of every
#                            head's y: R = temp dL/dlogit (B, H, T), dtemp partials; group
#                            totals of dL/dS                                           -> tGS
#             B4 _k_grad_w   chunks last to first: dL/dw (G_M, G_S: walk tG, tGS, then the
#                            group's later chunks in registers); the programs of batch row 0
#                            also sum dpos_bias over the batch and (group 0) dtemp
# The heads meet only through the per-token fp32 scalars u (forward) and y (backward), written
# by one launch and read by the next as (BT, H) tiles. cS and cMN, the chunk carries of S and
# of (M, N), are what the forward saves for the backward (about 2/BT of w in fp32).
# Padding tokens (the non-causal mask, read as bool) are loaded as zeros and get Pi = 0, hence
# zero out and zero dw, and no part in any statistic. The non-causal sums are totals: every
# carry is the walk over all groups, and nothing is scanned inside a group.
#
# Determinism: every value is one program's sums, in an order fixed by the shapes alone (the
# walks, the chunk loops, the tile scans), and no two programs write one address: the same bits
# on every run, whatever order the programs run in (the tests run them in reverse too).
#
# Memory: when p is a power of two (EVEN_P), a tile's mask is the same along a token's p
# values, so w, g, out and dw move as 16-byte vectors, and the pipelined loads are cp.async
# copies into shared memory (the tests read both in the PTX). Registers: a tile has at most 2K
# values and a program a warp per 256 of them (8 fp32 registers a thread per live tile;
# TritonKernels.plan; B4, which keeps the most tiles live, a warp per 128 and no second stage),
# so that every kernel stays within 128 registers a thread without spilling (tests compile them
# for sm_80 and sm_90).


# which groups a carry walk sums: those before g, after g, or all of them
WALK_PREFIX, WALK_SUFFIX, WALK_TOTAL = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _ids(H, nG):
    """(b, h, bh = b * H + h, g) of this program. A 1-D grid, heads fastest (the programs that
    read one (BT, H) tile of per-token scalars run together), then groups, then batch rows."""
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    g, b = rest % nG, rest // nG
    return b, h, b * H + h, g


@triton.jit
def _n_chunks(g, G, nC):
    """How many chunks group g holds (the last group of a row may hold fewer)."""
    return tl.minimum(G, nC - g * G)


@triton.jit
def _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK: tl.constexpr):
    """(BT,) bool: the tokens t that exist (t < T) and, with a padding mask, are real."""
    keep = t < T
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + b.to(tl.int64) * m_b + t.to(tl.int64) * m_t, mask=t < T, other=0) != 0)
    return keep


@triton.jit
def _tile_offsets(s_b, s_h, s_t, b, h, t, P: tl.constexpr):
    """Offsets of the (BT, P) tile at row b, head h, tokens t of a (B, H, T, p) tensor."""
    return b.to(tl.int64) * s_b + h.to(tl.int64) * s_h + t[:, None].to(tl.int64) * s_t + tl.arange(0, P)[None, :]


@triton.jit
def _tile_mask(keep, p, P: tl.constexpr, EVEN_P: tl.constexpr):
    """(BT, P) or (BT, 1): where a tile is read or written. With EVEN_P (p == P) the mask is
    the same along a token's p values, so that they move as 16-byte vectors."""
    if EVEN_P:
        inside = tl.full((1, P), True, tl.int1)
    else:
        inside = tl.arange(0, P)[None, :] < p
    return keep[:, None] & inside


@triton.jit
def _tile(ptr, s_b, s_h, s_t, b, h, t, keep, p, P: tl.constexpr, EVEN_P: tl.constexpr):
    """The (BT, P) tile at row b, head h, tokens t of a (B, H, T, p) tensor, as fp32; zero
    where keep is False (past T, padding) and past p."""
    offs = _tile_offsets(s_b, s_h, s_t, b, h, t, P)
    return tl.load(ptr + offs, mask=_tile_mask(keep, p, P, EVEN_P), other=0.0).to(tl.float32)


@triton.jit
def _store_tile(ptr, x, s_b, s_h, s_t, b, h, t, T, p, P: tl.constexpr, EVEN_P: tl.constexpr):
    """Store a (BT, P) fp32 tile into a (B, H, T, p) tensor of ptr's dtype."""
    offs = _tile_offsets(s_b, s_h, s_t, b, h, t, P)
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=_tile_mask(t < T, p, P, EVEN_P))


@triton.jit
def _row(ptr, bh, t, T):
    """Tokens t of row bh of a contiguous (B*H, T) fp32 tensor (0 past T)."""
    return tl.load(ptr + bh.to(tl.int64) * T + t, mask=t < T, other=0.0)


@triton.jit
def _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, T, p,
            HAS_MASK: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr):
    """What the backward's streams read at tokens t of row b, head h (bh = b * H + h): the
    tiles (BT, P) of w (zero at padding) and of dL/dout, and Pi (BT,)."""
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P, EVEN_P)
    gt = _tile(g_ptr, g_b, g_h, g_t, b, h, t, t < T, p, P, EVEN_P)
    return x, gt, _row(pi_ptr, bh, t, T)


@triton.jit
def _store_row(ptr, bh, t, T, x):
    tl.store(ptr + bh.to(tl.int64) * T + t, x, mask=t < T)


@triton.jit
def _heads(ptr, b, t, H, T, HP: tl.constexpr):
    """The (BT, HP) tile of every head at tokens t of row b of a (B, H, T) fp32 tensor (0
    past T and past H)."""
    hh = tl.arange(0, HP)
    m = (t[:, None] < T) & (hh[None, :] < H)
    return tl.load(ptr + (b * H + hh[None, :]).to(tl.int64) * T + t[:, None], mask=m, other=0.0)


@triton.jit
def _column(x, h, HP: tl.constexpr):
    """Column h (BT,) of a (BT, HP) register tile."""
    return tl.sum(tl.where(tl.arange(0, HP)[None, :] == h, x, 0.0), axis=1)


@triton.jit
def _slot(row, k, n, W):
    """Offset of entry k's W values in row `row` of a contiguous (rows, n, W) fp32 tensor."""
    return (row.to(tl.int64) * n + k) * W


@triton.jit
def _load_vec(ptr, off, n, P: tl.constexpr):
    """ptr[off : off + n] as a (P,) fp32 vector (0 past n)."""
    i = tl.arange(0, P)
    return tl.load(ptr + off + i, mask=i < n, other=0.0)


@triton.jit
def _store_vec(ptr, off, x, n, P: tl.constexpr):
    i = tl.arange(0, P)
    tl.store(ptr + off + i, x, mask=i < n)


@triton.jit
def _load_pair(ptr, off, p, P: tl.constexpr):
    """An entry of p + 1 values: (its first p as a (P,) vector, its last)."""
    return _load_vec(ptr, off, p, P), tl.load(ptr + off + p)


@triton.jit
def _store_pair(ptr, off, v, s, p, P: tl.constexpr):
    _store_vec(ptr, off, v, p, P)
    tl.store(ptr + off + p, s)


@triton.jit
def _walk(tot_ptr, bh, g, nG, p, MODE: tl.constexpr, PAIR: tl.constexpr, CB: tl.constexpr, P: tl.constexpr):
    """A group's carry: the sums, over the groups before g (PREFIX), after g (SUFFIX) or all
    (TOTAL), of the group totals tot of row bh, (B*H, nG, p + 1) if PAIR else (B*H, nG, p):
    columns [0, p) as a (P,) vector, and column p (0 without PAIR). CB groups a step, in a
    fixed order."""
    W = p + 1 if PAIR else p
    lo = g + 1 if MODE == WALK_SUFFIX else 0
    hi = g if MODE == WALK_PREFIX else nG
    k = tl.arange(0, CB)
    i = tl.arange(0, P)
    vec = tl.zeros((CB, P), dtype=tl.float32)
    col = tl.zeros((CB,), dtype=tl.float32)
    base = tot_ptr + bh.to(tl.int64) * nG * W
    for k0 in range(lo, hi, CB):
        rows = (k0 + k).to(tl.int64) * W
        vec += tl.load(base + rows[:, None] + i[None, :], mask=(k0 + k < hi)[:, None] & (i < p)[None, :], other=0.0)
        if PAIR:
            col += tl.load(base + rows + p, mask=k0 + k < hi, other=0.0)
    return tl.sum(vec, axis=0), tl.sum(col, axis=0)


@triton.jit
def _mn(q, Pt, cMN_ptr, bh, c, nC, p, stat_eps, CAUSAL: tl.constexpr, P: tl.constexpr):
    """M (BT, P) = running sum of Pi w^2 and n (BT, 1) = running sum of Pi + stat_eps, from
    chunk c's carries cMN (B*H, nC, p + 1)."""
    cM, cN = _load_pair(cMN_ptr, _slot(bh, c, nC, p + 1), p, P)
    M = cM[None, :]
    if CAUSAL:
        M = M + tl.cumsum(Pt[:, None] * q, axis=0)
        n = (cN + tl.cumsum(Pt, axis=0))[:, None] + stat_eps
    else:
        n = (cN + tl.zeros_like(Pt))[:, None] + stat_eps
    return M, n


@triton.jit
def _running_sq(q, cS, CAUSAL: tl.constexpr):
    """S (BT, P): the sum of w^2 over tokens <= t (over all tokens if not CAUSAL), from the
    chunk's carry cS (P,)."""
    S = cS[None, :] + tl.zeros_like(q)
    if CAUSAL:
        S = S + tl.cumsum(q, axis=0)
    return S


@triton.jit
def _grad_s(q, Rt, S, sq_floor):
    """A = 1 / max(S, sq_floor) and dL/dS = -R q A^2, none where the floor holds (torch's clamp_min)."""
    A = 1.0 / tl.maximum(S, sq_floor)
    return A, tl.where(S >= sq_floor, -Rt * q * A * A, 0.0)


@triton.jit
def _gm(x, g, Pt, M, n):
    """Per-token dL/dM (BT, P), dL/dN (BT,) and D = 1 / (1 + M/n)."""
    D = n / (n + M)
    gM = g * Pt[:, None] * x * D * D / n
    gN = -tl.sum(gM * M / n, axis=1)
    return gM, gN, D


@triton.jit
def _k_sum_sq(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, tS_ptr, H, T, p, nC, nG, G,
              HAS_MASK: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, NS: tl.constexpr):
    """F1: the group totals of w^2 -> tS (B*H, nG, p)."""
    b, h, bh, g = _ids(H, nG)
    acc = tl.zeros((P,), dtype=tl.float32)
    for k in tl.range(0, _n_chunks(g, G, nC), num_stages=NS):
        t = (g * G + k) * BT + tl.arange(0, BT)
        x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P, EVEN_P)
        acc += tl.sum(x * x, axis=0)
    _store_vec(tS_ptr, _slot(bh, g, nG, p), acc, p, P)


@triton.jit
def _k_u(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, bias_ptr, bias_h, bias_t, tS_ptr, cS_ptr, u_ptr, H, T, p, nC,
         nG, G, sq_floor, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
         P: tl.constexpr, EVEN_P: tl.constexpr, CB: tl.constexpr, NS: tl.constexpr):
    """F2: u = sum_i w^2 / max(S, floor) (+ p * bias) -> u (B*H, T), and the carry of S of
    every chunk -> cS (B*H, nC, p)."""
    b, h, bh, g = _ids(H, nG)
    carry = _walk(tS_ptr, bh, g, nG, p, WALK_PREFIX if CAUSAL else WALK_TOTAL, False, CB, P)[0]
    for k in tl.range(0, _n_chunks(g, G, nC), num_stages=NS):
        c = g * G + k
        t = c * BT + tl.arange(0, BT)
        x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P, EVEN_P)
        q = x * x
        _store_vec(cS_ptr, _slot(bh, c, nC, p), carry, p, P)
        u = tl.sum(q / tl.maximum(_running_sq(q, carry, CAUSAL), sq_floor), axis=1)
        if CAUSAL:
            carry += tl.sum(q, axis=0)
        if HAS_BIAS:
            u += p * tl.load(bias_ptr + h * bias_h + t.to(tl.int64) * bias_t, mask=t < T, other=0.0)
        _store_row(u_ptr, bh, t, T, u)


@triton.jit
def _k_pi(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, temp_ptr, u_ptr, pi_ptr, tMN_ptr, H, T, p, nC, nG, G,
          HAS_MASK: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, HP: tl.constexpr, NS: tl.constexpr):
    """F3: Pi (B*H, T), this head's column of the softmax across heads of temp * u (0 at
    padding tokens), and the group totals of Pi w^2 and Pi -> tMN (B*H, nG, p + 1)."""
    b, h, bh, g = _ids(H, nG)
    hh = tl.arange(0, HP)
    temp = tl.load(temp_ptr + hh, mask=hh < H, other=0.0)
    accM = tl.zeros((P,), dtype=tl.float32)
    accN = tl.zeros((BT,), dtype=tl.float32)
    for k in tl.range(0, _n_chunks(g, G, nC), num_stages=NS):
        t = (g * G + k) * BT + tl.arange(0, BT)
        keep = _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK)
        u = _heads(u_ptr, b, t, H, T, HP)
        logit = tl.where(hh[None, :] < H, temp[None, :] * u, float("-inf"))  # padding heads: no share
        e = tl.exp(logit - tl.max(logit, axis=1)[:, None])
        Pt = tl.where(keep, _column(e, h, HP) / tl.sum(e, axis=1), 0.0)
        _store_row(pi_ptr, bh, t, T, Pt)
        x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, keep, p, P, EVEN_P)
        accM += tl.sum(Pt[:, None] * x * x, axis=0)
        accN += Pt
    _store_pair(tMN_ptr, _slot(bh, g, nG, p + 1), accM, tl.sum(accN, axis=0), p, P)


@triton.jit
def _k_out(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, tMN_ptr, cMN_ptr, out_ptr, o_b, o_h, o_t, H, T, p,
           nC, nG, G, stat_eps, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr,
           CB: tl.constexpr, NS: tl.constexpr):
    """F4: out = -Pi w n / (n + M) (0 where Pi is: padding tokens), and the carries of M, N
    of every chunk -> cMN (B*H, nC, p + 1)."""
    b, h, bh, g = _ids(H, nG)
    cM, cN = _walk(tMN_ptr, bh, g, nG, p, WALK_PREFIX if CAUSAL else WALK_TOTAL, True, CB, P)
    for k in tl.range(0, _n_chunks(g, G, nC), num_stages=NS):
        c = g * G + k
        t = c * BT + tl.arange(0, BT)
        _store_pair(cMN_ptr, _slot(bh, c, nC, p + 1), cM, cN, p, P)
        x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P, EVEN_P)
        Pt = _row(pi_ptr, bh, t, T)
        Mq = Pt[:, None] * x * x
        if CAUSAL:
            M = cM[None, :] + tl.cumsum(Mq, axis=0)
            n = (cN + tl.cumsum(Pt, axis=0))[:, None] + stat_eps
            cM += tl.sum(Mq, axis=0)
            cN += tl.sum(Pt, axis=0)
        else:
            M = cM[None, :] + tl.zeros_like(Mq)
            n = (cN + tl.zeros_like(Pt))[:, None] + stat_eps
        _store_tile(out_ptr, -Pt[:, None] * x * n / (n + M), o_b, o_h, o_t, b, h, t, T, p, P, EVEN_P)


@triton.jit
def _k_sum_gm(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, cMN_ptr, y_ptr, tG_ptr, H,
              T, p, nC, nG, G, stat_eps, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
              P: tl.constexpr, EVEN_P: tl.constexpr, NS: tl.constexpr):
    """B1, the group's chunks last to first: the group totals of dL/dM (columns 0..p-1) and
    dL/dN (column p) -> tG (B*H, nG, p + 1); and the part of dL/dPi that the group's own
    tokens give -> y (B*H, T): with L_M, L_N the sums of dL/dM, dL/dN over the group's
    tokens >= t, -sum_i g w D + sum_i L_M w^2 + L_N (B2 adds the later groups' part)."""
    b, h, bh, g = _ids(H, nG)
    n_here = _n_chunks(g, G, nC)
    LM = tl.zeros((P,), dtype=tl.float32)  # the sums over the group's later chunks
    LN = tl.zeros((BT,), dtype=tl.float32)  # kept per lane, summed once at the end
    for j in tl.range(0, n_here, num_stages=NS):
        c = g * G + n_here - 1 - j
        t = c * BT + tl.arange(0, BT)
        x, gt, Pt = _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, T,
                            p, HAS_MASK, P, EVEN_P)
        q = x * x
        M, n = _mn(q, Pt, cMN_ptr, bh, c, nC, p, stat_eps, CAUSAL, P)
        gM, gN, D = _gm(x, gt, Pt, M, n)
        gpi = -tl.sum(gt * x * D, axis=1)
        if CAUSAL:  # the non-causal sums are totals: nothing inside the group
            later_N = tl.sum(LN, axis=0)
            gpi += tl.sum((LM[None, :] + tl.cumsum(gM, axis=0, reverse=True)) * q, axis=1) + later_N \
                + tl.cumsum(gN, axis=0, reverse=True)
        LM += tl.sum(gM, axis=0)
        LN += gN
        _store_row(y_ptr, bh, t, T, gpi)
    _store_pair(tG_ptr, _slot(bh, g, nG, p + 1), LM, tl.sum(LN, axis=0), p, P)


@triton.jit
def _k_gpi(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, tG_ptr, y_ptr, H, T, p, nC, nG, G,
           HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, CB: tl.constexpr,
           NS: tl.constexpr):
    """B2: dL/dPi = B1's part (in y) + sum_i C_M w^2 + C_N, with C_M, C_N the sums of dL/dM,
    dL/dN over the later groups (over all, non-causal); y = Pi dL/dPi (B*H, T), in place."""
    b, h, bh, g = _ids(H, nG)
    cM, cN = _walk(tG_ptr, bh, g, nG, p, WALK_SUFFIX if CAUSAL else WALK_TOTAL, True, CB, P)
    for k in tl.range(0, _n_chunks(g, G, nC), num_stages=NS):
        t = (g * G + k) * BT + tl.arange(0, BT)
        x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P, EVEN_P)
        gpi = _row(y_ptr, bh, t, T) + tl.sum(cM[None, :] * x * x, axis=1) + cN
        _store_row(y_ptr, bh, t, T, _row(pi_ptr, bh, t, T) * gpi)


@triton.jit
def _k_grad_logit(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, u_ptr, temp_ptr, y_ptr, cS_ptr, R_ptr,
                  gtemp_ptr, tGS_ptr, H, T, p, nC, nG, G, sq_floor, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                  BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, HP: tl.constexpr, NS: tl.constexpr):
    """B3: the softmax backward across heads, dL/dlogit = y - Pi sum_heads y (y = Pi dL/dPi;
    Pi is 0 at padding tokens, so they get none), from a (BT, H) tile of every head's y;
    R = temp dL/dlogit -> R (B*H, T); this program's dtemp partial -> gtemp (B*H, nG); the
    group totals of dL/dS = -R w^2 / max(S, floor)^2 -> tGS (B*H, nG, p)."""
    b, h, bh, g = _ids(H, nG)
    temp = tl.load(temp_ptr + h)
    cS = _load_vec(cS_ptr, _slot(bh, g * G, nC, p), p, P)  # S's carry at the group's first chunk
    acc = tl.zeros((P,), dtype=tl.float32)
    dtemp = tl.zeros((BT,), dtype=tl.float32)
    for k in tl.range(0, _n_chunks(g, G, nC), num_stages=NS):
        t = (g * G + k) * BT + tl.arange(0, BT)
        y = _heads(y_ptr, b, t, H, T, HP)
        gl = _column(y, h, HP) - _row(pi_ptr, bh, t, T) * tl.sum(y, axis=1)
        Rt = temp * gl
        _store_row(R_ptr, bh, t, T, Rt)
        dtemp += gl * _row(u_ptr, bh, t, T)
        x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P, EVEN_P)
        q = x * x
        gS = _grad_s(q, Rt[:, None], _running_sq(q, cS, CAUSAL), sq_floor)[1]
        if CAUSAL:
            cS += tl.sum(q, axis=0)
        acc += tl.sum(gS, axis=0)
    tl.store(gtemp_ptr + bh.to(tl.int64) * nG + g, tl.sum(dtemp, axis=0))
    _store_vec(tGS_ptr, _slot(bh, g, nG, p), acc, p, P)


@triton.jit
def _k_grad_w(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, R_ptr, gtemp_ptr, cS_ptr,
              cMN_ptr, tG_ptr, tGS_ptr, gw_ptr, o_b, o_h, o_t, dtemp_ptr, dbias_ptr, B, H, T, T_bias, p, nC, nG, G,
              sq_floor, stat_eps, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
              BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, CB: tl.constexpr, RB: tl.constexpr, NS: tl.constexpr):
    """B4, the group's chunks last to first: dL/dw = Pi (2 w G_M - D g) + 2 w (R A + G_S) (0 at
    padding: w and Pi are), G_M and G_S the suffix sums of dL/dM and dL/dS: the later groups'
    (walks of tG, tGS), the group's later chunks' (in registers) and the tile's. The programs
    of batch row 0 also reduce over the batch, in a fixed order: dpos_bias (H, T_bias) = p *
    sum_b R, zeros past T (the whole width, so autograd adds nothing), and (group 0) dtemp (H,)
    = the sum of B3's partials."""
    b, h, bh, g = _ids(H, nG)
    cGM = _walk(tG_ptr, bh, g, nG, p, WALK_SUFFIX if CAUSAL else WALK_TOTAL, True, CB, P)[0]
    cGS = _walk(tGS_ptr, bh, g, nG, p, WALK_SUFFIX if CAUSAL else WALK_TOTAL, False, CB, P)[0]
    n_here = _n_chunks(g, G, nC)
    for j in tl.range(0, n_here, num_stages=NS):
        c = g * G + n_here - 1 - j
        t = c * BT + tl.arange(0, BT)
        x, gt, Pt = _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, T,
                            p, HAS_MASK, P, EVEN_P)
        Rt = _row(R_ptr, bh, t, T)[:, None]
        q = x * x
        cM, cN = _load_pair(cMN_ptr, _slot(bh, c, nC, p + 1), p, P)
        cS = _load_vec(cS_ptr, _slot(bh, c, nC, p), p, P)
        if CAUSAL:  # (tl.cumsum: the interpreter runs a scan with a combine function per element)
            M = cM[None, :] + tl.cumsum(Pt[:, None] * q, axis=0)
            S = cS[None, :] + tl.cumsum(q, axis=0)
            n = (cN + tl.cumsum(Pt, axis=0))[:, None] + stat_eps
        else:
            M = cM[None, :] + tl.zeros_like(q)
            S = cS[None, :] + tl.zeros_like(q)
            n = (cN + tl.zeros_like(Pt))[:, None] + stat_eps
        D = n / (n + M)
        gM = gt * Pt[:, None] * x * D * D / n
        A, gS = _grad_s(q, Rt, S, sq_floor)
        if CAUSAL:
            GM = cGM[None, :] + tl.cumsum(gM, axis=0, reverse=True)
            GS = cGS[None, :] + tl.cumsum(gS, axis=0, reverse=True)
            cGM += tl.sum(gM, axis=0)
            cGS += tl.sum(gS, axis=0)
        else:
            GM = cGM[None, :] + tl.zeros_like(gM)
            GS = cGS[None, :] + tl.zeros_like(gS)
        gw = Pt[:, None] * (2.0 * x * GM - D * gt) + 2.0 * x * (Rt * A + GS)
        _store_tile(gw_ptr, gw, o_b, o_h, o_t, b, h, t, T, p, P, EVEN_P)
        if HAS_BIAS and b == 0:
            acc = tl.zeros((BT,), dtype=tl.float32)
            for bb in range(B):
                acc += _row(R_ptr, bb * H + h, t, T)
            tl.store(dbias_ptr + h.to(tl.int64) * T_bias + t, p * acc, mask=t < T)
    if b == 0:
        if HAS_BIAS:  # the position bias past T got no gradient: its zeros, tiles g, g + nG, ...
            for z in range(g, tl.cdiv(T_bias - T, BT), nG):
                tz = T + z * BT + tl.arange(0, BT)
                tl.store(dbias_ptr + h.to(tl.int64) * T_bias + tz, tl.zeros((BT,), dtype=tl.float32), mask=tz < T_bias)
        if g == 0:
            r = tl.arange(0, RB)
            acc_t = tl.zeros((RB,), dtype=tl.float32)
            for bb in range(B):  # the partials of (b, group), in order
                for k0 in range(0, nG, RB):
                    acc_t += tl.load(gtemp_ptr + (bb * H + h).to(tl.int64) * nG + k0 + r, mask=k0 + r < nG, other=0.0)
            tl.store(dtemp_ptr + h, tl.sum(acc_t, axis=0))


@triton.jit
def _k_step(w_ptr, temp_ptr, bias_ptr, bias_stride, ssq_ptr, spsq_ptr, sp_ptr, out_ptr, pi_ptr, H, p,
            sq_floor, stat_eps, HP: tl.constexpr, P: tl.constexpr):
    """One decoding token for one batch row: all heads at once (softmax across heads)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HP)
    i = tl.arange(0, P)
    m = (h[:, None] < H) & (i[None, :] < p)
    offs = b * H * p + h[:, None] * p + i[None, :]
    x = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    q = x * x
    S = tl.load(ssq_ptr + offs, mask=m, other=0.0) + q
    tl.store(ssq_ptr + offs, S, mask=m)
    temp = tl.load(temp_ptr + h, mask=h < H, other=0.0)
    bias = tl.load(bias_ptr + h * bias_stride, mask=h < H, other=0.0)
    logit = temp * (tl.sum(q / tl.maximum(S, sq_floor), axis=1) + p * bias)
    logit = tl.where(h < H, logit, float("-inf"))
    e = tl.exp(logit - tl.max(logit, axis=0))
    Pt = e / tl.sum(e, axis=0)
    N = tl.load(sp_ptr + b * H + h, mask=h < H, other=0.0) + Pt
    tl.store(sp_ptr + b * H + h, N, mask=h < H)
    M = tl.load(spsq_ptr + offs, mask=m, other=0.0) + Pt[:, None] * q
    tl.store(spsq_ptr + offs, M, mask=m)
    n = N[:, None] + stat_eps
    tl.store(out_ptr + offs, (-Pt[:, None] * x * n / (n + M)).to(out_ptr.dtype.element_ty), mask=m)
    tl.store(pi_ptr + b * H + h, Pt, mask=h < H)


# -----------------------------------------------------------------------------
# The launches

FORWARD = ("_k_sum_sq", "_k_u", "_k_pi", "_k_out")
BACKWARD = ("_k_sum_gm", "_k_gpi", "_k_grad_logit", "_k_grad_w")


def on_device(t):
    """Launch on t's GPU (Triton launches on the current CUDA device: a tensor on cuda:1 while
    cuda:0 is current would be an illegal address); nothing to do elsewhere."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _warps(values):
    """Warps for a tile of `values` elements: one per 256 (8 a thread), 1 to 16."""
    return min(16, max(1, values // 256))


def _mask_args(mask, stand_in):
    """The padding mask (B, T) bool as (pointer, strides), read as is; or an unread stand-in."""
    return (mask, mask.stride(0), mask.stride(1)) if mask is not None else (stand_in, 0, 0)


def tile_meta(p):
    """Chunk height BT (tokens) and padded head width P for head width p: a (BT, P) tile of
    at most 2K values (more chunks when p is large)."""
    P = triton.next_power_of_2(p)
    return dict(BT=max(16, min(BLOCK_T, 2048 // P)), P=P, EVEN_P=P == p)


def geometry(T, p):
    """How a row of T tokens is cut: chunks of BT tokens (nC of them), groups of G chunks (nG
    of them, the programs per batch row and head). At least GROUP_CHUNKS chunks a program, so
    each streams several tiles; at most MAX_GROUPS groups a row, so a carry walk stays short."""
    meta = tile_meta(p)
    nC = triton.cdiv(max(T, 1), meta["BT"])
    G = max(GROUP_CHUNKS, triton.cdiv(nC, MAX_GROUPS))
    return dict(meta, nC=nC, G=G, nG=triton.cdiv(nC, G))


# What each launch moves: the tensors it reads and writes (their sizes in launch_plan), and
# what its programs read again, from L2: the other heads' columns of a (BT, H) tile of
# per-token scalars (heads are adjacent in the grid, so one program's miss serves the rest),
# the group totals a carry walk sums, and the padding mask / position bias that every head
# (every batch row) reads for the same tokens.
TRAFFIC = {
    "_k_sum_sq": dict(read=("w", "mask"), write=("tS",), again=("mask_heads",)),
    "_k_u": dict(read=("w", "mask", "bias", "tS"), write=("cS", "u"), again=("mask_heads", "bias_rows", "walk_tS")),
    "_k_pi": dict(read=("w", "mask", "u"), write=("pi", "tMN"), again=("mask_heads", "u_heads")),
    "_k_out": dict(read=("w", "mask", "pi", "tMN"), write=("out", "cMN"), again=("mask_heads", "walk_tMN")),
    "_k_sum_gm": dict(read=("w", "g", "mask", "pi", "cMN"), write=("y", "tG"), again=("mask_heads",)),
    "_k_gpi": dict(read=("w", "mask", "pi", "y", "tG"), write=("y",), again=("mask_heads", "walk_tG")),
    "_k_grad_logit": dict(read=("w", "mask", "y", "pi", "u", "cS_first"), write=("R", "gtemp", "tGS"),
                          again=("mask_heads", "y_heads")),
    "_k_grad_w": dict(read=("w", "g", "mask", "pi", "R", "cS", "cMN", "tG", "tGS", "gtemp"),
                      write=("dw", "dtemp", "dbias"), again=("mask_heads", "walk_tG", "walk_tGS", "R_batch")),
}


def _walked(nG, causal):
    """Group totals that all the carry walks of one row read together: each group's earlier
    (or later) groups, or every group (non-causal)."""
    return nG * (nG - 1) // 2 if causal else nG * nG


def launch_plan(B, H, T, p, dtype=torch.bfloat16, causal=True, has_mask=False, bias_width=None):
    """The launches of one forward and backward, in order, as TritonKernels runs them: for
    each, its kernel, grid (programs), and the bytes it reads and writes in HBM (each tensor
    once) and reads again from L2 (TRAFFIC). bias_width: the position bias's columns (T)."""
    geo = geometry(T, p)
    nC, nG, rows = geo["nC"], geo["nG"], B * H
    f32, walked = 4, _walked(geo["nG"], causal)
    scalar = rows * T * f32  # u, Pi, y, R: one fp32 a token and head
    sizes = dict(
        w=rows * T * p * torch.empty((), dtype=dtype).element_size(),  # w, g, out, dw
        mask=B * T if has_mask else 0, bias=H * T * f32 if causal else 0,
        u=scalar, pi=scalar, y=scalar, R=scalar,
        tS=rows * nG * p * f32, tGS=rows * nG * p * f32, tMN=rows * nG * (p + 1) * f32, tG=rows * nG * (p + 1) * f32,
        cS=rows * nC * p * f32, cMN=rows * nC * (p + 1) * f32, cS_first=rows * nG * p * f32,
        gtemp=rows * nG * f32, dtemp=H * f32, dbias=H * (bias_width or T) * f32 if causal else 0,
        mask_heads=(H - 1) * B * T if has_mask else 0, bias_rows=(B - 1) * H * T * f32 if causal else 0,
        u_heads=(H - 1) * scalar, y_heads=(H - 1) * scalar, R_batch=(B - 1) * H * T * f32 if causal else 0,
        walk_tS=rows * walked * p * f32, walk_tGS=rows * walked * p * f32,
        walk_tMN=rows * walked * (p + 1) * f32, walk_tG=rows * walked * (p + 1) * f32)
    sizes.update(g=sizes["w"], out=sizes["w"], dw=sizes["w"])
    plan = []
    for name in FORWARD + BACKWARD:
        t = TRAFFIC[name]
        plan.append(dict(kernel=name, direction="forward" if name in FORWARD else "backward", grid=rows * nG,
                         read=sum(sizes[k] for k in t["read"]), write=sum(sizes[k] for k in t["write"]),
                         l2_read=sum(sizes[k] for k in t["again"])))
    return plan


def modelled_time_s(plan, bytes_per_s=0.8 * 3.35e12, launch_s=3e-6):
    """The time of a plan's launches (or one launch's) on a bandwidth model: HBM bytes at
    bytes_per_s (default 80% of an H100's 3.35 TB/s) plus launch_s a launch; L2 reads free."""
    plan = [plan] if isinstance(plan, dict) else plan
    return sum((launch["read"] + launch["write"]) / bytes_per_s + launch_s for launch in plan)


class TritonKernels:
    """The four-launch forward and backward above (out, Pi, u, saved chunk carries), and the
    decoding step, for kernels/fused.py's FusedTSSA. eps = (sq_floor, stat_eps), as model.py
    defines them. raw_inputs: forward and backward take w unmasked with the bool padding mask
    and the whole position bias (H, T_max), and give its whole gradient: nothing for PyTorch
    to do around the launches."""

    name = "triton"
    raw_inputs = True

    @staticmethod
    def load():  # importing this file imported Triton: nothing more to build before a launch
        pass

    @staticmethod
    def unsupported(w):
        """Why these kernels cannot run w, or None."""
        if w.device.type == "cuda" or INTERPRET:
            return None
        return (f"the Triton kernels take CUDA tensors, got a {w.device.type} tensor "
                "(TRITON_INTERPRET=1 runs them on the CPU)")

    @staticmethod
    def prepare(w):  # any float dtype is read as is; unit stride along p
        return w if w.stride(-1) == 1 else w.contiguous()

    @staticmethod
    def plan(p, H, causal, has_mask):
        """{kernel: its constexprs and num_warps} for every launch of the operator: forward,
        backward and the decoding step (the compile test builds exactly these). A warp per
        256 values of a tile, i.e. 8 fp32 registers a thread per live tile: the heaviest
        kernels keep ~10 tiles live and must stay within 128 registers, unspilled. Not tuned
        on a GPU."""
        meta = tile_meta(p)
        HP = triton.next_power_of_2(H)
        tile = dict(HAS_MASK=has_mask, **meta, NS=NUM_STAGES, num_warps=_warps(meta["BT"] * meta["P"]))
        scan = dict(tile, CAUSAL=causal)
        walk = dict(scan, CB=CARRY_GROUPS)
        # dL/dw keeps the most tiles live: twice the warps (half the registers a thread) and
        # no second stage, so that it stays within 128 registers unspilled
        heavy = dict(walk, HAS_BIAS=causal, RB=64, NS=1, num_warps=min(16, 2 * tile["num_warps"]))
        return dict(_k_sum_sq=tile, _k_u=dict(walk, HAS_BIAS=causal), _k_pi=dict(tile, HP=HP), _k_out=walk,
                    _k_sum_gm=scan, _k_gpi=walk, _k_grad_logit=dict(scan, HP=HP), _k_grad_w=heavy,
                    _k_step=dict(HP=HP, P=meta["P"], num_warps=_warps(HP * meta["P"])))

    @staticmethod
    def shapes(w, causal):
        """Shapes of what forward returns besides out: pi and u (B, H, T), and the chunk
        carries cS (B*H, nC, p) and cMN (B*H, nC, p + 1) (kernels/triton_ops.py's fake forward too)."""
        B, H, T, p = w.shape
        nC = geometry(T, p)["nC"]
        return (B, H, T), (B * H, nC, p), (B * H, nC, p + 1)

    @classmethod
    def forward(cls, w, temp, bias, mask, causal, eps):
        """out (w's dtype and strides), Pi and u (B, H, T) fp32, and the carries to save.
        bias: the whole position bias (H, T_max), given exactly for the causal form; mask:
        (B, T) bool or None."""
        if (bias is not None) != causal:
            raise ValueError("the Triton kernels take a position bias for the causal form, and only for it")
        wk, temp = cls.prepare(w), temp.float().contiguous()
        B, H, T, p = wk.shape
        plan, geo = cls.plan(p, H, causal, mask is not None), geometry(T, p)
        nC, nG, G = geo["nC"], geo["nG"], geo["G"]
        f32 = dict(device=wk.device, dtype=torch.float32)
        rows, cS_shape, cMN_shape = cls.shapes(wk, causal)
        u, pi, cS, cMN = (torch.empty(s, **f32) for s in (rows, rows, cS_shape, cMN_shape))
        tS, tMN = torch.empty(B * H, nG, p, **f32), torch.empty(B * H, nG, p + 1, **f32)
        out = torch.empty_like(wk, dtype=w.dtype)  # w's strides: merging the heads after is a view
        sw, masks, grid = wk.stride()[:3], _mask_args(mask, u), (B * H * nG,)
        bias_args = (bias, bias.stride(0), bias.stride(1)) if bias is not None else (u, 0, 0)  # u: unread
        sizes = (H, T, p, nC, nG, G)
        with on_device(wk):
            _k_sum_sq[grid](wk, *sw, *masks, tS, *sizes, **plan["_k_sum_sq"])
            _k_u[grid](wk, *sw, *masks, *bias_args, tS, cS, u, *sizes, eps[0], **plan["_k_u"])
            _k_pi[grid](wk, *sw, *masks, temp, u, pi, tMN, *sizes, **plan["_k_pi"])
            _k_out[grid](wk, *sw, *masks, pi, tMN, cMN, out, *out.stride()[:3], *sizes, eps[1], **plan["_k_out"])
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps, bias_width=0):
        """dw (w's dtype and strides), dtemp (H,) and, causal, dpos_bias (H, bias_width) fp32:
        the gradient of the whole position bias (zeros past T)."""
        cS, cMN = saved
        wk, g, temp = cls.prepare(w), cls.prepare(g), temp.float().contiguous()
        B, H, T, p = wk.shape
        plan, geo = cls.plan(p, H, causal, mask is not None), geometry(T, p)
        nC, nG, G = geo["nC"], geo["nG"], geo["G"]
        f32 = dict(device=wk.device, dtype=torch.float32)
        y, R, gtemp = torch.empty(B, H, T, **f32), torch.empty(B, H, T, **f32), torch.empty(B * H, nG, **f32)
        tG, tGS, dtemp = torch.empty(B * H, nG, p + 1, **f32), torch.empty(B * H, nG, p, **f32), torch.empty(H, **f32)
        dbias = torch.empty(H, bias_width, **f32) if causal else None
        gw = torch.empty_like(wk, dtype=w.dtype)
        sw, sg, masks, grid = wk.stride()[:3], g.stride()[:3], _mask_args(mask, R), (B * H * nG,)
        sizes = (H, T, p, nC, nG, G)
        with on_device(wk):
            _k_sum_gm[grid](wk, *sw, g, *sg, *masks, pi, cMN, y, tG, *sizes, eps[1], **plan["_k_sum_gm"])
            _k_gpi[grid](wk, *sw, *masks, pi, tG, y, *sizes, **plan["_k_gpi"])
            _k_grad_logit[grid](wk, *sw, *masks, pi, u, temp, y, cS, R, gtemp, tGS, *sizes, eps[0],
                                **plan["_k_grad_logit"])
            _k_grad_w[grid](wk, *sw, g, *sg, *masks, pi, R, gtemp, cS, cMN, tG, tGS, gw, *gw.stride()[:3], dtemp,
                            R if dbias is None else dbias, B, H, T, bias_width, p, nC, nG, G, *eps,
                            **plan["_k_grad_w"])
        return gw, dtemp, dbias

    @classmethod
    def step(cls, w_t, temp, bias, state, eps):
        B, H, p = w_t.shape
        x = w_t.contiguous()
        out = torch.empty_like(x)
        pi = torch.empty(B, H, device=x.device, dtype=torch.float32)
        bias = bias.float()
        with on_device(x):
            _k_step[(B,)](x, temp.float().contiguous(), bias, bias.stride(0), state.sum_sq, state.sum_pi_sq,
                          state.sum_pi, out, pi, H, p, *eps, **cls.plan(p, H, True, False)["_k_step"])
        return out, pi
