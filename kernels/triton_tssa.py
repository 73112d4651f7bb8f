"""
Triton kernels of TSSA (CUDA; TRITON_INTERPRET=1 runs them on the CPU, slowly: that is how the
tests run them). Imported only when tssa_impl="triton" asks for them; kernels/fused.py falls
back to model.py's reference, with a warning, when Triton is missing or a launch fails.

Chunk kernels and carry scans: every statistic that runs over tokens is cut into chunks of BT
tokens. A chunk launch runs one program per (batch row, chunk, head) that reads its chunk's
tiles once and writes per-token results and its chunk's totals; a scan launch turns the
chunk totals into every chunk's carry (the sum over the chunks before it, or after it) in
HBM; the next chunk launch reads its carry and scans only inside its tile. No program waits
on another, none loops over other chunks' tiles, no atomics. TritonKernels.forward and
.backward only allocate and launch; launch_plan() states each launch's grid, bytes and time.

    python -m pytest -q tests/test_kernels.py -k triton   # under the interpreter, in a subprocess
"""

import contextlib
import os

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # tokens per chunk, at most (fewer when p is large: a tile holds TILE_VALUES)
TILE_VALUES = 2048  # values of a (BT, P) tile, at most: BT = 32 tokens for heads of 64
FEATURE_BLOCK = 16  # dL/dw's columns a program (the launch that keeps the most tiles live)
SCAN_CHUNKS = 256  # chunk totals a scan program adds a step
SCAN_COLUMNS = 8  # columns of the totals a scan program owns
BATCH_BLOCK = 16  # batch rows dL/dw's reductions over the batch load a step
PARTIAL_BLOCK = 256  # dtemp partials (chunks) they load a step
NUM_WARPS = 4  # a launch's warps (4 beat 8 at every tile size on the H200: results/nvidia-h200-probe.json);
HEAVY_WARPS = 8  # but 8 for B1 and the scans, whose tiles would not fit 4 warps' registers unspilled
# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this file is imported
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# -----------------------------------------------------------------------------
# The launches, in order (kernels/__init__.py gives the maths they compute)
#
#   forward : F1 _k_sq_totals   chunk totals of w^2                                    -> tS
#             S  _k_scan        prefix carries of S                                    -> cS
#             F2 _k_u           u = sum_i q / max(S, floor) (+ p bias), S = cS + a scan in the tile
#             F3 _k_pi_totals   Pi = softmax across heads of temp * u, read as a (BT, H) tile of
#                               every head's u; chunk totals of Pi w^2 and Pi           -> tMN
#             S  _k_scan        prefix carries of M, N                                 -> cMN
#             F4 _k_out         out = -Pi w n / (n + M)
#   backward: B1 _k_grad_totals dL/dM, dL/dN per token; their chunk totals             -> tG;
#                               the part of dL/dPi that the chunk's own tokens give     -> y
#             S  _k_scan        suffix carries of dL/dM, dL/dN                          -> cG
#             B2 _k_pi_grad     dL/dPi = that part + the later chunks' (cG); y = Pi dL/dPi
#             B3 _k_logit_grad  softmax backward across heads from a (BT, H) tile of every
#                               head's y: R = temp dL/dlogit, dtemp partials; chunk totals
#                               of dL/dS                                                -> tGS
#             S  _k_scan        suffix carries of dL/dS                                 -> cGS
#             B4 _k_grad_w      dL/dw, FEATURE_BLOCK columns a program (every term but Pi, R
#                               and n is per feature); the programs of batch row 0 also sum
#                               dpos_bias over the batch (one (batch, BT) tile) and dtemp
# The non-causal form has no scans inside a tile: its carries are the row's totals (the scan
# launches' TOTAL mode), the same everywhere. cS and cMN, the chunk carries of S and of (M, N),
# are what the forward saves for the backward (about 2/BT of w's size each, in fp32).
# Padding tokens (the non-causal mask, read as bool) are loaded as zeros and get Pi = 0, hence
# zero out and zero dw, and no part in any statistic.
#
# Determinism: every value is one program's sums in an order fixed by the shapes (the scans'
# steps, the tile scans), and no two programs write one address: the same bits on every run,
# whatever order the programs run in (the tests run them in reverse too).
#
# Why chunks and scans: on the H200, a program that loops over many chunks with its carry in
# registers kept too little memory in flight, and the heaviest launch (dL/dw, 16 warps, 128
# registers) ran one program per SM: the earlier streaming design took 0.86 ms at B=1 T=16K
# where each launch streams in ~20 us (results/nvidia-h200-profile-9b494a4.json). Here every
# launch has B*H*nC programs of 4 warps, and the carries cost one small launch each.

# what a scan launch writes for chunk c: the sum of the totals before c, after c, or all
PREFIX, SUFFIX, TOTAL = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _ids(H, nC):
    """(b, h, bh = b * H + h, c) of this program. A 1-D grid, heads fastest (the programs that
    read one (BT, H) tile of per-token scalars run together), then chunks, then batch rows."""
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    c, b = rest % nC, rest // nC
    return b, h, b * H + h, c


