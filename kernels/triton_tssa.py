"""
Triton kernels of TSSA (CUDA; TRITON_INTERPRET=1 runs them on the CPU, slowly: that is how the
tests run them). Imported only when tssa_impl="triton" asks for them; kernels/fused.py falls
back to model.py's reference, with a warning, when Triton is missing or a launch fails.

Three launches each way and no PyTorch compute around them: TritonKernels.forward and
.backward only allocate (torch.empty) and launch; the padding mask, the carries of the running
sums and the sums over the batch (dtemp, dpos_bias) are all done inside the kernels.

    python -m pytest -q tests/test_kernels.py -k triton   # under the interpreter, in a subprocess
"""

import contextlib
import os

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # tokens per chunk, at most (tile height; fewer when p is large)
SCAN_CHUNKS = 32  # chunk totals a scan takes per step, at most (tests lower it to cross steps)
# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this file is imported
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# -----------------------------------------------------------------------------
# The chunked kernels
#
# Tokens are cut into chunks of BT. Every kernel works on (BT, P) tiles of w (P = p rounded up
# to a power of two, masked). A running sum over tokens is (scan inside the tile) + (carry:
# the sum of the earlier chunks' totals, of the later ones in the backward, or the total for
# the non-causal form). The carries come from chunk totals that an earlier launch wrote.
#
#   forward : K1 chunk totals of w^2                                   -> carries of S
#             K2 all heads of a chunk: u, the logits of every head in a (BT, HP) register
#                tile (one walk over the heads), Pi = its softmax across heads (a row
#                operation), chunk totals of Pi w^2 and Pi                -> carries of M, N
#             K3 out
#   backward: B1 chunk totals of dL/dM, dL/dN                          -> carries of G_M, G_N
#                and the in-chunk part of dL/dPi (B1 has the in-chunk suffix sums at hand)
#             B2 all heads of a chunk: dL/dPi = B1's part + the carries' part, in a (BT, HP)
#                register tile; the softmax backward across heads (a row operation);
#                R = temp dL/dlogit, dtemp partials, chunk totals of dL/dS  -> carries of G_S
#             B3 dL/dw; the programs of batch row 0 also sum dtemp and dpos_bias over the batch
# K1, K3, B1, B3 run one program per (batch row b, head h, chunk); K2 and B2 one per (b, chunk)
# walking the heads, because the softmax couples them. Statistics in fp32; w, out, g, dw in
# their own dtype. Padding tokens (the non-causal mask, read as bool) are loaded as zeros and
# get Pi = 0, hence zero out and zero dw, and no part in any statistic.
#
# The scan inside the producer. Each program of K1, K2, B1, B2 writes its chunk totals, then
# takes a ticket from its row's counter; the program that draws the last ticket (n - 1 of n)
# puts the counter back to 0 and turns the row's totals into carries, in place, reading the
# chunks in a FIXED order (0, 1, ..., or n-1, ..., 0 for a suffix). Which program that is
# depends on scheduling; what it computes does not: the totals are each program's own
# deterministic sums and the scan's order is fixed, so the results are bitwise the same from
# run to run (the tests run the programs in reverse order too). The counters are one int32
# per row in a buffer zeroed once per device (_counters), at zero again after every launch:
# no memset per call. Launches that share the counters must not overlap, i.e. they run on one
# stream, as every launch of a training step does.
#
# Why the last program sees every total (the memory-ordering argument; PTX's model):
#  1. a program stores its totals (many threads), then tl.debug_barrier() (bar.sync): the
#     stores are performed with respect to the whole program before the next instruction;
#  2. one thread then adds 1 to the counter, an atomic with acq_rel semantics at gpu scope:
#     its release half makes everything ordered before it (1., cumulative through the
#     barrier) visible at gpu scope before the new count is;
#  3. the program that reads n - 1 reads the end of the chain of every other program's
#     read-modify-writes of that counter (C++'s release sequence), so its acquire half
#     synchronizes with each of their releases: all n programs' totals happen before it;
#  4. after a second barrier (the rest of the program ordered after the acquiring thread) it
#     reads the totals with cache_modifier=".cg" (L2, the point of coherence: no stale L1).
# The reset is a plain store: every program of the launch has taken its ticket by then, and
# the next launch on the stream starts after this one ends. The carries it writes are read
# only by later launches. This is the pattern of CUDA's threadFenceReduction sample and of
# split-K semaphores. The interpreter runs programs one after the other, so only a GPU
# exercises the ordering (python -m kernels.gpu_check determinism).
#
# Registers: a tile has at most 2K values and a program a warp per 256 of them (8 fp32
# registers a thread per live tile; TritonKernels.plan), so that every kernel stays within
# 128 registers a thread without spilling (tests compile them for sm_80 and sm_90).


