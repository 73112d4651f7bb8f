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
.backward only allocate and launch; launch_plan() states each launch's grid, warps, bytes and
work a program, and modelled_time_s() its time (kernels/launch_model.py: modelled, not measured).

What a call costs on the host (issue 52; counted, NOT MEASURED on a GPU): call_plan() memoises the
plan, geometry, grids and workspace layouts per (B, H, T, p, causal, mask or not, the knobs' values);
the forward allocates 3 tensors (out; Pi, u and the carries, kept for the backward; the chunk
totals), the backward 4 (dw, dtemp, dpos_bias; the rest), where they allocated 7 and 10; each of the
12 launches, once a kernel has been built for its arguments' specialization, calls the compiled
kernel's launcher without Triton's JIT dispatch (kernels/triton_launch.py: the key, and where the
normal kernel[grid] launch still runs: the interpreter, another Triton, a new specialization).

    python -m pytest -q tests/test_kernels.py -k triton   # under the interpreter, in a subprocess
"""

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from kernels.launch_model import AT_35FFD52, AT_88ECCCE, BACKWARD, COPY_RATE, FORWARD  # noqa: F401
from kernels.launch_model import modelled_time_s, plan_for, work  # noqa: F401
from kernels.launch_model import geometry as cut
from kernels.triton_launch import carve, direct_at, launch, layout

BLOCK_T = 64  # tokens per chunk, at most (fewer when p is large: a tile holds TILE_VALUES)
TILE_VALUES = 2048  # values of a (BT, P) tile, at most: BT = 32 tokens for heads of 64
FEATURE_BLOCK = 16  # dL/dw's columns a program, at most: four programs a chunk and head of 64 (measured: below)
SCAN_CHUNKS = 256  # chunk totals a scan program adds a step, at most (fewer where the row has fewer chunks)
SCAN_COLUMNS = 8  # columns of the totals a scan program owns (its warps: 8 totals a thread)
BATCH_BLOCK = 16  # batch rows dL/dw's reductions over the batch load a step
PARTIAL_BLOCK = 256  # dtemp partials (chunks) they load a step
NUM_WARPS = 4  # a chunk launch's warps (4 beat 8 at every tile size on the H200: results/nvidia-h200-probe.json),
DW_VALUES = 4  # and dL/dw's: 4 values of its (BT, BK) tile a thread (4 warps; 8 a thread spilled at 4 warps under 3.6)
MAX_REGISTERS = 128  # dL/dw's registers a thread, at most (a bound the build test holds it to)
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
#             B4 _k_grad_w      dL/dw, a program per chunk, head and block of 16 columns
#                               (FEATURE_BLOCK); the programs of batch row 0 and block 0
#                               also sum dpos_bias over the batch (one (batch, BT) tile a
#                               step; R itself at B = 1) and dtemp
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
# launch has B*H*nC programs of 4 warps (dL/dw 4 times as many), and the carries cost one small launch each.
# What the H200 measured (results/nvidia-h200.json, kernel_times; SPEED.md has the tables). At
# 35ffd52: dL/dw 120 us of the 354 at B=1 T=16K (16 columns a program, 4 warps: 24,576 programs),
# B1 81 (8 warps), the scans 7/8 masked at B=16 T=1K. At 88ecccebc71c: B1 at 4 warps with two sums
# over features where there were three, 55 us; the scans sized to the row's chunks (as many
# totals a step as the row has, up to 256, warps for 8 a thread), 2.7 us where they took 11; and
# dL/dw as one 8-warp program a chunk and head (64 columns, 8 values a thread), 154 us: slower
# than the four 16-column programs, which scan disjoint columns and so repeat no scan. dL/dw is
# therefore back at 16 columns and 4 warps, its tiles still added into dw one by one and the
# batch sums first. The launch model prices each (kernels/launch_model.py).

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
    M, n = _mn(x * x, Pt, cMN_ptr, bh, c, nC, cols, p, stat_eps, CAUSAL)
    inv_n = 1.0 / n  # (BT, 1): a division a token, not a value
    D = n / (n + M)
    e = gt * x * D  # -dL/dPi's direct part, before its sum over the features
    gM = e * D * (Pt[:, None] * inv_n)  # dL/dM at each token
    gN = -tl.sum(gM * M * inv_n, axis=1)  # dL/dN
    later_M = tl.cumsum(gM, axis=0, reverse=True)  # the sums over the chunk's tokens >= t
    off = _slot(bh, c, nC, p + 1)
    _store_row_of(tG_ptr, off, cols, later_M, 0, p)
    if CAUSAL:  # one sum over the features for both parts; the non-causal carries are the totals
        later_N = tl.cumsum(gN, axis=0, reverse=True)
        gpi = tl.sum(later_M * x * x - e, axis=1) + later_N
        r = tl.arange(0, BT)
        tl.store(tG_ptr + off + p + 0 * r, later_N, mask=r == 0)  # the chunk's total: the suffix sum at its first token
    else:
        gpi = -tl.sum(e, axis=1)
        tl.store(tG_ptr + off + p, tl.sum(gN, axis=0))
    _store_row(y_ptr, bh, t, T, gpi)


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
    tile's. A program per (batch row, chunk, head, column block of BK = FEATURE_BLOCK), blocks
    fastest. Each term is added into dw as soon as it is made, so that no more tiles are live
    than the registers hold. The programs of batch row 0 and block 0 also reduce over the
    batch first (_batch_sums)."""
    pid = tl.program_id(0)
    k = pid % nK
    rest = pid // nK
    h = rest % H
    rest = rest // H
    c, b = rest % nC, rest // nC
    bh = b * H + h
    t = c * BT + tl.arange(0, BT)
    if (b == 0) & (k == 0):  # first: nothing of it is live across the tile's work
        _batch_sums(R_ptr, gtemp_ptr, dbias_ptr, dtemp_ptr, h, c, t, B, H, T, T_bias, p, nC, HAS_BIAS, BT, BB, RB)
    cols = k * BK + tl.arange(0, BK)
    x, gt, Pt = _w_g_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, mask_ptr, m_b, m_t, pi_ptr, b, h, bh, t, cols,
                        T, p, HAS_MASK, EVEN_K)
    Rt = _row(R_ptr, bh, t, T)[:, None]
    P_ = Pt[:, None]
    q = x * x
    M, n = _mn(q, Pt, cMN_ptr, bh, c, nC, cols, p, stat_eps, CAUSAL)
    D = n / (n + M)
    gw = -P_ * D * gt  # dL/dw term by term, each tile dropped once it is added in
    gM = -gw * x * D / n  # dL/dM = g Pi w D^2 / n
    gw += 2.0 * P_ * x * _suffix(_load_cols(cG_ptr, _slot(bh, c, nC, p + 1), cols, p)[None, :], gM, CAUSAL)
    A, gS = _grad_s(q, Rt, _running(_load_cols(cS_ptr, _slot(bh, c, nC, p), cols, p)[None, :], q, CAUSAL), sq_floor)
    gw += 2.0 * x * (Rt * A + _suffix(_load_cols(cGS_ptr, _slot(bh, c, nC, p), cols, p)[None, :], gS, CAUSAL))
    _store_tile(gw_ptr, gw, o_b, o_h, o_t, b, h, t, cols, T, p, EVEN_K)