@triton.jit
def _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK: tl.constexpr):
    """(BT,) bool: the tokens t that exist (t < T) and, with a padding mask, are real."""
    keep = t < T
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + b.to(tl.int64) * m_b + t.to(tl.int64) * m_t, mask=t < T, other=0) != 0)
    return keep


@triton.jit
def _tile_offsets(s_b, s_h, s_t, b, h, t, cols):
    """Offsets of the (BT, len(cols)) tile at row b, head h, tokens t, columns cols of a
    (B, H, T, p) tensor."""
    return b.to(tl.int64) * s_b + h.to(tl.int64) * s_h + t[:, None].to(tl.int64) * s_t + cols[None, :]


@triton.jit
def _tile_mask(keep, cols, p, EVEN: tl.constexpr):
    """Where a tile is read or written. EVEN (every column exists): the mask is the same along
    a token's columns, so that they move as 16-byte vectors."""
    if EVEN:
        inside = tl.full(cols[None, :].shape, True, tl.int1)
    else:
        inside = cols[None, :] < p
    return keep[:, None] & inside


@triton.jit
def _tile(ptr, s_b, s_h, s_t, b, h, t, cols, keep, p, EVEN: tl.constexpr):
    """The tile at row b, head h, tokens t, columns cols of a (B, H, T, p) tensor, as fp32;
    zero where keep is False (past T, padding) and past p."""
    offs = _tile_offsets(s_b, s_h, s_t, b, h, t, cols)
    return tl.load(ptr + offs, mask=_tile_mask(keep, cols, p, EVEN), other=0.0).to(tl.float32)


@triton.jit
def _store_tile(ptr, x, s_b, s_h, s_t, b, h, t, cols, T, p, EVEN: tl.constexpr):
    """Store an fp32 tile into a (B, H, T, p) tensor of ptr's dtype."""
    offs = _tile_offsets(s_b, s_h, s_t, b, h, t, cols)
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=_tile_mask(t < T, cols, p, EVEN))


@triton.jit
def _row(ptr, bh, t, T):
    """Tokens t of row bh of a contiguous (B*H, T) fp32 tensor (0 past T)."""
    return tl.load(ptr + bh.to(tl.int64) * T + t, mask=t < T, other=0.0)


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
def _slot(bh, c, nC, W):
    """Offset of chunk c's W values in row bh of a contiguous (B*H, nC, W) fp32 tensor."""
    return (bh.to(tl.int64) * nC + c) * W


@triton.jit
def _load_cols(ptr, off, cols, p):
    """ptr[off + cols] as fp32 (0 at columns >= p)."""
    return tl.load(ptr + off + cols, mask=cols < p, other=0.0)


@triton.jit
def _store_row_of(ptr, off, cols, tile, row, p):
    """Store row `row` of an fp32 tile (BT, len(cols)) at ptr[off + cols]: the threads that hold
    that row write it, with no reduction across the tile. A chunk's totals are the last row of
    an inclusive token-axis scan (or the first of a reversed one), which costs half a
    token-axis tl.sum into a vector on the H200 (results/nvidia-h200-probe.json)."""
    r = tl.arange(0, tile.shape[0])
    tl.store(ptr + off + cols[None, :] + 0 * r[:, None], tile, mask=(r == row)[:, None] & (cols < p)[None, :])


@triton.jit
def _k_scan(tot_ptr, carry_ptr, nC, W, MODE: tl.constexpr, CB: tl.constexpr, SB: tl.constexpr):
    """S: the carries of every chunk from the chunk totals tot (rows, nC, W) -> carry (same
    shape): the sum over the chunks before c (PREFIX), after c (SUFFIX), or all (TOTAL). A
    program owns SB columns of one row and adds CB chunks a step, in a fixed order. The
    totals a carry sums are loaded shifted by one chunk, so that a carry is a sum of those
    totals alone (never an inclusive sum minus the chunk's own: that loses a small carry
    beside a large total)."""
    pid = tl.program_id(0)
    n_col_blocks = tl.cdiv(W, SB)
    row = pid // n_col_blocks
    cols = (pid % n_col_blocks) * SB + tl.arange(0, SB)
    base = row.to(tl.int64) * nC * W + cols[None, :]
    k = tl.arange(0, CB)
    acc = tl.zeros((SB,), dtype=tl.float32)
    if MODE == TOTAL:
        for c0 in range(0, nC, CB):
            at = c0 + k
            acc += tl.sum(tl.load(tot_ptr + base + at[:, None] * W, mask=(at < nC)[:, None] & (cols < W)[None, :],
                                  other=0.0), axis=0)
        for c0 in range(0, nC, CB):
            at = c0 + k
            tl.store(carry_ptr + base + at[:, None] * W, acc[None, :] + tl.zeros((CB, SB), dtype=tl.float32),
                     mask=(at < nC)[:, None] & (cols < W)[None, :])
    else:
        for j0 in range(0, nC, CB):
            if MODE == PREFIX:  # chunks j0.., each the sum of the totals of the chunks before it
                at = j0 + k
                src = at - 1
            else:  # chunks nC-1-j0 down, each the sum of the totals of the chunks after it
                at = nC - 1 - j0 - k
                src = at + 1
            writes = ((at >= 0) & (at < nC))[:, None] & (cols < W)[None, :]
            x = tl.load(tot_ptr + base + src[:, None] * W, mask=writes & ((src >= 0) & (src < nC))[:, None], other=0.0)
            tl.store(carry_ptr + base + at[:, None] * W, acc[None, :] + tl.cumsum(x, axis=0), mask=writes)
            acc += tl.sum(x, axis=0)