# what a scan makes of the chunk totals: the sums of the earlier chunks, of the later ones, of all
SCAN_PREFIX, SCAN_SUFFIX, SCAN_TOTAL = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _pids(BH):
    """(row b * H + h, chunk) of this program. A 1-D grid, rows fastest: CUDA caps the 2nd
    and 3rd grid dimensions at 65535, which a 2-D (B * H, nC) grid passes at T = 4M."""
    pid = tl.program_id(0)
    return pid % BH, pid // BH


@triton.jit
def _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK: tl.constexpr):
    """(BT,) bool: the tokens t that exist (t < T) and, with a padding mask, are real."""
    keep = t < T
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + b.to(tl.int64) * m_b + t.to(tl.int64) * m_t, mask=t < T, other=0) != 0)
    return keep


@triton.jit
def _tile_offsets(s_b, s_h, s_t, bh, H, t, P: tl.constexpr):
    """Offsets of the (BT, P) tile at row b, head h (bh = b * H + h), tokens t of a (B, H, T, p) tensor."""
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    return b * s_b + h * s_h + t[:, None].to(tl.int64) * s_t + tl.arange(0, P)[None, :]


@triton.jit
def _tile(ptr, s_b, s_h, s_t, bh, H, t, keep, p, P: tl.constexpr):
    """The (BT, P) tile at row b, head h (bh = b * H + h), tokens t of a (B, H, T, p) tensor,
    as fp32; zero where keep is False (past T, padding) and past p."""
    i = tl.arange(0, P)
    offs = _tile_offsets(s_b, s_h, s_t, bh, H, t, P)
    return tl.load(ptr + offs, mask=keep[:, None] & (i[None, :] < p), other=0.0).to(tl.float32)


@triton.jit
def _store_tile(ptr, x, s_b, s_h, s_t, bh, H, t, T, p, P: tl.constexpr):
    """Store a (BT, P) fp32 tile into a (B, H, T, p) tensor of ptr's dtype."""
    i = tl.arange(0, P)
    offs = _tile_offsets(s_b, s_h, s_t, bh, H, t, P)
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=(t[:, None] < T) & (i[None, :] < p))


@triton.jit
def _row(ptr, bh, t, T):
    """Tokens t of row bh of a contiguous (B*H, T) fp32 tensor (0 past T)."""
    return tl.load(ptr + bh.to(tl.int64) * T + t, mask=t < T, other=0.0)


@triton.jit
def _heads_offsets(b, t, H, T, HP: tl.constexpr):
    """Offsets and mask of the (BT, HP) tile of every head at tokens t of a (B, H, T) tensor."""
    hh = tl.arange(0, HP)
    offs = (b * H + hh[None, :]).to(tl.int64) * T + t[:, None]
    return offs, (t[:, None] < T) & (hh[None, :] < H)


@triton.jit
def _column(x, h, HP: tl.constexpr):
    """Column h (BT,) of a (BT, HP) register tile."""
    return tl.sum(tl.where(tl.arange(0, HP)[None, :] == h, x, 0.0), axis=1)


@triton.jit
def _vec(ptr, off, n, P: tl.constexpr):
    """ptr[off : off + n] as a (P,) fp32 vector (0 past n)."""
    i = tl.arange(0, P)
    return tl.load(ptr + off + i, mask=i < n, other=0.0)


@triton.jit
def _store_vec(ptr, off, x, n, P: tl.constexpr):
    i = tl.arange(0, P)
    tl.store(ptr + off + i, x, mask=i < n)


@triton.jit
def _slot(row, c, nC, W):
    """Offset of chunk c's W values in row `row` of a contiguous (rows, nC, W) fp32 tensor."""
    return (row.to(tl.int64) * nC + c) * W