@triton.jit
def _batch_sums(R_ptr, gtemp_ptr, dbias_ptr, dtemp_ptr, h, c, t, B, H, T, T_bias, p, nC, HAS_BIAS: tl.constexpr,
                BT: tl.constexpr, BB: tl.constexpr, RB: tl.constexpr):
    """B4's sums over the batch, in a fixed order, by the programs of batch row 0: dpos_bias
    (H, T_bias) = p * sum_b R at chunk c's tokens t (one (BB, BT) tile a step; at B = 1, which
    the JIT builds apart, R itself), zeros past T (tiles c, c + nC, ...: the whole width, so
    autograd adds nothing); and (chunk 0) dtemp (H,) = the sum of B3's partials (B*H, nC), RB
    a step."""
    if HAS_BIAS:
        if B == 1:
            acc = _row(R_ptr, h, t, T)
        else:
            bb = tl.arange(0, BB)
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
        acc_t = tl.zeros((RB,), dtype=tl.float32)
        for b1 in range(0, B):
            for c0 in range(0, nC, RB):
                acc_t += tl.load(gtemp_ptr + (b1 * H + h).to(tl.int64) * nC + c0 + r, mask=(c0 + r) < nC, other=0.0)
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

KERNELS = tuple(dict.fromkeys(FORWARD + BACKWARD)) + ("_k_step",)  # each kernel once