@triton.jit
def _k_sq_totals(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, tS_ptr, H, T, p, nC,
                 HAS_MASK: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr):
    """F1: the chunk's totals of w^2 -> tS (B*H, nC, p)."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    cols = tl.arange(0, P)
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, EVEN_P)
    _store_row_of(tS_ptr, _slot(bh, c, nC, p), cols, tl.cumsum(x * x, axis=0), BT - 1, p)


@triton.jit
def _running(carry, tile, CAUSAL: tl.constexpr):
    """A running sum over tokens at every token of the tile: the chunk's carry (the chunks
    before, or the row's total if not CAUSAL) plus, causal, the tile's own prefix."""
    if CAUSAL:
        return carry + tl.cumsum(tile, axis=0)
    return carry + tl.zeros_like(tile)


@triton.jit
def _k_u(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, bias_ptr, bias_h, bias_t, cS_ptr, u_ptr, H, T, p, nC, sq_floor,
         HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr,
         EVEN_P: tl.constexpr):
    """F2: u = sum_i w^2 / max(S, floor) (+ p * bias) -> u (B*H, T)."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    cols = tl.arange(0, P)
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, EVEN_P)
    q = x * x
    S = _running(_load_cols(cS_ptr, _slot(bh, c, nC, p), cols, p)[None, :], q, CAUSAL)
    u = tl.sum(q / tl.maximum(S, sq_floor), axis=1)
    if HAS_BIAS:
        u += p * tl.load(bias_ptr + h * bias_h + t.to(tl.int64) * bias_t, mask=t < T, other=0.0)
    _store_row(u_ptr, bh, t, T, u)


@triton.jit
def _k_pi_totals(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, temp_ptr, u_ptr, pi_ptr, tMN_ptr, H, T, p, nC,
                 HAS_MASK: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, HP: tl.constexpr):
    """F3: Pi (B*H, T), this head's column of the softmax across heads of temp * u (0 at
    padding tokens), and the chunk totals of Pi w^2 (columns 0..p-1) and Pi (column p) -> tMN."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    keep = _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK)
    hh = tl.arange(0, HP)
    temp = tl.load(temp_ptr + hh, mask=hh < H, other=0.0)
    logit = tl.where(hh[None, :] < H, temp[None, :] * _heads(u_ptr, b, t, H, T, HP), float("-inf"))
    e = tl.exp(logit - tl.max(logit, axis=1)[:, None])
    Pt = tl.where(keep, _column(e, h, HP) / tl.sum(e, axis=1), 0.0)
    _store_row(pi_ptr, bh, t, T, Pt)
    cols = tl.arange(0, P)
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, keep, p, EVEN_P)
    off = _slot(bh, c, nC, p + 1)
    _store_row_of(tMN_ptr, off, cols, tl.cumsum(Pt[:, None] * x * x, axis=0), BT - 1, p)
    tl.store(tMN_ptr + off + p, tl.sum(Pt, axis=0))


@triton.jit
def _mn(q, Pt, cMN_ptr, bh, c, nC, cols, p, stat_eps, CAUSAL: tl.constexpr):
    """M (BT, len(cols)) = running sum of Pi w^2 at columns cols, and n (BT, 1) = running sum
    of Pi + stat_eps, from chunk c's carries cMN (B*H, nC, p + 1)."""
    off = _slot(bh, c, nC, p + 1)
    M = _running(_load_cols(cMN_ptr, off, cols, p)[None, :], Pt[:, None] * q, CAUSAL)
    n = _running(tl.load(cMN_ptr + off + p), Pt, CAUSAL)[:, None] + stat_eps
    return M, n