@triton.jit
def _last_to_arrive(count_ptr, row, n):
    """Take a ticket from counter `row`: True in the one program of the n that takes the last
    (see the memory-ordering argument above), which also puts the counter back to 0 (every
    program of the row has taken its ticket by then)."""
    tl.debug_barrier()  # every store of this program before the release
    last = tl.atomic_add(count_ptr + row, 1, sem="acq_rel", scope="gpu") == n - 1
    tl.store(count_ptr + row, 0, mask=last)
    tl.debug_barrier()  # the whole program after the acquire
    return last


@triton.jit
def _scan_chunks(ptr, row, nC, W, MODE: tl.constexpr, CB: tl.constexpr, WB: tl.constexpr):
    """Turn row `row` of the chunk totals (rows, nC, W) into carries, in place: PREFIX, the
    sum of the earlier chunks; SUFFIX, of the later ones; TOTAL, the sum of all chunks, into
    chunk 0's slot (the only one the non-causal kernels read). Chunks are taken CB at a time
    in a fixed order, columns WB at a time."""
    base = ptr + row.to(tl.int64) * nC * W
    a = tl.arange(0, CB)
    for j0 in range(0, W, WB):
        j = j0 + tl.arange(0, WB)
        run = tl.zeros((WB,), dtype=tl.float32)  # the sum of the chunks walked so far
        for k in range(0, nC, CB):
            cc = (nC - 1 - k - a) if MODE == SCAN_SUFFIX else (k + a)  # the suffix walks backwards
            m = (cc[:, None] >= 0) & (cc[:, None] < nC) & (j[None, :] < W)
            offs = cc[:, None].to(tl.int64) * W + j[None, :]
            x = tl.load(base + offs, mask=m, other=0.0, cache_modifier=".cg")
            if MODE != SCAN_TOTAL:
                # exclusive scan = scan of the totals shifted by one chunk (not inclusive - own
                # total, which loses the small carries after a large chunk total); the shifted
                # totals of this block are read before any of its slots is overwritten
                step = -1 if MODE == SCAN_SUFFIX else 1
                before = tl.load(base + offs - step * W, mask=m & (a[:, None] > 0), other=0.0, cache_modifier=".cg")
                tl.debug_barrier()
                tl.store(base + offs, run[None, :] + tl.cumsum(before, axis=0), mask=m)
            run += tl.sum(x, axis=0)
        if MODE == SCAN_TOTAL:
            tl.store(base + j, run, mask=j < W)


@triton.jit
def _scan_if_last(count_ptr, ptr, row, nC, W, MODE: tl.constexpr, CB: tl.constexpr, WB: tl.constexpr):
    """The last of a row's nC programs turns the row's chunk totals into carries."""
    if _last_to_arrive(count_ptr, row, nC):
        _scan_chunks(ptr, row, nC, W, MODE, CB, WB)


@triton.jit
def _running_sq(q, cS_ptr, bh, c, nC, p, CAUSAL: tl.constexpr, P: tl.constexpr):
    """S (BT, P): the sum of w^2 over tokens <= t (over all tokens if not CAUSAL)."""
    S = _vec(cS_ptr, _slot(bh, c if CAUSAL else 0, nC, p), p, P)[None, :]
    if CAUSAL:
        S = S + tl.cumsum(q, axis=0)
    return S