# What one program of each chunk kernel does, for the launch model (kernels/launch_model.py:
# work(warps, token-axis scans of a tile, other reductions, each (causal, non-causal),
# divisions a value)), as the code above reads, and as its sm_90 build shows (its tt.scan and
# tt.reduce ops, its MUFU.RCP a value).
WORK = AT_88ECCCE["WORK"]  # as at 88ecccebc71c: dL/dw's warps from DW_VALUES (4 a thread now)


def described():
    """This file's kernels for the launch model: the knobs as they are now (the tests lower
    them), the scans sized to the row's chunks, and WORK."""
    return dict(name="now", BLOCK_T=BLOCK_T, TILE_VALUES=TILE_VALUES, FEATURE_BLOCK=FEATURE_BLOCK,
                SCAN_CHUNKS=SCAN_CHUNKS, SCAN_COLUMNS=SCAN_COLUMNS, BATCH_BLOCK=BATCH_BLOCK, DW_VALUES=DW_VALUES,
                scans_sized=True, scan_warps=None, dbias_b1_direct=True, WORK=WORK)


def geometry(T, p):
    """How a row of T tokens is cut (kernels/launch_model.py's geometry): nC chunks of BT tokens in (BT, P)
    tiles; dL/dw's columns in nK blocks of BK (one at p <= FEATURE_BLOCK); the scans' CB
    chunk totals and SB columns a program, their warps and steps."""
    return cut(T, p, described())


def launch_plan(B, H, T, p, dtype=torch.bfloat16, causal=True, has_mask=False, bias_width=None):
    """The launches of one forward and backward, in order, as TritonKernels runs them
    (kernels/launch_model.py's plan_for): each one's kernel, grid, warps, bytes and work a program."""
    return plan_for(described(), B, H, T, p, dtype, causal, has_mask, bias_width)


def on_device(t):
    """Launch on t's GPU (Triton launches on the current CUDA device: a tensor on cuda:1 while
    cuda:0 is current would be an illegal address); nothing to do elsewhere."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _mask_args(mask, stand_in):
    """The padding mask (B, T) bool as (pointer, strides), read as is; or an unread stand-in."""
    return (mask, mask.stride(0), mask.stride(1)) if mask is not None else (stand_in, 0, 0)


MODES = {"prefix": PREFIX.value, "suffix": SUFFIX.value, "total": TOTAL.value}


def scan_mode(mode, causal):
    """The scan launches' mode: the non-causal carries are the row's totals."""
    return MODES[mode if causal else "total"]


def scan_meta(geo, mode, causal):
    """A scan launch's constexprs and warps: CB chunk totals a step (the row's, up to
    SCAN_CHUNKS), SB columns, warps for 8 totals a thread."""
    return dict(MODE=scan_mode(mode, causal), CB=geo["CB"], SB=geo["SB"], num_warps=geo["scan_warps"])


# The module constants plan() and geometry() read: a memoised call plan is keyed on their values
# (the tests lower them), with WORK's two warps counts.
KNOBS = ("BLOCK_T", "TILE_VALUES", "FEATURE_BLOCK", "SCAN_CHUNKS", "SCAN_COLUMNS", "BATCH_BLOCK", "PARTIAL_BLOCK",
         "NUM_WARPS", "DW_VALUES", "MAX_REGISTERS")


def knob_values():
    """The values of KNOBS now, and WORK's warps for B1 and dL/dw."""
    here = globals()
    return tuple(here[k] for k in KNOBS) + (WORK["_k_grad_totals"]["warps"], WORK["_k_grad_w"]["warps"])