@triton.jit
def _k_out(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, cMN_ptr, out_ptr, o_b, o_h, o_t, H, T, p, nC, stat_eps,
           HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr):
    """F4: out = -Pi w n / (n + M) (0 where Pi is: padding tokens)."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    cols = tl.arange(0, P)
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, EVEN_P)
    Pt = _row(pi_ptr, bh, t, T)
    M, n = _mn(x * x, Pt, cMN_ptr, bh, c, nC, cols, p, stat_eps, CAUSAL)
    _store_tile(out_ptr, -Pt[:, None] * x * n / (n + M), o_b, o_h, o_t, b, h, t, cols, T, p, EVEN_P)


@triton.jit
def _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, cols, T, p,
            HAS_MASK: tl.constexpr, EVEN: tl.constexpr):
    """What the backward's chunk launches read at tokens t of row b, head h: the tiles of w
    (zero at padding) and of dL/dout at columns cols, and Pi (BT,)."""
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, EVEN)
    gt = _tile(g_ptr, g_b, g_h, g_t, b, h, t, cols, t < T, p, EVEN)
    return x, gt, _row(pi_ptr, bh, t, T)


@triton.jit
def _k_grad_totals(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, cMN_ptr, y_ptr, tG_ptr,
                   H, T, p, nC, stat_eps, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr,
                   P: tl.constexpr, EVEN_P: tl.constexpr):
    """B1: the chunk totals of dL/dM (columns 0..p-1) and dL/dN (column p) -> tG (B*H, nC,
    p + 1); and the part of dL/dPi that the chunk's own tokens give -> y (B*H, T): with
    the sums of dL/dM, dL/dN over the chunk's tokens >= t, -sum_i g w D + sum_i (those of
    dL/dM) w^2 + (that of dL/dN) (B2 adds the later chunks' part)."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    cols = tl.arange(0, P)
    x, gt, Pt = _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, cols,
                        T, p, HAS_MASK, EVEN_P)
    q = x * x
    M, n = _mn(q, Pt, cMN_ptr, bh, c, nC, cols, p, stat_eps, CAUSAL)
    D = n / (n + M)
    gM = gt * Pt[:, None] * x * D * D / n  # dL/dM at each token
    gN = -tl.sum(gM * M / n, axis=1)  # dL/dN
    later_M = tl.cumsum(gM, axis=0, reverse=True)  # the sums over the chunk's tokens >= t
    gpi = -tl.sum(gt * x * D, axis=1)
    if CAUSAL:  # the non-causal carries are the totals: nothing from inside the chunk
        gpi += tl.sum(later_M * q, axis=1) + tl.cumsum(gN, axis=0, reverse=True)
    _store_row(y_ptr, bh, t, T, gpi)
    off = _slot(bh, c, nC, p + 1)
    _store_row_of(tG_ptr, off, cols, later_M, 0, p)
    tl.store(tG_ptr + off + p, tl.sum(gN, axis=0))