@triton.jit
def _mn(q, Pt, cMN_ptr, b, h, c, H, nC, p, stat_eps, CAUSAL: tl.constexpr, P: tl.constexpr):
    """M (BT, P) = running sum of Pi w^2 and n (BT, 1) = running sum of Pi + stat_eps. The
    carries: (B, nC, H, p + 1), dL/dM's p columns then dL/dN's one, per head."""
    off = (_slot(b, c if CAUSAL else 0, nC, H) + h) * (p + 1)
    M = _vec(cMN_ptr, off, p, P)[None, :]
    N = tl.load(cMN_ptr + off + p)
    if CAUSAL:
        M = M + tl.cumsum(Pt[:, None] * q, axis=0)
        n = (N + tl.cumsum(Pt, axis=0))[:, None] + stat_eps
    else:
        n = (N + tl.zeros_like(Pt))[:, None] + stat_eps
    return M, n


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
def _suffix_gm(x, g, Pt, M, n, cGMN_ptr, bh, c, nC, p, CAUSAL: tl.constexpr, P: tl.constexpr):
    """Suffix sums G_M (BT, P), G_N (BT,) of dL/dM, dL/dN over tokens >= t, and D."""
    gM, gN, D = _gm(x, g, Pt, M, n)
    off = _slot(bh, c if CAUSAL else 0, nC, p + 1)
    GM = _vec(cGMN_ptr, off, p, P)[None, :]
    GN = tl.load(cGMN_ptr + off + p) + tl.zeros_like(gN)
    if CAUSAL:
        GM = GM + tl.cumsum(gM, axis=0, reverse=True)
        GN = GN + tl.cumsum(gN, axis=0, reverse=True)
    return GM, GN, D


@triton.jit
def _k_sum_sq(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, cS_ptr, count_ptr, H, T, p, nC, BH,
              HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr,
              CB: tl.constexpr, WB: tl.constexpr):
    """K1, per (b, h, chunk): chunk totals of w^2 -> cS (B*H, nC, p); the last program of
    each (b, h) turns them into the carries of S."""
    bh, c = _pids(BH)
    b, h = bh // H, bh % H
    t = c * BT + tl.arange(0, BT)
    x = _tile(w_ptr, s_b, s_h, s_t, bh, H, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P)
    _store_vec(cS_ptr, _slot(bh, c, nC, p), tl.sum(x * x, axis=0), p, P)
    _scan_if_last(count_ptr, cS_ptr, bh, nC, p, SCAN_PREFIX if CAUSAL else SCAN_TOTAL, CB, WB)


@triton.jit
def _k_pi(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, temp_ptr, bias_ptr, bias_h, bias_t, cS_ptr, u_ptr, pi_ptr,
          cMN_ptr, count_ptr, B, H, T, p, nC, sq_floor, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
          CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, HP: tl.constexpr, CB: tl.constexpr,
          WB: tl.constexpr):
    """K2, per (b, chunk), every head: u and Pi (B, H, T), and the chunk totals of Pi w^2
    and Pi -> cMN (B, nC, H, p + 1); the last program of each b turns them into carries."""
    pid = tl.program_id(0)
    b, c = pid % B, pid // B
    t = c * BT + tl.arange(0, BT)
    hh = tl.arange(0, HP)
    # the logits of every head of the tile, one walk over the heads; padding heads stay at
    # -inf, so they take no share of the softmax
    logit = tl.full((BT, HP), float("-inf"), dtype=tl.float32)
    for h in range(H):
        x = _tile(w_ptr, s_b, s_h, s_t, b * H + h, H, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P)
        q = x * x
        u = tl.sum(q / tl.maximum(_running_sq(q, cS_ptr, b * H + h, c, nC, p, CAUSAL, P), sq_floor), axis=1)
        if HAS_BIAS:
            u += p * tl.load(bias_ptr + h * bias_h + t.to(tl.int64) * bias_t, mask=t < T, other=0.0)
        tl.store(u_ptr + (b * H + h).to(tl.int64) * T + t, u, mask=t < T)
        logit = tl.where(hh[None, :] == h, (tl.load(temp_ptr + h) * u)[:, None], logit)
    # Pi: the softmax across heads, a row operation on the register tile; 0 for padding tokens
    e = tl.exp(logit - tl.max(logit, axis=1)[:, None])
    keep = _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK)  # read again here: not live across the loop
    pi = tl.where(keep[:, None], e / tl.sum(e, axis=1)[:, None], 0.0)  # (BT, HP)
    offs, m = _heads_offsets(b, t, H, T, HP)
    tl.store(pi_ptr + offs, pi, mask=m)
    # the chunk totals: of Pi (every head at once), then of Pi w^2 (a second load of each tile)
    row = _slot(b, c, nC, H) * (p + 1)
    tl.store(cMN_ptr + row + hh * (p + 1) + p, tl.sum(pi, axis=0), mask=hh < H)
    for h in range(H):
        x = _tile(w_ptr, s_b, s_h, s_t, b * H + h, H, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P)
        _store_vec(cMN_ptr, row + h * (p + 1), tl.sum(_column(pi, h, HP)[:, None] * x * x, axis=0), p, P)
    _scan_if_last(count_ptr, cMN_ptr, b, nC, H * (p + 1), SCAN_PREFIX if CAUSAL else SCAN_TOTAL, CB, WB)


