"""
Triton kernels of TSSA (CUDA; TRITON_INTERPRET=1 runs them on the CPU, slowly: that is how the
tests run them). Imported only when tssa_impl="triton" asks for them; kernels/fused.py falls
back to model.py's reference, with a warning, when Triton is missing or a launch fails.
"""

import os

import torch
import triton
import triton.language as tl

BLOCK_T = 64  # tokens per chunk (tile height; fewer when p is large)
# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this file is imported
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# -----------------------------------------------------------------------------
# Chunked kernels
#
# Tokens are cut into chunks of BT; every kernel loads (BT, P) tiles of w (P = p rounded up
# to a power of two, masked). A running sum over tokens is (scan inside the tile) + (carry:
# the sum of the earlier chunks' totals, or of the later ones in the backward, or the total
# for the non-causal form). Each pass that needs carries is preceded by one that writes chunk
# totals, turned into carries by _k_carry. Five launches each way:
#   forward : F1 chunk totals of w^2 | carry | F2 all heads: r, u, Pi (softmax across heads,
#             online), chunk totals of Pi w^2 and Pi | carry | F3 out
#   backward: B1 chunk totals of dL/dM, dL/dN | carry | B2 all heads: dL/dPi, softmax backward,
#             R, dtemp partials, chunk totals of dL/dS | carry | B3 dL/dw
# F1, F3, B1, B3 run one program per (batch row b, head h, chunk); F2 and B2 one per (b, chunk)
# looping over the heads, because the softmax couples them. Statistics in fp32; w, out, g, dw
# in their own dtype. Programs write only their own tiles and chunk totals: no atomics, and
# the results do not depend on scheduling.


@triton.jit
def _pids(BH):
    """(row b * H + h, chunk) of this program. A 1-D grid, rows fastest: CUDA caps the 2nd
    and 3rd grid dimensions at 65535, which a 2-D (B * H, nC) grid passes at T = 4M."""
    pid = tl.program_id(0)
    return pid % BH, pid // BH

@triton.jit
def _tile_offsets(s_b, s_h, s_t, pid_bh, H, t0, T, p, BT: tl.constexpr, P: tl.constexpr):
    """Offsets and mask of the (BT, P) tile at tokens t0.. of a (B, H, T, p) tensor."""
    b, h = pid_bh // H, pid_bh % H
    t = t0 + tl.arange(0, BT)
    i = tl.arange(0, P)
    offs = b.to(tl.int64) * s_b + h.to(tl.int64) * s_h + t[:, None].to(tl.int64) * s_t + i[None, :]
    return offs, (t[:, None] < T) & (i[None, :] < p)

@triton.jit
def _tile(ptr, s_b, s_h, s_t, pid_bh, H, t0, T, p, BT: tl.constexpr, P: tl.constexpr):
    """Load the (BT, P) tile of a (B, H, T, p) tensor at tokens t0.., as fp32, zero-padded."""
    offs, m = _tile_offsets(s_b, s_h, s_t, pid_bh, H, t0, T, p, BT, P)
    return tl.load(ptr + offs, mask=m, other=0.0).to(tl.float32)

@triton.jit
def _store_tile(ptr, x, s_b, s_h, s_t, pid_bh, H, t0, T, p, BT: tl.constexpr, P: tl.constexpr):
    """Store a (BT, P) fp32 tile into a (B, H, T, p) tensor of ptr's dtype."""
    offs, m = _tile_offsets(s_b, s_h, s_t, pid_bh, H, t0, T, p, BT, P)
    tl.store(ptr + offs, x.to(ptr.dtype.element_ty), mask=m)

@triton.jit
def _row(ptr, pid_bh, t0, T, BT: tl.constexpr):
    """Tokens t0.. of row pid_bh of a contiguous (B*H, T) fp32 tensor (0 past T)."""
    t = t0 + tl.arange(0, BT)
    return tl.load(ptr + pid_bh.to(tl.int64) * T + t, mask=t < T, other=0.0)