@triton.jit
def _k_pi_grad(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, cG_ptr, y_ptr, H, T, p, nC,
               HAS_MASK: tl.constexpr, BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr):
    """B2: dL/dPi = B1's part (in y) + sum_i C_M w^2 + C_N, with (C_M, C_N) = cG the sums of
    dL/dM, dL/dN over the later chunks (over all, non-causal); y = Pi dL/dPi (B*H, T), in place."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    cols = tl.arange(0, P)
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, EVEN_P)
    off = _slot(bh, c, nC, p + 1)
    gpi = _row(y_ptr, bh, t, T) + tl.sum(_load_cols(cG_ptr, off, cols, p)[None, :] * x * x, axis=1) \
        + tl.load(cG_ptr + off + p)
    _store_row(y_ptr, bh, t, T, _row(pi_ptr, bh, t, T) * gpi)


@triton.jit
def _grad_s(q, Rt, S, sq_floor):
    """A = 1 / max(S, sq_floor) and dL/dS = -R q A^2, none where the floor holds (torch's clamp_min)."""
    A = 1.0 / tl.maximum(S, sq_floor)
    return A, tl.where(S >= sq_floor, -Rt * q * A * A, 0.0)


@triton.jit
def _k_logit_grad(w_ptr, s_b, s_h, s_t, mask_ptr, m_b, m_t, pi_ptr, u_ptr, temp_ptr, y_ptr, cS_ptr, R_ptr,
                  gtemp_ptr, tGS_ptr, H, T, p, nC, sq_floor, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                  BT: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr, HP: tl.constexpr):
    """B3: the softmax backward across heads, dL/dlogit = y - Pi sum_heads y (y = Pi dL/dPi;
    Pi is 0 at padding tokens, so they get none), from a (BT, H) tile of every head's y;
    R = temp dL/dlogit -> R (B*H, T); this program's dtemp partial -> gtemp (B*H, nC); the
    chunk totals of dL/dS = -R w^2 / max(S, floor)^2 -> tGS (B*H, nC, p)."""
    b, h, bh, c = _ids(H, nC)
    t = c * BT + tl.arange(0, BT)
    y = _heads(y_ptr, b, t, H, T, HP)
    gl = _column(y, h, HP) - _row(pi_ptr, bh, t, T) * tl.sum(y, axis=1)
    Rt = tl.load(temp_ptr + h) * gl
    _store_row(R_ptr, bh, t, T, Rt)
    tl.store(gtemp_ptr + bh.to(tl.int64) * nC + c, tl.sum(gl * _row(u_ptr, bh, t, T), axis=0))
    cols = tl.arange(0, P)
    x = _tile(w_ptr, s_b, s_h, s_t, b, h, t, cols, _keep(mask_ptr, m_b, m_t, b, t, T, HAS_MASK), p, EVEN_P)
    q = x * x
    off = _slot(bh, c, nC, p)
    gS = _grad_s(q, Rt[:, None], _running(_load_cols(cS_ptr, off, cols, p)[None, :], q, CAUSAL), sq_floor)[1]
    _store_row_of(tGS_ptr, off, cols, tl.cumsum(gS, axis=0), BT - 1, p)


@triton.jit
def _suffix(carry, tile, CAUSAL: tl.constexpr):
    """A suffix sum over tokens at every token of the tile: the chunk's carry (the chunks
    after, or the row's total if not CAUSAL) plus, causal, the tile's own suffix."""
    if CAUSAL:
        return carry + tl.cumsum(tile, axis=0, reverse=True)
    return carry + tl.zeros_like(tile)


@triton.jit
def _k_grad_w(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, R_ptr, gtemp_ptr, cS_ptr,
              cMN_ptr, cG_ptr, cGS_ptr, gw_ptr, o_b, o_h, o_t, dtemp_ptr, dbias_ptr, B, H, T, T_bias, p, nC, nK,
              sq_floor, stat_eps, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
              BT: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, BB: tl.constexpr, RB: tl.constexpr):
    """B4: dL/dw = Pi (2 w G_M - D g) + 2 w (R A + G_S) at BK columns (0 at padding: w and Pi
    are), G_M and G_S the suffix sums of dL/dM and dL/dS: the later chunks' (cG, cGS) and the
    tile's. A program per (batch row, chunk, head, column block), blocks fastest. The
    programs of batch row 0 and block 0 also reduce over the batch, in a fixed order:
    dpos_bias (H, T_bias) = p * sum_b R at the chunk's tokens (one (BB, BT) tile a step), and
    zeros past T (tiles c, c + nC, ...: the whole width, so autograd adds nothing), and
    (chunk 0) dtemp (H,) = the sum of B3's partials."""
    pid = tl.program_id(0)
    k = pid % nK
    rest = pid // nK
    h = rest % H
    rest = rest // H
    c, b = rest % nC, rest // nC
    bh = b * H + h
    t = c * BT + tl.arange(0, BT)
    cols = k * BK + tl.arange(0, BK)
    x, gt, Pt = _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, cols,
                        T, p, HAS_MASK, EVEN_K)
    Rt = _row(R_ptr, bh, t, T)[:, None]
    q = x * x
    M, n = _mn(q, Pt, cMN_ptr, bh, c, nC, cols, p, stat_eps, CAUSAL)
    S = _running(_load_cols(cS_ptr, _slot(bh, c, nC, p), cols, p)[None, :], q, CAUSAL)
    D = n / (n + M)
    gM = gt * Pt[:, None] * x * D * D / n
    A, gS = _grad_s(q, Rt, S, sq_floor)
    GM = _suffix(_load_cols(cG_ptr, _slot(bh, c, nC, p + 1), cols, p)[None, :], gM, CAUSAL)
    GS = _suffix(_load_cols(cGS_ptr, _slot(bh, c, nC, p), cols, p)[None, :], gS, CAUSAL)
    gw = Pt[:, None] * (2.0 * x * GM - D * gt) + 2.0 * x * (Rt * A + GS)
    _store_tile(gw_ptr, gw, o_b, o_h, o_t, b, h, t, cols, T, p, EVEN_K)
    if (b == 0) & (k == 0):
        bb = tl.arange(0, BB)
        if HAS_BIAS:
            acc = tl.zeros((BT,), dtype=tl.float32)
            for b0 in range(0, B, BB):
                rows = ((b0 + bb) * H + h).to(tl.int64)
                acc += tl.sum(tl.load(R_ptr + rows[:, None] * T + t[None, :],
                                      mask=((b0 + bb) < B)[:, None] & (t < T)[None, :], other=0.0), axis=0)
            tl.store(dbias_ptr + h.to(tl.int64) * T_bias + t, p * acc, mask=t < T)
            for z in range(c, tl.cdiv(T_bias - T, BT), nC):  # past T no gradient: tiles c, c + nC, ...
                tz = T + z * BT + tl.arange(0, BT)
                tl.store(dbias_ptr + h.to(tl.int64) * T_bias + tz, tl.zeros((BT,), dtype=tl.float32), mask=tz < T_bias)
        if c == 0:
            r = tl.arange(0, RB)
            acc_t = tl.zeros((BB, RB), dtype=tl.float32)
            for b0 in range(0, B, BB):
                rows = ((b0 + bb) * H + h).to(tl.int64)
                for c0 in range(0, nC, RB):
                    acc_t += tl.load(gtemp_ptr + rows[:, None] * nC + (c0 + r)[None, :],
                                     mask=((b0 + bb) < B)[:, None] & ((c0 + r) < nC)[None, :], other=0.0)
            tl.store(dtemp_ptr + h, tl.sum(tl.sum(acc_t, axis=1), axis=0))


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