@triton.jit
def _k_out(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, cMN_ptr, out_ptr, o_b, o_h, o_t, H, T, p, nC, BH,
           stat_eps, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """K3, per (b, h, chunk): out = -Pi w n / (n + M) (0 where Pi is: padding tokens)."""
    bh, c = _pids(BH)
    b, h = bh // H, bh % H
    t = c * BT + tl.arange(0, BT)
    x = _tile(w_ptr, s_b, s_h, s_t, bh, H, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P)
    Pt = _row(pi_ptr, bh, t, T)
    M, n = _mn(x * x, Pt, cMN_ptr, b, h, c, H, nC, p, stat_eps, CAUSAL, P)
    _store_tile(out_ptr, -Pt[:, None] * x * n / (n + M), o_b, o_h, o_t, bh, H, t, T, p, P)


@triton.jit
def _k_sum_gm(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, cMN_ptr, gpi_ptr, cGMN_ptr,
              count_ptr, H, T, p, nC, BH, stat_eps, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
              BT: tl.constexpr, P: tl.constexpr, CB: tl.constexpr, WB: tl.constexpr):
    """B1, per (b, h, chunk): chunk totals of dL/dM (columns 0..p-1) and dL/dN (column p) ->
    cGMN (B*H, nC, p + 1), the last program of each (b, h) turning them into suffix carries;
    and the in-chunk part of dL/dPi -> gpi (B, H, T): with L_M, L_N the suffix sums of dL/dM,
    dL/dN inside the chunk (G_M = carry + L_M), dL/dPi = gpi + sum_i carry_M q + carry_N,
    which B2 completes once the carries exist."""
    bh, c = _pids(BH)
    b = bh // H
    t = c * BT + tl.arange(0, BT)
    x = _tile(w_ptr, s_b, s_h, s_t, bh, H, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P)
    g = _tile(g_ptr, g_b, g_h, g_t, bh, H, t, t < T, p, P)
    Pt = _row(pi_ptr, bh, t, T)
    q = x * x
    M, n = _mn(q, Pt, cMN_ptr, b, bh % H, c, H, nC, p, stat_eps, CAUSAL, P)
    gM, gN, D = _gm(x, g, Pt, M, n)
    gpi = -tl.sum(g * x * D, axis=1)
    off = _slot(bh, c, nC, p + 1)
    _store_vec(cGMN_ptr, off, tl.sum(gM, axis=0), p, P)
    tl.store(cGMN_ptr + off + p, tl.sum(gN, axis=0))
    if CAUSAL:  # the non-causal sums are totals: nothing inside the chunk
        gpi += tl.sum(tl.cumsum(gM, axis=0, reverse=True) * q, axis=1) + tl.cumsum(gN, axis=0, reverse=True)
    tl.store(gpi_ptr + bh.to(tl.int64) * T + t, gpi, mask=t < T)
    _scan_if_last(count_ptr, cGMN_ptr, bh, nC, p + 1, SCAN_SUFFIX if CAUSAL else SCAN_TOTAL, CB, WB)


@triton.jit
def _k_grad_logit(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, u_ptr, temp_ptr, cS_ptr, cGMN_ptr, R_ptr,
                  gtemp_ptr, cGS_ptr, count_ptr, B, H, T, p, nC, sq_floor, HAS_MASK: tl.constexpr,
                  CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, HP: tl.constexpr, CB: tl.constexpr,
                  WB: tl.constexpr):
    """B2, per (b, chunk), every head: dL/dPi (B1's in-chunk part, found in R, plus the
    carries'), the softmax backward across heads, R = temp * dL/dlogit (B, H, T, in place),
    this program's dtemp partials -> gtemp (B, nC, H), and the chunk totals of dL/dS -> cGS
    (B, nC, H, p); the last program of each b turns them into carries."""
    pid = tl.program_id(0)
    b, c = pid % B, pid // B
    t = c * BT + tl.arange(0, BT)
    keep = _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK)
    hh = tl.arange(0, HP)
    offs, m = _heads_offsets(b, t, H, T, HP)
    # dL/dPi of every head of the tile, kept in registers: + sum_i carry_M q + carry_N per head
    gpi = tl.load(R_ptr + offs, mask=m, other=0.0)
    for h in range(H):
        x = _tile(w_ptr, s_b, s_h, s_t, b * H + h, H, t, keep, p, P)
        off = _slot(b * H + h, c if CAUSAL else 0, nC, p + 1)
        carried = tl.sum(_vec(cGMN_ptr, off, p, P)[None, :] * x * x, axis=1) + tl.load(cGMN_ptr + off + p)
        gpi += tl.where(hh[None, :] == h, carried[:, None], 0.0)
    # the softmax backward across heads: dL/dlogit = Pi (dL/dPi - sum_heads Pi dL/dPi); Pi is
    # 0 at padding tokens, so they get none
    pi = tl.load(pi_ptr + offs, mask=m, other=0.0)
    gl = pi * (gpi - tl.sum(pi * gpi, axis=1)[:, None])
    R = tl.load(temp_ptr + hh, mask=hh < H, other=0.0)[None, :] * gl
    tl.store(R_ptr + offs, R, mask=m)
    _store_vec(gtemp_ptr, _slot(b, c, nC, H), tl.sum(gl * tl.load(u_ptr + offs, mask=m, other=0.0), axis=0), H, HP)
    # the S path: chunk totals of dL/dS per head (a second load of each tile)
    for h in range(H):
        x = _tile(w_ptr, s_b, s_h, s_t, b * H + h, H, t, keep, p, P)
        q = x * x
        _, gS = _grad_s(q, _column(R, h, HP)[:, None], _running_sq(q, cS_ptr, b * H + h, c, nC, p, CAUSAL, P),
                        sq_floor)
        _store_vec(cGS_ptr, (_slot(b, c, nC, H) + h) * p, tl.sum(gS, axis=0), p, P)
    _scan_if_last(count_ptr, cGS_ptr, b, nC, H * p, SCAN_SUFFIX if CAUSAL else SCAN_TOTAL, CB, WB)