@triton.jit
def _store_row(ptr, x, pid_bh, t0, T, BT: tl.constexpr):
    t = t0 + tl.arange(0, BT)
    tl.store(ptr + pid_bh.to(tl.int64) * T + t, x, mask=t < T)

@triton.jit
def _carry(ptr, pid_bh, c, nC, W, p, P: tl.constexpr):
    """The (p,) carry of chunk c from a contiguous (B*H, nC, W) fp32 tensor (W = p or p + 1)."""
    i = tl.arange(0, P)
    return tl.load(ptr + (pid_bh.to(tl.int64) * nC + c) * W + i, mask=i < p, other=0.0)

@triton.jit
def _carry_n(ptr, pid_bh, c, nC, p):
    """The scalar carry kept in column p of a (B*H, nC, p + 1) tensor."""
    return tl.load(ptr + (pid_bh.to(tl.int64) * nC + c) * (p + 1) + p)

@triton.jit
def _store_total(ptr, x, pid_bh, c, nC, W, p, P: tl.constexpr):
    """Chunk total of a (BT, P) tile into columns 0..p-1 of a (B*H, nC, W) tensor."""
    i = tl.arange(0, P)
    tl.store(ptr + (pid_bh.to(tl.int64) * nC + c) * W + i, tl.sum(x, axis=0), mask=i < p)

@triton.jit
def _store_total_n(ptr, x, pid_bh, c, nC, p):
    """Chunk total of a (BT,) row into column p of a (B*H, nC, p + 1) tensor."""
    tl.store(ptr + (pid_bh.to(tl.int64) * nC + c) * (p + 1) + p, tl.sum(x, axis=0))