FORWARD = ("_k_sq_totals", "_k_scan", "_k_u", "_k_pi_totals", "_k_scan", "_k_out")
BACKWARD = ("_k_grad_totals", "_k_scan", "_k_pi_grad", "_k_logit_grad", "_k_scan", "_k_grad_w")
KERNELS = tuple(dict.fromkeys(FORWARD + BACKWARD)) + ("_k_step",)  # each kernel once


def on_device(t):
    """Launch on t's GPU (Triton launches on the current CUDA device: a tensor on cuda:1 while
    cuda:0 is current would be an illegal address); nothing to do elsewhere."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _mask_args(mask, stand_in):
    """The padding mask (B, T) bool as (pointer, strides), read as is; or an unread stand-in."""
    return (mask, mask.stride(0), mask.stride(1)) if mask is not None else (stand_in, 0, 0)


def tile_meta(p):
    """Chunk height BT (tokens) and padded head width P for head width p: a (BT, P) tile of
    at most TILE_VALUES values (shorter chunks when p is large)."""
    P = triton.next_power_of_2(p)
    return dict(BT=max(16, min(BLOCK_T, TILE_VALUES // P)), P=P, EVEN_P=P == p)


def geometry(T, p):
    """How a row of T tokens is cut: nC chunks of BT tokens; dL/dw's columns in nK blocks of BK."""
    meta = tile_meta(p)
    BK = min(meta["P"], FEATURE_BLOCK)
    return dict(meta, nC=triton.cdiv(max(T, 1), meta["BT"]), BK=BK, nK=meta["P"] // BK, EVEN_K=p % BK == 0)


# The scans of one call, in launch order: (the totals scanned, their columns past p, mode)
SCANS = {"forward": (("tS", 0, "prefix"), ("tMN", 1, "prefix")),
         "backward": (("tG", 1, "suffix"), ("tGS", 0, "suffix"))}
MODES = {"prefix": PREFIX.value, "suffix": SUFFIX.value, "total": TOTAL.value}


def scan_mode(mode, causal):
    """The scan launches' mode: the non-causal carries are the row's totals."""
    return MODES[mode if causal else "total"]


def _scan(tot, carry, mode, causal):
    """Launch S over tot (rows, nC, W) -> carry."""
    rows, nC, W = tot.shape
    _k_scan[(rows * triton.cdiv(W, SCAN_COLUMNS),)](tot, carry, nC, W, MODE=scan_mode(mode, causal),
                                                    CB=SCAN_CHUNKS, SB=SCAN_COLUMNS, num_warps=HEAVY_WARPS)


# What each launch moves in HBM (the tensors it reads and writes, each once: their sizes in
# launch_plan), what its programs read again from L2 (the other heads' columns of a (BT, H)
# tile of per-token scalars, other batch rows' R), and its work inside a tile that the
# bandwidth does not cover: the token-axis scans of a (BT, P) tile (SCAN_NS), causal and not
# (a chunk's totals are a scan's last row: _store_row_of).
TRAFFIC = {
    "_k_sq_totals": dict(read=("w", "mask"), write=("tS",), again=("mask_heads",), scans=(1, 1)),
    "_k_u": dict(read=("w", "mask", "bias", "cS"), write=("u",), again=("mask_heads", "bias_rows"), scans=(1, 0)),
    "_k_pi_totals": dict(read=("w", "mask", "u"), write=("pi", "tMN"), again=("mask_heads", "u_heads"),
                         scans=(1, 1)),
    "_k_out": dict(read=("w", "mask", "pi", "cMN"), write=("out",), again=("mask_heads",), scans=(1, 0)),
    "_k_grad_totals": dict(read=("w", "g", "mask", "pi", "cMN"), write=("y", "tG"), again=("mask_heads",),
                           scans=(2, 1)),
    "_k_pi_grad": dict(read=("w", "mask", "pi", "cG", "y"), write=("y",), again=("mask_heads",), scans=(0, 0)),
    "_k_logit_grad": dict(read=("w", "mask", "y", "pi", "u", "cS"), write=("R", "gtemp", "tGS"),
                          again=("mask_heads", "y_heads"), scans=(2, 1)),
    "_k_grad_w": dict(read=("w", "g", "mask", "pi", "R", "cS", "cMN", "cG", "cGS", "gtemp"),
                      write=("dw", "dtemp", "dbias"), again=("mask_heads", "R_batch"), scans=(4, 0)),
}
# The time model's constants, calibrated on the H200 (results/nvidia-h200-probe.json: Triton
# 3.6, tiles of 32 x 64 fp32, 4 warps): a launch that streams a tile in and out runs at the
# copy rate; a token-axis tl.cumsum adds ~0.95 ns a tile over the whole GPU, a token-axis
# tl.sum into a totals vector ~1.9 ns; a scan step (one load and cumsum of SCAN_CHUNKS totals)
# ~1.6 us. COPY_RATE: the device-to-device copy rate (bytes read + written per second).
COPY_RATE = {"h200": 4.13e12, "h100": 3.0e12}
SCAN_NS, SUM_NS, SCAN_STEP_S, LAUNCH_S = 0.95e-9, 1.9e-9, 1.6e-6, 3e-6


def _sizes(B, H, T, p, dtype, causal, has_mask, bias_width, geo):
    """Bytes of every tensor a launch moves (launch_plan's TRAFFIC names)."""
    nC, rows, f32 = geo["nC"], B * H, 4
    scalar = rows * T * f32  # u, Pi, y, R: one fp32 a token and head
    chunk = rows * nC * p * f32  # a (B*H, nC, p) fp32 tensor of chunk totals or carries
    pair = rows * nC * (p + 1) * f32
    w = rows * T * p * torch.empty((), dtype=dtype).element_size()  # w, g, out, dw
    return dict(w=w, g=w, out=w, dw=w, mask=B * T if has_mask else 0, bias=H * T * f32 if causal else 0,
                u=scalar, pi=scalar, y=scalar, R=scalar, tS=chunk, cS=chunk, tGS=chunk, cGS=chunk,
                tMN=pair, cMN=pair, tG=pair, cG=pair, gtemp=rows * nC * f32, dtemp=H * f32,
                dbias=H * (bias_width or T) * f32 if causal else 0, mask_heads=(H - 1) * B * T if has_mask else 0,
                bias_rows=(B - 1) * H * T * f32 if causal else 0, u_heads=(H - 1) * scalar, y_heads=(H - 1) * scalar,
                R_batch=(B - 1) * H * T * f32 if causal else 0)


def launch_plan(B, H, T, p, dtype=torch.bfloat16, causal=True, has_mask=False, bias_width=None):
    """The launches of one forward and backward, in order, as TritonKernels runs them: for
    each, its kernel (a scan's mode too), grid (programs), the bytes it reads and writes in
    HBM (each tensor once) and reads again from L2, and its work in tiles: "tiles" (BT x P
    tiles it loads w in), "scans" and "sums" (token-axis scans and sums per tile), "steps"
    (a scan's dependent steps). bias_width: the position bias's columns (T)."""
    geo = geometry(T, p)
    sizes = _sizes(B, H, T, p, dtype, causal, has_mask, bias_width, geo)
    rows, nC = B * H, geo["nC"]
    plan, scans = [], {"forward": iter(SCANS["forward"]), "backward": iter(SCANS["backward"])}
    for direction, names in (("forward", FORWARD), ("backward", BACKWARD)):
        for name in names:
            if name == "_k_scan":
                tot, extra, mode = next(scans[direction])
                carry = "c" + tot[1:]
                width = p + extra
                plan.append(dict(kernel=name, direction=direction, mode=mode if causal else "total", carries=carry,
                                 grid=rows * triton.cdiv(width, SCAN_COLUMNS), read=sizes[tot],
                                 write=sizes[carry], l2_read=0, tiles=0, scans=0, sums=0,
                                 steps=triton.cdiv(nC, SCAN_CHUNKS) * (2 if not causal else 1)))
                continue
            t = TRAFFIC[name]
            grid = rows * nC * (geo["nK"] if name == "_k_grad_w" else 1)
            plan.append(dict(kernel=name, direction=direction, grid=grid, read=sum(sizes[k] for k in t["read"]),
                             write=sum(sizes[k] for k in t["write"]), l2_read=sum(sizes[k] for k in t["again"]),
                             tiles=rows * nC, scans=t["scans"][0 if causal else 1], sums=0, steps=0))
    return plan


def modelled_time_s(plan, gpu="h100", copy_rate=None):
    """The GPU time of a plan's launches (or one launch's) on the model above: each launch
    LAUNCH_S, plus its HBM bytes at the copy rate, plus its tiles' token-axis scans and sums,
    plus a scan's dependent steps. gpu: "h100" or "h200" (their measured copy rates), or
    copy_rate in bytes a second."""
    rate = copy_rate or COPY_RATE[gpu]
    plan = [plan] if isinstance(plan, dict) else plan
    return sum(LAUNCH_S + (launch["read"] + launch["write"]) / rate + launch["steps"] * SCAN_STEP_S
               + launch["tiles"] * (launch["scans"] * SCAN_NS + launch["sums"] * SUM_NS) for launch in plan)


class TritonKernels:
    """The forward and backward above (out, Pi, u, saved chunk carries), and the decoding
    step, for kernels/fused.py's FusedTSSA. eps = (sq_floor, stat_eps), as model.py defines
    them. raw_inputs: forward and backward take w unmasked with the bool padding mask and the
    whole position bias (H, T_max), and give its whole gradient."""

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
        """{kernel: its constexprs and num_warps} for every kernel of the operator: forward,
        backward and the decoding step (the compile test builds exactly these; a scan's MODE
        is given at each launch: scan_mode)."""
        geo = geometry(1, p)
        HP = triton.next_power_of_2(H)
        tile = dict(HAS_MASK=has_mask, BT=geo["BT"], P=geo["P"], EVEN_P=geo["EVEN_P"], num_warps=NUM_WARPS)
        scan = dict(tile, CAUSAL=causal)
        return dict(_k_scan=dict(MODE=scan_mode("prefix", causal), CB=SCAN_CHUNKS, SB=SCAN_COLUMNS,
                                 num_warps=HEAVY_WARPS),
                    _k_sq_totals=tile, _k_u=dict(scan, HAS_BIAS=causal), _k_pi_totals=dict(tile, HP=HP),
                    _k_out=scan, _k_grad_totals=dict(scan, num_warps=HEAVY_WARPS), _k_pi_grad=tile,
                    _k_logit_grad=dict(scan, HP=HP),
                    _k_grad_w=dict(HAS_BIAS=causal, HAS_MASK=has_mask, CAUSAL=causal, BT=geo["BT"], BK=geo["BK"],
                                   EVEN_K=p % geo["BK"] == 0, BB=BATCH_BLOCK, RB=PARTIAL_BLOCK,
                                   num_warps=NUM_WARPS),
                    _k_step=dict(HP=HP, P=geo["P"], num_warps=max(NUM_WARPS, min(16, HP * geo["P"] // 256))))

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
        plan, nC = cls.plan(p, H, causal, mask is not None), geometry(T, p)["nC"]
        f32 = dict(device=wk.device, dtype=torch.float32)
        rows, cS_shape, cMN_shape = cls.shapes(wk, causal)
        u, pi, cS, cMN = (torch.empty(s, **f32) for s in (rows, rows, cS_shape, cMN_shape))
        tS, tMN = torch.empty(cS_shape, **f32), torch.empty(cMN_shape, **f32)
        out = torch.empty_like(wk, dtype=w.dtype)  # w's strides: merging the heads after is a view
        sw, masks, grid = wk.stride()[:3], _mask_args(mask, u), (B * H * nC,)
        bias_args = (bias, bias.stride(0), bias.stride(1)) if bias is not None else (u, 0, 0)  # u: unread
        sizes = (H, T, p, nC)
        with on_device(wk):
            _k_sq_totals[grid](wk, *sw, *masks, tS, *sizes, **plan["_k_sq_totals"])
            _scan(tS, cS, "prefix", causal)
            _k_u[grid](wk, *sw, *masks, *bias_args, cS, u, *sizes, eps[0], **plan["_k_u"])
            _k_pi_totals[grid](wk, *sw, *masks, temp, u, pi, tMN, *sizes, **plan["_k_pi_totals"])
            _scan(tMN, cMN, "prefix", causal)
            _k_out[grid](wk, *sw, *masks, pi, cMN, out, *out.stride()[:3], *sizes, eps[1], **plan["_k_out"])
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps, bias_width=0):
        """dw (w's dtype and strides), dtemp (H,) and, causal, dpos_bias (H, bias_width) fp32:
        the gradient of the whole position bias (zeros past T)."""
        cS, cMN = saved
        wk, g, temp = cls.prepare(w), cls.prepare(g), temp.float().contiguous()
        B, H, T, p = wk.shape
        plan, geo = cls.plan(p, H, causal, mask is not None), geometry(T, p)
        nC = geo["nC"]
        f32 = dict(device=wk.device, dtype=torch.float32)
        y, R, gtemp = torch.empty(B, H, T, **f32), torch.empty(B, H, T, **f32), torch.empty(B * H, nC, **f32)
        tG, cG = torch.empty_like(cMN), torch.empty_like(cMN)
        tGS, cGS, dtemp = torch.empty_like(cS), torch.empty_like(cS), torch.empty(H, **f32)
        dbias = torch.empty(H, bias_width, **f32) if causal else None
        gw = torch.empty_like(wk, dtype=w.dtype)
        sw, sg, masks, grid = wk.stride()[:3], g.stride()[:3], _mask_args(mask, R), (B * H * nC,)
        sizes = (H, T, p, nC)
        with on_device(wk):
            _k_grad_totals[grid](wk, *sw, g, *sg, *masks, pi, cMN, y, tG, *sizes, eps[1], **plan["_k_grad_totals"])
            _scan(tG, cG, "suffix", causal)
            _k_pi_grad[grid](wk, *sw, *masks, pi, cG, y, *sizes, **plan["_k_pi_grad"])
            _k_logit_grad[grid](wk, *sw, *masks, pi, u, temp, y, cS, R, gtemp, tGS, *sizes, eps[0],
                                **plan["_k_logit_grad"])
            _scan(tGS, cGS, "suffix", causal)
            _k_grad_w[(B * H * nC * geo["nK"],)](wk, *sw, g, *sg, *masks, pi, R, gtemp, cS, cMN, cG, cGS, gw,
                                                 *gw.stride()[:3], dtemp, R if dbias is None else dbias, B, H, T,
                                                 bias_width, p, nC, geo["nK"], *eps, **plan["_k_grad_w"])
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