@triton.jit
def _k_grad_w(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, R_ptr, gtemp_ptr, cS_ptr,
              cMN_ptr, cGMN_ptr, cGS_ptr, gw_ptr, o_b, o_h, o_t, dtemp_ptr, dbias_ptr, B, H, T, T_bias, p, nC, BH,
              sq_floor, stat_eps, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
              BT: tl.constexpr, P: tl.constexpr, RB: tl.constexpr):
    """B3, per (b, h, chunk): dL/dw = Pi (2 w G_M - D g) + 2 w (R A + G_S) (0 at padding:
    w and Pi are). The programs of batch row 0 also reduce over the batch, in a fixed order:
    dpos_bias (H, T_bias) = p * sum_b R, zeros past T (the whole width, so autograd adds
    nothing), and (chunk 0) dtemp (H,) = the sum of B2's partials."""
    bh, c = _pids(BH)
    b, h = bh // H, bh % H
    t = c * BT + tl.arange(0, BT)
    x = _tile(w_ptr, s_b, s_h, s_t, bh, H, t, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, P)
    g = _tile(g_ptr, g_b, g_h, g_t, bh, H, t, t < T, p, P)
    Pt = _row(pi_ptr, bh, t, T)
    Rt = _row(R_ptr, bh, t, T)[:, None]
    q = x * x
    M, n = _mn(q, Pt, cMN_ptr, b, h, c, H, nC, p, stat_eps, CAUSAL, P)
    GM, _, D = _suffix_gm(x, g, Pt, M, n, cGMN_ptr, bh, c, nC, p, CAUSAL, P)
    A, gS = _grad_s(q, Rt, _running_sq(q, cS_ptr, bh, c, nC, p, CAUSAL, P), sq_floor)
    GS = _vec(cGS_ptr, (_slot(b, c if CAUSAL else 0, nC, H) + h) * p, p, P)[None, :]
    if CAUSAL:
        GS = GS + tl.cumsum(gS, axis=0, reverse=True)
    gw = Pt[:, None] * (2.0 * x * GM - D * g) + 2.0 * x * (Rt * A + GS)
    _store_tile(gw_ptr, gw, o_b, o_h, o_t, bh, H, t, T, p, P)
    if b == 0:
        if HAS_BIAS:
            acc = tl.zeros((BT,), dtype=tl.float32)
            for bb in range(B):
                acc += _row(R_ptr, bb * H + h, t, T)
            tl.store(dbias_ptr + h.to(tl.int64) * T_bias + t, p * acc, mask=t < T)
            # the position bias past T got no gradient: its zeros, tail tiles c, c + nC, ...
            for j in range(c, tl.cdiv(T_bias - T, BT), nC):
                tz = T + j * BT + tl.arange(0, BT)
                tl.store(dbias_ptr + h.to(tl.int64) * T_bias + tz, tl.zeros((BT,), dtype=tl.float32), mask=tz < T_bias)
        if c == 0:
            r = tl.arange(0, RB)
            acc_t = tl.zeros((RB,), dtype=tl.float32)
            for k in range(0, B * nC, RB):  # the partials of (b, chunk), in order
                acc_t += tl.load(gtemp_ptr + (k + r).to(tl.int64) * H + h, mask=k + r < B * nC, other=0.0)
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