@triton.jit
def _k_carry(part_ptr, out_ptr, nC, W, MODE: tl.constexpr, CB: tl.constexpr, WB: tl.constexpr):
    """Carries from chunk totals: part and out are contiguous (rows, nC, W) fp32; one program
    per (row, WB columns) walks the chunks CB at a time. MODE 0: the sum of the EARLIER
    chunks (causal forward); 1: of the LATER chunks (causal backward); 2: the total."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * WB + tl.arange(0, WB)
    run = tl.zeros((WB,), dtype=tl.float32)
    a = tl.arange(0, CB)
    for k in range(0, nC, CB):
        step = -1 if MODE == 1 else 1  # MODE 1 walks backwards: its scan is a suffix scan
        cc = (nC - 1 - k - a) if MODE == 1 else (k + a)
        m = (cc[:, None] >= 0) & (cc[:, None] < nC) & (j[None, :] < W)
        offs = (row * nC + cc[:, None]) * W + j[None, :]
        x = tl.load(part_ptr + offs, mask=m, other=0.0)
        if MODE != 2:
            # exclusive scan = scan of the totals shifted by one chunk; not (inclusive - own
            # total), which loses the small carries after a large chunk total
            before = tl.load(part_ptr + offs - step * W, mask=m & (a[:, None] > 0), other=0.0)
            tl.store(out_ptr + offs, run[None, :] + tl.cumsum(before, axis=0), mask=m)
        run += tl.sum(x, axis=0)
    if MODE == 2:
        for k in range(0, nC, CB):
            cc = k + tl.arange(0, CB)
            m = (cc[:, None] < nC) & (j[None, :] < W)
            offs = (row * nC + cc[:, None]) * W + j[None, :]
            tl.store(out_ptr + offs, tl.zeros((CB, WB), dtype=tl.float32) + run[None, :], mask=m)

@triton.jit
def _running_sq(q, cS_ptr, pid_bh, c, nC, p, CAUSAL: tl.constexpr, P: tl.constexpr):
    """S (BT, P): the sum of w^2 over tokens <= t (over all tokens if not CAUSAL)."""
    S = _carry(cS_ptr, pid_bh, c, nC, p, p, P)[None, :]
    if CAUSAL:
        S = S + tl.cumsum(q, axis=0)
    return S

@triton.jit
def _mn(q, Pt, cMN_ptr, pid_bh, c, nC, p, stat_eps, CAUSAL: tl.constexpr, P: tl.constexpr):
    """M (BT, P) = running sum of Pi w^2 and n (BT, 1) = running sum of Pi + stat_eps."""
    M = _carry(cMN_ptr, pid_bh, c, nC, p + 1, p, P)[None, :]
    N = _carry_n(cMN_ptr, pid_bh, c, nC, p)
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
def _suffix_gm(x, g, Pt, M, n, cGMN_ptr, pid_bh, c, nC, p, CAUSAL: tl.constexpr, P: tl.constexpr):
    """Suffix sums G_M (BT, P), G_N (BT,) of dL/dM, dL/dN over tokens >= t, and D."""
    gM, gN, D = _gm(x, g, Pt, M, n)
    GM = _carry(cGMN_ptr, pid_bh, c, nC, p + 1, p, P)[None, :]
    GN = _carry_n(cGMN_ptr, pid_bh, c, nC, p) + tl.zeros_like(gN)
    if CAUSAL:
        GM = GM + tl.cumsum(gM, axis=0, reverse=True)
        GN = GN + tl.cumsum(gN, axis=0, reverse=True)
    return GM, GN, D

@triton.jit
def _k_sum_q(w_ptr, s_b, s_h, s_t, part_ptr, H, T, p, nC, BH, BT: tl.constexpr, P: tl.constexpr):
    """F1: chunk totals of w^2 -> part (B*H, nC, p)."""
    pid_bh, c = _pids(BH)
    x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
    _store_total(part_ptr, x * x, pid_bh, c, nC, p, p, P)

@triton.jit
def _logit(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, b, h, c, H, T, p, nC, sq_floor,
           HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """Head h of chunk c of row b: w^2 (BT, P), u = r + p * bias (BT,) and logit = temp * u."""
    x = _tile(w_ptr, s_b, s_h, s_t, b * H + h, H, c * BT, T, p, BT, P)
    q = x * x
    u = tl.sum(q / tl.maximum(_running_sq(q, cS_ptr, b * H + h, c, nC, p, CAUSAL, P), sq_floor), axis=1)
    if HAS_BIAS:
        t = c * BT + tl.arange(0, BT)
        u += p * tl.load(bias_ptr + h * bias_h + t * bias_t, mask=t < T, other=0.0).to(tl.float32)
    return q, u, tl.load(temp_ptr + h) * u

@triton.jit
def _k_stats_pi(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, mask_ptr, u_ptr, pi_ptr,
                part_ptr, B, H, T, p, nC, sq_floor, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """F2, one program per (b, chunk): u and Pi (B, H, T) for every head, and the chunk
    totals of Pi w^2 (columns 0..p-1) and of Pi (column p) -> part (B*H, nC, p + 1)."""
    pid = tl.program_id(0)
    b, c = pid % B, pid // B
    t = c * BT + tl.arange(0, BT)
    top = tl.full((BT,), float("-inf"), dtype=tl.float32)
    den = tl.zeros((BT,), dtype=tl.float32)
    for h in range(H):  # pass 1: max and sum of exp over the heads, online
        _, _, lg = _logit(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, b, h, c, H, T, p,
                          nC, sq_floor, HAS_BIAS, CAUSAL, BT, P)
        new_top = tl.maximum(top, lg)
        den = den * tl.exp(top - new_top) + tl.exp(lg - new_top)
        top = new_top
    keep = t < T  # tokens past T must add nothing to the totals
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + b.to(tl.int64) * T + t, mask=t < T, other=0.0) != 0)
    for h in range(H):  # pass 2: Pi, recomputing the logits (the tiles are hot in cache)
        q, u, lg = _logit(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, b, h, c, H, T, p,
                          nC, sq_floor, HAS_BIAS, CAUSAL, BT, P)
        Pt = tl.where(keep, tl.exp(lg - top) / den, 0.0)
        _store_row(u_ptr, u, b * H + h, c * BT, T, BT)
        _store_row(pi_ptr, Pt, b * H + h, c * BT, T, BT)
        _store_total(part_ptr, Pt[:, None] * q, b * H + h, c, nC, p + 1, p, P)
        _store_total_n(part_ptr, Pt, b * H + h, c, nC, p)

@triton.jit
def _k_apply(w_ptr, s_b, s_h, s_t, pi_ptr, cMN_ptr, out_ptr, o_b, o_h, o_t, H, T, p, nC, BH, stat_eps,
             CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """F3: out = -Pi w n / (n + M)."""
    pid_bh, c = _pids(BH)
    x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
    Pt = _row(pi_ptr, pid_bh, c * BT, T, BT)
    M, n = _mn(x * x, Pt, cMN_ptr, pid_bh, c, nC, p, stat_eps, CAUSAL, P)
    _store_tile(out_ptr, -Pt[:, None] * x * n / (n + M), o_b, o_h, o_t, pid_bh, H, c * BT, T, p, BT, P)

@triton.jit
def _k_sum_gm(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, cMN_ptr, part_ptr, H, T, p, nC, BH, stat_eps,
              CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """B1: chunk totals of dL/dM (columns 0..p-1) and dL/dN (column p) -> part (B*H, nC, p + 1)."""
    pid_bh, c = _pids(BH)
    x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
    g = _tile(g_ptr, g_b, g_h, g_t, pid_bh, H, c * BT, T, p, BT, P)
    Pt = _row(pi_ptr, pid_bh, c * BT, T, BT)
    M, n = _mn(x * x, Pt, cMN_ptr, pid_bh, c, nC, p, stat_eps, CAUSAL, P)
    gM, gN, _ = _gm(x, g, Pt, M, n)
    _store_total(part_ptr, gM, pid_bh, c, nC, p + 1, p, P)
    _store_total_n(part_ptr, gN, pid_bh, c, nC, p)

@triton.jit
def _k_grad_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, u_ptr, temp_ptr, mask_ptr, cS_ptr, cMN_ptr,
               cGMN_ptr, gpi_ptr, R_ptr, gtemp_ptr, part_ptr, B, H, T, p, nC, sq_floor, stat_eps, HAS_MASK: tl.constexpr,
               CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """B2, one program per (b, chunk): dL/dPi for every head (scratch gpi), the softmax
    backward across heads, R = temp * dL/dlogit (B, H, T), this program's share of dL/dtemp
    -> gtemp (B*nC, H), and the chunk totals of dL/dS -> part (B*H, nC, p)."""
    pid = tl.program_id(0)
    b, c = pid % B, pid // B
    t = c * BT + tl.arange(0, BT)
    if HAS_MASK:
        keep = tl.load(mask_ptr + b.to(tl.int64) * T + t, mask=t < T, other=0.0)
    dot = tl.zeros((BT,), dtype=tl.float32)  # sum over heads of Pi dL/dPi
    for h in range(H):  # pass 1: dL/dPi
        bh = b * H + h
        x = _tile(w_ptr, s_b, s_h, s_t, bh, H, c * BT, T, p, BT, P)
        g = _tile(g_ptr, g_b, g_h, g_t, bh, H, c * BT, T, p, BT, P)
        Pt = _row(pi_ptr, bh, c * BT, T, BT)
        M, n = _mn(x * x, Pt, cMN_ptr, bh, c, nC, p, stat_eps, CAUSAL, P)
        GM, GN, D = _suffix_gm(x, g, Pt, M, n, cGMN_ptr, bh, c, nC, p, CAUSAL, P)
        gpi = tl.sum(-g * x * D + GM * (x * x), axis=1) + GN
        if HAS_MASK:
            gpi = gpi * keep
        _store_row(gpi_ptr, gpi, bh, c * BT, T, BT)
        dot += Pt * gpi
    tl.debug_barrier()  # pass 2 reads gpi rows that other threads of this program wrote
    for h in range(H):  # pass 2: softmax backward and the S path
        bh = b * H + h
        Pt = _row(pi_ptr, bh, c * BT, T, BT)
        gl = Pt * (_row(gpi_ptr, bh, c * BT, T, BT) - dot)  # dL/dlogit
        Rt = tl.load(temp_ptr + h) * gl
        _store_row(R_ptr, Rt, bh, c * BT, T, BT)
        tl.store(gtemp_ptr + pid.to(tl.int64) * H + h, tl.sum(gl * _row(u_ptr, bh, c * BT, T, BT), axis=0))
        x = _tile(w_ptr, s_b, s_h, s_t, bh, H, c * BT, T, p, BT, P)
        q = x * x
        _, gS = _grad_s(q, Rt[:, None], _running_sq(q, cS_ptr, bh, c, nC, p, CAUSAL, P), sq_floor)
        _store_total(part_ptr, gS, bh, c, nC, p, p, P)

@triton.jit
def _k_grad_w(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, R_ptr, cS_ptr, cMN_ptr, cGMN_ptr, cGS_ptr,
              gw_ptr, o_b, o_h, o_t, H, T, p, nC, BH, sq_floor, stat_eps, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
    """B3: dL/dw = Pi (2 w G_M - D g) + 2 w (R A + G_S)."""
    pid_bh, c = _pids(BH)
    x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
    g = _tile(g_ptr, g_b, g_h, g_t, pid_bh, H, c * BT, T, p, BT, P)
    Pt = _row(pi_ptr, pid_bh, c * BT, T, BT)
    Rt = _row(R_ptr, pid_bh, c * BT, T, BT)[:, None]
    q = x * x
    M, n = _mn(q, Pt, cMN_ptr, pid_bh, c, nC, p, stat_eps, CAUSAL, P)
    GM, _, D = _suffix_gm(x, g, Pt, M, n, cGMN_ptr, pid_bh, c, nC, p, CAUSAL, P)
    A, gS = _grad_s(q, Rt, _running_sq(q, cS_ptr, pid_bh, c, nC, p, CAUSAL, P), sq_floor)
    GS = _carry(cGS_ptr, pid_bh, c, nC, p, p, P)[None, :]
    if CAUSAL:
        GS = GS + tl.cumsum(gS, axis=0, reverse=True)
    gw = Pt[:, None] * (2.0 * x * GM - D * g) + 2.0 * x * (Rt * A + GS)
    _store_tile(gw_ptr, gw, o_b, o_h, o_t, pid_bh, H, c * BT, T, p, BT, P)

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


CARRY_MODES = {"prefix": 0, "suffix": 1, "total": 2}


def _carries(part, mode):
    """Carries (rows, nC, W) from chunk totals (rows, nC, W): see _k_carry."""
    rows, nC, W = part.shape
    out = torch.empty_like(part)
    WB = min(128, triton.next_power_of_2(W))
    _k_carry[(rows, triton.cdiv(W, WB))](part, out, nC, W, MODE=CARRY_MODES[mode], CB=16, WB=WB)
    return out


class TritonKernels:
    """The five-kernel forward and backward above (out, Pi, u, saved carries), and the decoding
    step, for kernels/fused.py's FusedTSSA. eps = (sq_floor, stat_eps), as model.py defines them."""

    name = "triton"

    @staticmethod
    def load():  # importing this file imported Triton: nothing more to build before a launch
        pass

    @staticmethod
    def unsupported(w):
        """Why these kernels cannot run w, or None."""
        if w.device.type == "cuda" or INTERPRET:
            return None
        return f"the Triton kernels take CUDA tensors, got a {w.device.type} tensor (TRITON_INTERPRET=1 runs them on the CPU)"

    @staticmethod
    def prepare(w):  # any float dtype is read as is; unit stride along p
        return w if w.stride(-1) == 1 else w.contiguous()

    @staticmethod
    def meta(p):
        """Tile (BT tokens, P features) and warps for head width p. ~10 live (BT, P) fp32
        tiles in the backward kernels: 8 warps hold a 64 x 64 tile at 16 registers a thread
        per tile instead of 32 (no spills; tests compile them for sm_90). Not tuned on a GPU."""
        P = triton.next_power_of_2(p)
        BT = max(16, min(BLOCK_T, 4096 // P))  # a tile of at most 4K fp32 values (8K spills at p = 128)
        return dict(BT=BT, P=P, num_warps=8 if BT * P >= 4096 else 4)

    @classmethod
    def _setup(cls, wk):
        B, H, T, p = wk.shape
        meta = cls.meta(p)
        nC = triton.cdiv(T, meta["BT"])
        buf = lambda *shape: torch.empty(*shape, device=wk.device, dtype=torch.float32)
        # grids: one program per (b, h, chunk), and one per (b, chunk) for the all-heads kernels
        return meta, nC, (B * H * nC,), (B * nC,), buf

    @classmethod
    def forward(cls, w, temp, bias, mask, causal, eps):
        wk = cls.prepare(w)
        B, H, T, p = wk.shape
        meta, nC, per_head, per_row, buf = cls._setup(wk)
        sw = wk.stride()[:3]
        part_S = buf(B * H, nC, p)
        _k_sum_q[per_head](wk, *sw, part_S, H, T, p, nC, B * H, **meta)
        cS = _carries(part_S, "prefix" if causal else "total")
        u, pi, part_MN = buf(B, H, T), buf(B, H, T), buf(B * H, nC, p + 1)
        temp = temp.reshape(H).float().contiguous()
        has_bias, has_mask = bias is not None, mask is not None
        bias_args = (bias, bias.stride(0), bias.stride(1)) if has_bias else (u, 0, 0)  # u: an unread stand-in
        mask = mask.float().contiguous() if has_mask else u
        _k_stats_pi[per_row](wk, *sw, cS, temp, *bias_args, mask, u, pi, part_MN, B, H, T, p, nC, eps[0],
                             HAS_BIAS=has_bias, HAS_MASK=has_mask, CAUSAL=causal, **meta)
        cMN = _carries(part_MN, "prefix" if causal else "total")
        out = torch.empty_like(wk, dtype=w.dtype)
        _k_apply[per_head](wk, *sw, pi, cMN, out, *out.stride()[:3], H, T, p, nC, B * H, eps[1], CAUSAL=causal,
                           **meta)
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps):
        cS, cMN = saved
        wk, g = cls.prepare(w), cls.prepare(g)
        B, H, T, p = wk.shape
        meta, nC, per_head, per_row, buf = cls._setup(wk)
        sw, sg = wk.stride()[:3], g.stride()[:3]
        part_GMN = buf(B * H, nC, p + 1)
        _k_sum_gm[per_head](wk, *sw, g, *sg, pi, cMN, part_GMN, H, T, p, nC, B * H, eps[1], CAUSAL=causal,
                            **meta)
        cGMN = _carries(part_GMN, "suffix" if causal else "total")
        gpi, R, gtemp, part_S = buf(B, H, T), buf(B, H, T), buf(B * nC, H), buf(B * H, nC, p)
        temp = temp.reshape(H).float().contiguous()
        has_mask = mask is not None
        mask = mask.float().contiguous() if has_mask else gpi  # gpi: an unread stand-in
        _k_grad_pi[per_row](wk, *sw, g, *sg, pi, u, temp, mask, cS, cMN, cGMN, gpi, R, gtemp, part_S,
                            B, H, T, p, nC, *eps, HAS_MASK=has_mask, CAUSAL=causal, **meta)
        cGS = _carries(part_S, "suffix" if causal else "total")
        gw = torch.empty_like(wk, dtype=w.dtype)
        _k_grad_w[per_head](wk, *sw, g, *sg, pi, R, cS, cMN, cGMN, cGS, gw, *gw.stride()[:3], H, T, p, nC, B * H,
                            *eps, CAUSAL=causal, **meta)
        return gw, gtemp.sum(0), (p * R.sum(0) if causal else None)  # dbias = p * temp * sum_b gl

    @staticmethod
    def step(w_t, temp, bias, state, eps):
        B, H, p = w_t.shape
        x = w_t.contiguous()
        out = torch.empty_like(x)
        pi = torch.empty(B, H, device=x.device, dtype=torch.float32)
        bias = bias.float()
        _k_step[(B,)](x, temp.float().contiguous(), bias, bias.stride(0), state.sum_sq, state.sum_pi_sq,
                      state.sum_pi, out, pi, H, p, *eps, HP=triton.next_power_of_2(H), P=triton.next_power_of_2(p))
        return out, pi