class CallPlan:
    """What one forward and backward launch and allocate at one shape, computed once (call_plan):
    plan (TritonKernels.plan's), geo (geometry's), the chunk launches' grid and dL/dw's, sizes (H, T,
    p, nC as the kernels take them), scans {totals: (grid, constexprs and warps, (nC, W))}, and the
    workspaces' layouts (kernels/triton_launch.py): saved (Pi, u, cS, cMN: what the forward returns,
    kept until the backward), totals (tS, tMN: the forward's, dropped after it), work (y, R, the
    dtemp partials, tG, cG, tGS, cGS: the backward's, dropped after it)."""

    def __init__(self, B, H, T, p, causal, has_mask):
        geo = geometry(T, p)
        rows, nC = B * H, geo["nC"]
        self.geo, self.plan = geo, TritonKernels.plan(p, H, causal, has_mask, T)
        self.grid, self.dw_grid, self.sizes = (rows * nC,), (rows * nC * geo["nK"],), (H, T, p, nC)
        self.scans = {tot: ((rows * triton.cdiv(W, geo["SB"]),), scan_meta(geo, mode, causal), (nC, W))
                      for tot, W, mode in (("tS", p, "prefix"), ("tMN", p + 1, "prefix"),
                                           ("tG", p + 1, "suffix"), ("tGS", p, "suffix"))}
        per_token, carry, pair = (B, H, T), (rows, nC, p), (rows, nC, p + 1)
        self.saved = layout(per_token, per_token, carry, pair)
        self.totals = layout(carry, pair)
        self.work = layout(per_token, per_token, (rows, nC), pair, pair, carry, carry)


@functools.lru_cache(maxsize=256)
def call_plan(B, H, T, p, causal, has_mask, knobs):
    """The CallPlan of a shape, memoised on (B, H, T, p, causal, a mask or not, knob_values()). Not on
    dtypes or strides: they change no plan (the outputs take w's strides from torch.empty_like, and the
    direct launches key on every argument's specialization, kernels/triton_launch.py)."""
    return CallPlan(B, H, T, p, causal, has_mask)


def _scan(tot, carry, scan, at):
    """Launch S over tot (rows, nC, W) -> carry: scan is a CallPlan's scans[name of tot]."""
    grid, meta, (nC, W) = scan
    launch(_k_scan, grid, (tot, carry, nC, W), meta, at)