_COUNTERS = {}  # device -> int32 counters, zero between launches (each launch resets those it used)


def _counters(device, n):
    """At least n zeroed int32 counters on device: allocated (zeroed) once per device, and
    again only when a call needs more rows than any before."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024, 0 if buf is None else 2 * buf.numel()), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


def on_device(t):
    """Launch on t's GPU (Triton launches on the current CUDA device: a tensor on cuda:1 while
    cuda:0 is current would be an illegal address); nothing to do elsewhere."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _scan_tile(W):
    """(CB chunks, WB columns) of a scan step over W columns: at most 2K values."""
    WB = min(256, triton.next_power_of_2(W))
    return dict(CB=min(SCAN_CHUNKS, max(2, 2048 // WB)), WB=WB)


def _warps(values):
    """Warps for a tile of `values` elements: one per 256 (8 a thread), 1 to 16."""
    return min(16, max(1, values // 256))


def _mask_args(mask, stand_in):
    """The padding mask (B, T) bool as (pointer, strides), read as is; or an unread stand-in."""
    return (mask, mask.stride(0), mask.stride(1)) if mask is not None else (stand_in, 0, 0)


class TritonKernels:
    """The three-launch forward and backward above (out, Pi, u, saved carries), and the
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
    def meta(p):
        """Chunk height BT (tokens) and padded head width P for head width p: a (BT, P) tile of
        at most 2K values (more chunks when p is large)."""
        P = triton.next_power_of_2(p)
        return dict(BT=max(16, min(BLOCK_T, 2048 // P)), P=P)

    @classmethod
    def plan(cls, p, H, causal, has_mask):
        """{kernel: its constexprs and num_warps} for every launch of the operator: forward,
        backward and the decoding step (the compile test builds exactly these). A warp per
        256 values of a tile, i.e. 8 fp32 registers a thread per live tile: the heaviest
        kernels keep ~10 tiles live and must stay within 128 registers, unspilled. Not tuned
        on a GPU."""
        meta = cls.meta(p)
        HP = triton.next_power_of_2(H)
        tile = dict(HAS_MASK=has_mask, CAUSAL=causal, **meta, num_warps=_warps(meta["BT"] * meta["P"]))
        return dict(_k_sum_sq=dict(**tile, **_scan_tile(p)),
                    _k_pi=dict(**tile, HAS_BIAS=causal, HP=HP, **_scan_tile(H * (p + 1))),
                    _k_out=tile,
                    _k_sum_gm=dict(**tile, **_scan_tile(p + 1)),
                    _k_grad_logit=dict(**tile, HP=HP, **_scan_tile(H * p)),
                    _k_grad_w=dict(**tile, HAS_BIAS=causal, RB=256),
                    _k_step=dict(HP=HP, P=meta["P"], num_warps=_warps(HP * meta["P"])))

    @classmethod
    def shapes(cls, w, causal):
        """Shapes of what forward returns besides out: pi and u (B, H, T), and the carries cS
        (B*H, nC, p) and cMN (B, nC, H, p + 1) (kernels/triton_ops.py's fake forward too)."""
        B, H, T, p = w.shape
        nC = triton.cdiv(T, cls.meta(p)["BT"])
        return (B, H, T), (B * H, nC, p), (B, nC, H, p + 1)

    @classmethod
    def forward(cls, w, temp, bias, mask, causal, eps):
        """out (w's dtype and strides), Pi and u (B, H, T) fp32, and the carries to save.
        bias: the whole position bias (H, T_max), given exactly for the causal form; mask:
        (B, T) bool or None."""
        if (bias is not None) != causal:
            raise ValueError("the Triton kernels take a position bias for the causal form, and only for it")
        wk, temp = cls.prepare(w), temp.float().contiguous()
        B, H, T, p = wk.shape
        plan = cls.plan(p, H, causal, mask is not None)
        nC = triton.cdiv(T, plan["_k_out"]["BT"])
        f32 = dict(device=wk.device, dtype=torch.float32)
        rows, cS_shape, cMN_shape = cls.shapes(wk, causal)
        u, pi, cS, cMN = torch.empty(rows, **f32), torch.empty(rows, **f32), torch.empty(cS_shape, **f32), \
            torch.empty(cMN_shape, **f32)
        out = torch.empty_like(wk, dtype=w.dtype)  # w's strides: merging the heads after is a view
        sw, masks = wk.stride()[:3], _mask_args(mask, u)
        bias_args = (bias, bias.stride(0), bias.stride(1)) if bias is not None else (u, 0, 0)  # u: unread
        with on_device(wk):
            count = _counters(wk.device, B * H)
            _k_sum_sq[(B * H * nC,)](wk, *sw, *masks, cS, count, H, T, p, nC, B * H, **plan["_k_sum_sq"])
            _k_pi[(B * nC,)](wk, *sw, *masks, temp, *bias_args, cS, u, pi, cMN, count, B, H, T, p, nC, eps[0],
                             **plan["_k_pi"])
            _k_out[(B * H * nC,)](wk, *sw, *masks, pi, cMN, out, *out.stride()[:3], H, T, p, nC, B * H, eps[1],
                                  **plan["_k_out"])
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps, bias_width=0):
        """dw (w's dtype and strides), dtemp (H,) and, causal, dpos_bias (H, bias_width) fp32:
        the gradient of the whole position bias (zeros past T)."""
        cS, cMN = saved
        wk, g, temp = cls.prepare(w), cls.prepare(g), temp.float().contiguous()
        B, H, T, p = wk.shape
        plan = cls.plan(p, H, causal, mask is not None)
        nC = triton.cdiv(T, plan["_k_out"]["BT"])
        f32 = dict(device=wk.device, dtype=torch.float32)
        cGMN, R, gtemp = torch.empty(B * H, nC, p + 1, **f32), torch.empty(B, H, T, **f32), torch.empty(B, nC, H, **f32)
        cGS, dtemp = torch.empty(B, nC, H, p, **f32), torch.empty(H, **f32)
        dbias = torch.empty(H, bias_width, **f32) if causal else None
        gw = torch.empty_like(wk, dtype=w.dtype)
        sw, sg, masks = wk.stride()[:3], g.stride()[:3], _mask_args(mask, R)
        with on_device(wk):
            count = _counters(wk.device, B * H)
            _k_sum_gm[(B * H * nC,)](wk, *sw, g, *sg, *masks, pi, cMN, R, cGMN, count, H, T, p, nC, B * H, eps[1],
                                     **plan["_k_sum_gm"])
            _k_grad_logit[(B * nC,)](wk, *sw, *masks, pi, u, temp, cS, cGMN, R, gtemp, cGS, count, B, H, T, p, nC,
                                     eps[0], **plan["_k_grad_logit"])
            _k_grad_w[(B * H * nC,)](wk, *sw, g, *sg, *masks, pi, R, gtemp, cS, cMN, cGMN, cGS, gw, *gw.stride()[:3],
                                     dtemp, R if dbias is None else dbias, B, H, T, bias_width, p, nC, B * H, *eps,
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