@functools.lru_cache(maxsize=64)
def step_plan(H, p, knobs):
    """The decoding step's constexprs and warps (TritonKernels.plan's), memoised on (H, p, knob_values())."""
    return TritonKernels.plan(p, H, True, False)["_k_step"]


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
    def plan(p, H, causal, has_mask, T=1):
        """{kernel: its constexprs, num_warps (and maxnreg)} for every kernel of the operator
        at T tokens: forward, backward and the decoding step (the compile test builds exactly
        these; a scan's MODE is given at each launch: scan_meta)."""
        geo = geometry(T, p)
        HP = triton.next_power_of_2(H)
        tile = dict(HAS_MASK=has_mask, BT=geo["BT"], P=geo["P"], EVEN_P=geo["EVEN_P"], num_warps=NUM_WARPS)
        scan = dict(tile, CAUSAL=causal)
        return dict(_k_scan=scan_meta(geo, "prefix", causal),
                    _k_sq_totals=tile, _k_u=dict(scan, HAS_BIAS=causal), _k_pi_totals=dict(tile, HP=HP),
                    _k_out=scan, _k_grad_totals=dict(scan, num_warps=WORK["_k_grad_totals"]["warps"]),
                    _k_pi_grad=tile, _k_logit_grad=dict(scan, HP=HP),
                    _k_grad_w=dict(HAS_BIAS=causal, HAS_MASK=has_mask, CAUSAL=causal, BT=geo["BT"], BK=geo["BK"],
                                   EVEN_K=geo["EVEN_K"], BB=BATCH_BLOCK, RB=PARTIAL_BLOCK,
                                   num_warps=geo["dw_warps"], maxnreg=MAX_REGISTERS),
                    _k_step=dict(HP=HP, P=geo["P"], num_warps=max(NUM_WARPS, min(16, HP * geo["P"] // 256))))

    @staticmethod
    def shapes(w, causal):
        """Shapes of what forward returns besides out: pi and u (B, H, T), and the chunk
        carries cS (B*H, nC, p) and cMN (B*H, nC, p + 1) (kernels/triton_ops.py's fake forward too)."""
        B, H, T, p = w.shape
        nC = geometry(T, p)["nC"]
        return (B, H, T), (B * H, nC, p), (B * H, nC, p + 1)

    @classmethod
    def forward(cls, w, temp, bias, mask, causal, eps, apart=False):
        """out (w's dtype and strides), Pi and u (B, H, T) fp32, and the carries to save.
        bias: the whole position bias (H, T_max), given exactly for the causal form; mask:
        (B, T) bool or None. Three allocations: out, one for Pi, u and the carries (apart: one
        each, as a custom operator's outputs must be), one for the chunk totals."""
        if (bias is not None) != causal:
            raise ValueError("the Triton kernels take a position bias for the causal form, and only for it")
        wk, temp = cls.prepare(w), temp.float().contiguous()
        B, H, T, p = wk.shape
        call = call_plan(B, H, T, p, causal, mask is not None, knob_values())
        plan, sizes, grid = call.plan, call.sizes, call.grid
        pi, u, cS, cMN = carve(call.saved, wk.device, apart)
        tS, tMN = carve(call.totals, wk.device)
        out = torch.empty_like(wk, dtype=w.dtype)  # w's strides: merging the heads after is a view
        sw, masks = wk.stride()[:3], _mask_args(mask, u)
        bias_args = (bias, bias.stride(0), bias.stride(1)) if bias is not None else (u, 0, 0)  # u: unread
        with on_device(wk):
            at = direct_at(wk)
            launch(_k_sq_totals, grid, (wk, *sw, *masks, tS, *sizes), plan["_k_sq_totals"], at)
            _scan(tS, cS, call.scans["tS"], at)
            launch(_k_u, grid, (wk, *sw, *masks, *bias_args, cS, u, *sizes, eps[0]), plan["_k_u"], at)
            launch(_k_pi_totals, grid, (wk, *sw, *masks, temp, u, pi, tMN, *sizes), plan["_k_pi_totals"], at)
            _scan(tMN, cMN, call.scans["tMN"], at)
            launch(_k_out, grid, (wk, *sw, *masks, pi, cMN, out, *out.stride()[:3], *sizes, eps[1]), plan["_k_out"],
                   at)
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps, bias_width=0):
        """dw (w's dtype and strides), dtemp (H,) and, causal, dpos_bias (H, bias_width) fp32:
        the gradient of the whole position bias (zeros past T). Four allocations (three
        non-causal): dw, dtemp, dpos_bias, each its own (they leave for autograd, which may keep
        them as .grad), and one for y, R, the dtemp partials and the chunk totals and carries."""
        cS, cMN = saved
        wk, g, temp = cls.prepare(w), cls.prepare(g), temp.float().contiguous()
        B, H, T, p = wk.shape
        call = call_plan(B, H, T, p, causal, mask is not None, knob_values())
        plan, sizes, grid = call.plan, call.sizes, call.grid
        y, R, gtemp, tG, cG, tGS, cGS = carve(call.work, wk.device)
        dtemp = torch.empty(H, device=wk.device, dtype=torch.float32)
        dbias = torch.empty(H, bias_width, device=wk.device, dtype=torch.float32) if causal else None
        gw = torch.empty_like(wk, dtype=w.dtype)
        sw, sg, masks = wk.stride()[:3], g.stride()[:3], _mask_args(mask, R)
        with on_device(wk):
            at = direct_at(wk)
            launch(_k_grad_totals, grid, (wk, *sw, g, *sg, *masks, pi, cMN, y, tG, *sizes, eps[1]),
                   plan["_k_grad_totals"], at)
            _scan(tG, cG, call.scans["tG"], at)
            launch(_k_pi_grad, grid, (wk, *sw, *masks, pi, cG, y, *sizes), plan["_k_pi_grad"], at)
            launch(_k_logit_grad, grid, (wk, *sw, *masks, pi, u, temp, y, cS, R, gtemp, tGS, *sizes, eps[0]),
                   plan["_k_logit_grad"], at)
            _scan(tGS, cGS, call.scans["tGS"], at)
            launch(_k_grad_w, call.dw_grid, (wk, *sw, g, *sg, *masks, pi, R, gtemp, cS, cMN, cG, cGS, gw,
                                             *gw.stride()[:3], dtemp, R if dbias is None else dbias, B, H, T,
                                             bias_width, p, sizes[3], call.geo["nK"], *eps), plan["_k_grad_w"], at)
        return gw, dtemp, dbias

    @classmethod
    def step(cls, w_t, temp, bias, state, eps):
        B, H, p = w_t.shape
        x = w_t.contiguous()
        out = torch.empty_like(x)
        pi = torch.empty(B, H, device=x.device, dtype=torch.float32)
        bias = bias.float()
        with on_device(x):
            launch(_k_step, (B,), (x, temp.float().contiguous(), bias, bias.stride(0), state.sum_sq, state.sum_pi_sq,
                                   state.sum_pi, out, pi, H, p, *eps), step_plan(H, p, knob_values()), direct_at(x))
        return out, pi
