"""
Causal TSSA re-tiled (issue 52, item 2): Triton kernels where a program owns every head of a
chunk of tokens and walks the chunk's tokens one row at a time, the running sums carried in
registers. Beside kernels/triton_tssa.py, whose kernels stay as they are until a GPU has measured
these faster; selected only by name, never by a script's tssa_impl ("triton" still means today's):
    ops = kernels.fused.fused_ops("triton_retiled")    # model.TSSAOperators, as fused_ops("triton")
    ops.causal_tssa(w, temp, pos_bias, return_pi=True)
The non-causal tssa and the decoding step run today's kernels (triton_tssa.TritonKernels), as do
heads whose width is not a multiple of 16 and rows too wide for one program (applies()). Under
torch.compile the path is the eager one behind a graph break (triton_ops.py registers today's only).

Layout. A program per (batch row, chunk of BT tokens), 1-D grid, chunks fastest. Its tile is one
token's row of every head, (HP, P) = (heads, width) padded to powers of two, one 16-byte vector of
one head a thread (warps = HP * P / (32 * 8) for bf16: 4 for 12 heads of 64; twice that for fp32);
the chunk's BT rows are walked in order (tl.range, STAGES deep: Triton 3.6 and 3.9 copy the next
rows with cp.async), and every running sum over tokens is a loop-carried (HP, P) register tile: a
chain of in-thread adds, no token-axis scan, no shuffle along tokens. What crosses threads is
per row: a sum over a head's features (in-thread adds, then 3 shuffles) and, where the heads meet,
a reduction over heads (the softmax of Pi forward, its backward): inside the program, so no
per-token scalar goes through HBM to be read by another head's program.

Passes, launches (10) and what each moves (maths: kernels/__init__.py; q = w^2):
  forward  F1 _r_sq_totals   w                      -> chunk totals of q                  tS
           S  _r_scan        tS                     -> prefix carries                     cS
           F2 _r_pi          w, cS, bias            -> u, Pi (softmax over the heads in the program),
                                                       chunk totals of Pi q, Pi           tMN
           S  _r_scan        tMN                    -> prefix carries                     cMN
           F3 _r_out         w, Pi, cMN             -> out
  backward B1 _r_grad_totals w, g, Pi, cMN (twice)  -> chunk totals of dL/dM, dL/dN       tG
                                                       y (dL/dPi but for the later chunks' part)
           S  _r_scan        tG                     -> suffix carries                     cG
           B2 _r_logit_grad  w, y, Pi, u, cS, cG    -> dL/dPi, the softmax backward over the heads
                                                       in the program: R = temp dL/dlogit, dtemp
                                                       partials; chunk totals of dL/dS    tGS
           S  _r_scan        tGS                    -> suffix carries                     cGS
           B3 _r_grad_w      w, g, Pi, R, cS, cMN,  -> dL/dw; the programs of batch row 0 also sum
                             cG, tG, cGS, tGS          dpos_bias over the batch, and dtemp
Every pass walks its chunk forward and recomputes what it needs from w, g and the carries (S, A,
M, N, D, dL/dM, dL/dN, dL/dS): nothing the size of w besides w, g, out and dw touches HBM. The
forward saves Pi, u (B, H, T) and the carries cS (B, nC, H p), cMN (B, nC, H p + H): about 2/BT of
w's size in fp32, as today's. launch_plan() states every launch's grid, warps, bytes and work a
program; modelled_time_s() prices it (kernels/launch_model.py: MODELLED, NOT MEASURED).
The host's part of a call is today's kernels' (kernels/triton_launch.py; NOT MEASURED on a GPU): a
memoised call_plan() per (B, H, T, p, w's dtype, the knobs' values), 3 allocations forward and 4
backward, and each launch after its kernel's first at a specialization made without Triton's JIT
dispatch.

The suffix sums, walked forward. The backward needs at token t the sums over tokens >= t of dL/dM,
dL/dN and dL/dS (G_M, G_N, G_S) beside the prefix sums S, M, N. A forward walk has the prefixes
exactly, and a suffix as (the chunk's total) - (its terms before t) + (the later chunks' carry).
In plain fp32 that subtraction costs what the earlier terms' rounding is worth, and they can be
orders larger than the suffix: dL/dM and dL/dN grow as 1 / N at a row's first tokens and nearly
cancel in dL/dPi when D is small (features of 1e3: today's kernels 3e-6 from float64, a plain
difference 2e-4); dL/dS = -R q / S^2 is 1e6 times the later terms at a first token with a feature
of 1e-3, 1e12 just above the floor. So each chunk total is a (hi, lo) pair (_add_exact: two-sum,
renormalised, ~2^-47 of its magnitude) and each suffix starts from the pair plus the carry and
takes the chunk's terms out one by one, in order: B1 walks its chunk twice (the totals of dL/dM,
dL/dN, then y with the exact in-chunk suffixes; the second walk re-reads rows read a moment
before, from L2), B2 adds dL/dS into its pair, and B3 takes B1's dL/dM and B2's dL/dS terms out of
theirs. A term taken out must be the term put in, bit for bit: the same helper on the same inputs
(_d_and_grad_m, _grad_s; B1's dL/dN, a sum over features, kept in memory between its walks), and
B1-B3 launched with enable_fp_fusion=False, so that no compiler contracts a multiply into an add
in one and not the other (the build test checks their PTX holds no fma; a contraction left to
chance would leave an error of 2^-24 of the large terms).
Carries are never a total minus a chunk's own (the scans load the totals shifted by one chunk).
Padding past T: rows past T load zeros and get Pi = 0, hence no part in any sum.

Determinism: every value is one program's sums in an order fixed by the shapes (the rows of a
chunk in order, the scans' steps, dpos_bias's batch rows in order), no atomics, and no two
programs write one address: the same bits in any program order (the tests run them reversed).

Knobs (module constants, read at call time: the tests lower them): BLOCK_T tokens a chunk (32: 512
programs at B1 T16K, ~4 an SM; 64 would move 7% fewer bytes, 285 MB against 308, with half the
programs); STAGES the depth of the row loop's software pipeline (B1 one less: the GPU must say what
keeps enough in flight); VECTOR_BYTES, MAX_WARPS and MAX_REGISTERS; the scans' SCAN_CHUNKS and
SCAN_COLUMNS; PARTIAL_BLOCK (dtemp's partials a step).

    python -m pytest -q tests/test_triton_retiled.py    # the interpreter, the plan
    python -m pytest -q tests/test_triton_builds.py     # sm_90 builds under both Tritons
"""

import functools

import torch
import triton
import triton.language as tl

from kernels import launch_model
from kernels import triton_tssa
from kernels.triton_launch import carve, direct_at, launch, layout
from kernels.launch_model import COPY_RATE, modelled_time_s  # noqa: F401  (kernel_times' model_gpu reads COPY_RATE)

BLOCK_T = 32  # tokens a chunk: the rows a program walks
STAGES = 3  # software-pipeline stages of the row loop (cp.async of the next rows where Triton can)
VECTOR_BYTES = 16  # of a row's (HP, P) tile a thread: one load's vector of one head (8 bf16, 4 fp32)
MAX_WARPS = 16  # a program's, at most: wider rows (HP * P > 16 warps of a vector a thread) run today's kernels
MAX_REGISTERS = 128  # B1's registers a thread, said to ptxas: ptxas 12.8 (Triton 3.6's) capped an 8-warp B1
# at 64 otherwise, and spilled; the other passes keep what ptxas picks (the build test: <= 128, no spill)
SCAN_CHUNKS = 256  # chunk totals a scan program adds a step, at most (as many as the row has, below that)
SCAN_COLUMNS = 8  # columns of the totals a scan program owns
SCAN_VALUES_PER_WARP = 256  # a scan's warps: 8 totals a thread
PARTIAL_BLOCK = 64  # dtemp partials (batch row x chunk) the last reduction loads a step
INTERPRET = triton_tssa.INTERPRET

FORWARD = ("_r_sq_totals", "_r_scan", "_r_pi", "_r_scan", "_r_out")
BACKWARD = ("_r_grad_totals", "_r_scan", "_r_logit_grad", "_r_scan", "_r_grad_w")
KERNELS = tuple(dict.fromkeys(FORWARD + BACKWARD))  # each kernel once
EXACT_TERMS = ("_r_grad_totals", "_r_logit_grad", "_r_grad_w")  # no fp fusion: the same terms in each

# what a scan launch writes for chunk c: the sum of the totals of the chunks before c, or after c
PREFIX, SUFFIX = tl.constexpr(0), tl.constexpr(1)


# -----------------------------------------------------------------------------
# Rows, per-token scalars, chunk arrays. The row loops address a row as loop-invariant pointers
# plus the token's offset, and mask it with tl.where(t < T, ...): no integer arithmetic on tiles a
# row, and no block & scalar-bool (which the interpreter of Triton 3.9 turns into int32).


@triton.jit
def _ids(nC):
    """(b, c) of this program: chunks fastest."""
    pid = tl.program_id(0)
    return pid // nC, pid % nC


@triton.jit
def _row_geometry(H, p, HP: tl.constexpr, P: tl.constexpr, EVEN_P: tl.constexpr):
    """hh (HP,); where a row's (HP, P) tile exists (heads < H, columns < p: the same along a
    thread's columns when EVEN_P, so that they move as vectors); the offsets of each head's
    columns in a chunk array's row (HP, P)."""
    hh = tl.arange(0, HP)
    cols = tl.arange(0, P)
    if EVEN_P:  # against the constexpr: true along every aligned group of columns
        inside = (hh < H)[:, None] & (cols < P)[None, :]
    else:
        inside = (hh < H)[:, None] & (cols < p)[None, :]
    return hh, inside, hh[:, None] * p + cols[None, :]


@triton.jit
def _rows(ptr, b, s_b, s_h, HP: tl.constexpr, P: tl.constexpr):
    """Pointers (HP, P) to token 0 of batch row b of a (B, H, T, p) tensor (head stride s_h, unit
    along p); token t's row is these + t * s_t."""
    return ptr + b.to(tl.int64) * s_b + tl.arange(0, HP)[:, None].to(tl.int64) * s_h + tl.arange(0, P)[None, :]


@triton.jit
def _heads(ptr, b, H, T, HP: tl.constexpr):
    """Pointers (HP,) to token 0 of every head of batch row b of a contiguous (B, H, T) tensor."""
    return ptr + (b * H + tl.arange(0, HP)).to(tl.int64) * T


@triton.jit
def _chunk_at(b, c, nC, W, PARTS: tl.constexpr, part: tl.constexpr):
    """Offset of part `part` of chunk c, row b, of a contiguous (B, nC, PARTS, W) fp32 chunk array."""
    return ((b * nC + c).to(tl.int64) * PARTS + part) * W


@triton.jit
def _load_chunk(ptr, at, cols_at, inside):
    return tl.load(ptr + at + cols_at, mask=inside, other=0.0)


@triton.jit
def _load_chunk_heads(ptr, at, Hp, hh, H):
    """The per-head values that follow the H * p per-value ones in a chunk array's row."""
    return tl.load(ptr + at + Hp + hh, mask=hh < H, other=0.0)


# -----------------------------------------------------------------------------
# The maths shared by passes


@triton.jit
def _add_exact(hi, lo, x):
    """(hi, lo) + x, renormalised: a sum of fp32 terms kept to ~2^-47 of its magnitude (two-sum
    of hi and x, its error added to lo; exact only without fp fusion)."""
    s = hi + x
    bb = s - hi
    err = ((hi - (s - bb)) + (x - bb)) + lo
    top = s + err
    return top, err - (top - s)


@triton.jit
def _suffix_start(pair_ptr, pair_at, W, carry_ptr, carry_at, cols_at, inside):
    """A chunk's (hi, lo) total (its parts W apart) plus the later chunks' carry: the suffix sum at
    the chunk's first token, as a (hi, lo) pair (HP, P)."""
    hi = _load_chunk(pair_ptr, pair_at, cols_at, inside)
    lo = _load_chunk(pair_ptr, pair_at + W, cols_at, inside)
    return _add_exact(hi, lo, _load_chunk(carry_ptr, carry_at, cols_at, inside))


@triton.jit
def _grad_s(q, R, S, sq_floor):
    """A = 1 / max(S, floor) and dL/dS = -R q A^2 (none where the floor holds: torch's clamp_min).
    B2 and B3 call this on the same inputs: the same bits in both (no fp fusion in either)."""
    A = 1.0 / tl.maximum(S, sq_floor)
    return A, tl.where(S >= sq_floor, -R * q * A * A, 0.0)


@triton.jit
def _d_and_grad_m(x, g, pi, M, N, stat_eps):
    """At one row: D = n / (n + M) (HP, P), 1 / n (HP,), g w D and dL/dM = g w D^2 Pi / n; n = N + eps.
    B1 (twice) and B3 call this on the same inputs: the same bits (no fp fusion in either)."""
    n = N + stat_eps
    inv_n = 1.0 / n  # a division a head, not a value
    D = n[:, None] / (n[:, None] + M)
    e = g * x * D  # -dL/dPi's direct part, before its sum over features
    return D, inv_n, e, e * D * (pi * inv_n)[:, None]


# -----------------------------------------------------------------------------
# The scans of the chunk totals


@triton.jit
def _r_scan(tot_ptr, carry_ptr, nC, W, MODE: tl.constexpr, PARTS: tl.constexpr, CB: tl.constexpr,
            SB: tl.constexpr):
    """S: carries from chunk totals, (rows, nC, PARTS, W) -> (rows, nC, W): the sum of the totals
    (of both parts of a (hi, lo) pair) before chunk c (PREFIX) or after c (SUFFIX). A program owns
    SB columns of one row and adds CB chunks a step, in a fixed order; the totals are loaded
    shifted by one chunk, so that a carry is a sum of the others' totals alone."""
    pid = tl.program_id(0)
    n_col_blocks = tl.cdiv(W, SB)
    row = pid // n_col_blocks
    cols = (pid % n_col_blocks) * SB + tl.arange(0, SB)
    k = tl.arange(0, CB)
    acc = tl.zeros((SB,), dtype=tl.float32)
    for j0 in range(0, nC, CB):
        if MODE == PREFIX:  # chunks j0.., each the sum of the totals before it
            at = j0 + k
            src = at - 1
        else:  # chunks nC-1-j0 down, each the sum of the totals after it
            at = nC - 1 - j0 - k
            src = at + 1
        writes = ((at >= 0) & (at < nC))[:, None] & (cols < W)[None, :]
        reads = writes & ((src >= 0) & (src < nC))[:, None]
        src_at = (row.to(tl.int64) * nC + src[:, None]) * PARTS * W + cols[None, :]
        x = tl.load(tot_ptr + src_at, mask=reads, other=0.0)
        if PARTS == 2:
            x += tl.load(tot_ptr + src_at + W, mask=reads, other=0.0)
        tl.store(carry_ptr + (row.to(tl.int64) * nC + at[:, None]) * W + cols[None, :],
                 acc[None, :] + tl.cumsum(x, axis=0), mask=writes)
        acc += tl.sum(x, axis=0)


# -----------------------------------------------------------------------------
# Forward


@triton.jit
def _r_sq_totals(w_ptr, s_b, s_h, s_t, tS_ptr, H, T, p, nC, HP: tl.constexpr, P: tl.constexpr,
                 BT: tl.constexpr, EVEN_P: tl.constexpr, STAGES: tl.constexpr):
    """F1: the chunk's totals of w^2 -> tS (B, nC, H p)."""
    b, c = _ids(nC)
    hh, inside, cols_at = _row_geometry(H, p, HP, P, EVEN_P)
    w_rows = _rows(w_ptr, b, s_b, s_h, HP, P)
    total = tl.zeros((HP, P), dtype=tl.float32)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        x = tl.load(w_rows + t.to(tl.int64) * s_t, mask=tl.where(t < T, inside, False), other=0.0).to(tl.float32)
        total += x * x
    tl.store(tS_ptr + _chunk_at(b, c, nC, H * p, 1, 0) + cols_at, total, mask=inside)


@triton.jit
def _r_pi(w_ptr, s_b, s_h, s_t, bias_ptr, bias_h, bias_t, temp_ptr, cS_ptr, u_ptr, pi_ptr, tMN_ptr, H, T, p, nC,
          sq_floor, HP: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, EVEN_P: tl.constexpr,
          STAGES: tl.constexpr):
    """F2: row by row, S = the carry + the chunk's w^2 so far; u = sum_i w^2 / max(S, floor) + p bias;
    Pi = the softmax over the heads of temp * u (0 past T) -> u, Pi (B, H, T); the chunk's totals of
    Pi w^2 and of Pi -> tMN (B, nC, H p + H)."""
    b, c = _ids(nC)
    hh, inside, cols_at = _row_geometry(H, p, HP, P, EVEN_P)
    w_rows = _rows(w_ptr, b, s_b, s_h, HP, P)
    u_heads, pi_heads = _heads(u_ptr, b, H, T, HP), _heads(pi_ptr, b, H, T, HP)
    bias_heads = bias_ptr + hh.to(tl.int64) * bias_h
    S = _load_chunk(cS_ptr, _chunk_at(b, c, nC, H * p, 1, 0), cols_at, inside)
    temp = tl.load(temp_ptr + hh, mask=hh < H, other=0.0)
    M = tl.zeros((HP, P), dtype=tl.float32)
    N = tl.zeros((HP,), dtype=tl.float32)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        heads_in = tl.where(t < T, hh < H, False)
        q = tl.load(w_rows + t.to(tl.int64) * s_t, mask=tl.where(t < T, inside, False), other=0.0).to(tl.float32)
        q = q * q
        S += q
        u = tl.sum(q / tl.maximum(S, sq_floor), axis=1)
        u += p * tl.load(bias_heads + t.to(tl.int64) * bias_t, mask=heads_in, other=0.0).to(tl.float32)
        logit = tl.where(hh < H, temp * u, float("-inf"))
        e = tl.exp(logit - tl.max(logit, axis=0))
        pi = tl.where(heads_in, e / tl.sum(e, axis=0), 0.0)
        tl.store(u_heads + t, u, mask=heads_in)
        tl.store(pi_heads + t, pi, mask=heads_in)
        M += pi[:, None] * q
        N += pi
    at = _chunk_at(b, c, nC, H * p + H, 1, 0)
    tl.store(tMN_ptr + at + cols_at, M, mask=inside)
    tl.store(tMN_ptr + at + H * p + hh, N, mask=hh < H)


@triton.jit
def _r_out(w_ptr, s_b, s_h, s_t, pi_ptr, cMN_ptr, out_ptr, o_b, o_h, o_t, H, T, p, nC, stat_eps, HP: tl.constexpr,
           P: tl.constexpr, BT: tl.constexpr, EVEN_P: tl.constexpr, STAGES: tl.constexpr):
    """F3: out = -Pi w n / (n + M), M and n = N + eps the carries plus the chunk's sums so far."""
    b, c = _ids(nC)
    hh, inside, cols_at = _row_geometry(H, p, HP, P, EVEN_P)
    w_rows, out_rows, pi_heads = _rows(w_ptr, b, s_b, s_h, HP, P), _rows(out_ptr, b, o_b, o_h, HP, P), \
        _heads(pi_ptr, b, H, T, HP)
    at = _chunk_at(b, c, nC, H * p + H, 1, 0)
    M = _load_chunk(cMN_ptr, at, cols_at, inside)
    N = _load_chunk_heads(cMN_ptr, at, H * p, hh, H)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        row_in = tl.where(t < T, inside, False)
        x = tl.load(w_rows + t.to(tl.int64) * s_t, mask=row_in, other=0.0).to(tl.float32)
        pi = tl.load(pi_heads + t, mask=tl.where(t < T, hh < H, False), other=0.0)
        M += pi[:, None] * (x * x)
        N += pi
        n = N[:, None] + stat_eps
        out = -pi[:, None] * x * n / (n + M)
        tl.store(out_rows + t.to(tl.int64) * o_t, out.to(out_ptr.dtype.element_ty), mask=row_in)


# -----------------------------------------------------------------------------
# Backward


@triton.jit
def _r_grad_totals(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, cMN_ptr, y_ptr, tG_ptr, H, T, p, nC, stat_eps,
                   HP: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, EVEN_P: tl.constexpr,
                   STAGES: tl.constexpr):
    """B1, two walks of the chunk. First: M, N, D and dL/dM = g Pi w D^2 / n, dL/dN = -sum_i dL/dM
    M / n (kept in y's place), added into the chunk's (hi, lo) totals -> tG (B, nC, 2, H p + H).
    Then the same dL/dM (and the kept dL/dN) again, taken out of those totals one by one: at each
    token the sums over the chunk's tokens >= t, exactly, and y = -sum_i g w D + sum_i w^2 (that of
    dL/dM) + (that of dL/dN) -> y (B, H, T): dL/dPi but for the later chunks' part (B2 adds it).
    The second walk re-reads the chunk's rows (from L2, read a moment before)."""
    b, c = _ids(nC)
    hh, inside, cols_at = _row_geometry(H, p, HP, P, EVEN_P)
    w_rows, g_rows = _rows(w_ptr, b, s_b, s_h, HP, P), _rows(g_ptr, b, g_b, g_h, HP, P)
    pi_heads, y_heads = _heads(pi_ptr, b, H, T, HP), _heads(y_ptr, b, H, T, HP)
    at = _chunk_at(b, c, nC, H * p + H, 1, 0)
    M = _load_chunk(cMN_ptr, at, cols_at, inside)
    N = _load_chunk_heads(cMN_ptr, at, H * p, hh, H)
    hi = tl.zeros((HP, P), dtype=tl.float32)
    lo = tl.zeros((HP, P), dtype=tl.float32)
    n_hi = tl.zeros((HP,), dtype=tl.float32)
    n_lo = tl.zeros((HP,), dtype=tl.float32)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        row_in, heads_in = tl.where(t < T, inside, False), tl.where(t < T, hh < H, False)
        x = tl.load(w_rows + t.to(tl.int64) * s_t, mask=row_in, other=0.0).to(tl.float32)
        g = tl.load(g_rows + t.to(tl.int64) * g_t, mask=row_in, other=0.0).to(tl.float32)
        pi = tl.load(pi_heads + t, mask=heads_in, other=0.0)
        q = x * x
        M += pi[:, None] * q
        N += pi
        D, inv_n, e, gM = _d_and_grad_m(x, g, pi, M, N, stat_eps)
        gN = -tl.sum(gM * M, axis=1) * inv_n
        tl.store(y_heads + t, gN, mask=heads_in)  # for the second walk: the same bits, not a second sum
        hi, lo = _add_exact(hi, lo, gM)
        n_hi, n_lo = _add_exact(n_hi, n_lo, gN)
    at2 = _chunk_at(b, c, nC, H * p + H, 2, 0)
    tl.store(tG_ptr + at2 + cols_at, hi, mask=inside)
    tl.store(tG_ptr + at2 + H * p + hh, n_hi, mask=hh < H)
    tl.store(tG_ptr + at2 + H * p + H + cols_at, lo, mask=inside)
    tl.store(tG_ptr + at2 + 2 * H * p + H + hh, n_lo, mask=hh < H)
    tl.debug_barrier()  # the kept dL/dN, stored by one thread a head, read back by its warp's others
    M = _load_chunk(cMN_ptr, at, cols_at, inside)
    N = _load_chunk_heads(cMN_ptr, at, H * p, hh, H)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        row_in, heads_in = tl.where(t < T, inside, False), tl.where(t < T, hh < H, False)
        x = tl.load(w_rows + t.to(tl.int64) * s_t, mask=row_in, other=0.0).to(tl.float32)
        g = tl.load(g_rows + t.to(tl.int64) * g_t, mask=row_in, other=0.0).to(tl.float32)
        pi = tl.load(pi_heads + t, mask=heads_in, other=0.0)
        gN = tl.load(y_heads + t, mask=heads_in, other=0.0)
        q = x * x
        M += pi[:, None] * q
        N += pi
        D, inv_n, e, gM = _d_and_grad_m(x, g, pi, M, N, stat_eps)
        tl.store(y_heads + t, tl.sum(q * (hi + lo) - e, axis=1) + (n_hi + n_lo), mask=heads_in)
        hi, lo = _add_exact(hi, lo, -gM)
        n_hi, n_lo = _add_exact(n_hi, n_lo, -gN)


@triton.jit
def _r_logit_grad(w_ptr, s_b, s_h, s_t, y_ptr, pi_ptr, u_ptr, temp_ptr, cS_ptr, cG_ptr, R_ptr, gtemp_ptr, tGS_ptr,
                  H, T, p, nC, sq_floor, HP: tl.constexpr, P: tl.constexpr, BT: tl.constexpr,
                  EVEN_P: tl.constexpr, STAGES: tl.constexpr):
    """B2: row by row, dL/dPi = y + sum_i w^2 C + CN (C, CN: cG, the sums over the later chunks);
    the softmax backward over the heads, dL/dlogit = Pi (dL/dPi - sum_heads Pi dL/dPi); R = temp
    dL/dlogit -> R (B, H, T); the chunk's sum of dL/dlogit u -> gtemp (B, nC, H); S as in F2 and
    dL/dS = -R w^2 A^2 (_grad_s), added into the chunk's (hi, lo) totals -> tGS (B, nC, 2, H p)."""
    b, c = _ids(nC)
    hh, inside, cols_at = _row_geometry(H, p, HP, P, EVEN_P)
    w_rows = _rows(w_ptr, b, s_b, s_h, HP, P)
    pi_heads, y_heads = _heads(pi_ptr, b, H, T, HP), _heads(y_ptr, b, H, T, HP)
    u_heads, R_heads = _heads(u_ptr, b, H, T, HP), _heads(R_ptr, b, H, T, HP)
    S = _load_chunk(cS_ptr, _chunk_at(b, c, nC, H * p, 1, 0), cols_at, inside)
    at = _chunk_at(b, c, nC, H * p + H, 1, 0)
    C = _load_chunk(cG_ptr, at, cols_at, inside)
    CN = _load_chunk_heads(cG_ptr, at, H * p, hh, H)
    temp = tl.load(temp_ptr + hh, mask=hh < H, other=0.0)
    hi = tl.zeros((HP, P), dtype=tl.float32)
    lo = tl.zeros((HP, P), dtype=tl.float32)
    dtemp = tl.zeros((HP,), dtype=tl.float32)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        heads_in = tl.where(t < T, hh < H, False)
        x = tl.load(w_rows + t.to(tl.int64) * s_t, mask=tl.where(t < T, inside, False), other=0.0).to(tl.float32)
        pi = tl.load(pi_heads + t, mask=heads_in, other=0.0)
        q = x * x
        S = S + q
        yy = pi * (tl.load(y_heads + t, mask=heads_in, other=0.0) + tl.sum(q * C, axis=1) + CN)  # Pi dL/dPi
        gl = yy - pi * tl.sum(yy, axis=0)
        R = temp * gl
        tl.store(R_heads + t, R, mask=heads_in)
        dtemp += gl * tl.load(u_heads + t, mask=heads_in, other=0.0)
        gS = _grad_s(q, R[:, None], S, sq_floor)[1]
        hi, lo = _add_exact(hi, lo, gS)
    tl.store(gtemp_ptr + (b * nC + c).to(tl.int64) * H + hh, dtemp, mask=hh < H)
    at2 = _chunk_at(b, c, nC, H * p, 2, 0)
    tl.store(tGS_ptr + at2 + cols_at, hi, mask=inside)
    tl.store(tGS_ptr + at2 + H * p + cols_at, lo, mask=inside)


@triton.jit
def _r_grad_w(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, R_ptr, gtemp_ptr, cS_ptr, cMN_ptr, cG_ptr,
              tG_ptr, cGS_ptr, tGS_ptr, gw_ptr, o_b, o_h, o_t, dtemp_ptr, dbias_ptr, B, H, T, T_bias, p, nC, sq_floor,
              stat_eps, HP: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BTP: tl.constexpr,
              EVEN_P: tl.constexpr, RB: tl.constexpr, STAGES: tl.constexpr):
    """B3: dL/dw = -Pi D g + 2 w (Pi G_M + R A + G_S) row by row, G_M and G_S the sums over tokens
    >= t of dL/dM and dL/dS: the later chunks' (cG, cGS) plus the chunk's (hi, lo) totals (tG from
    B1, tGS from B2), less the chunk's earlier tokens' terms, taken out one by one: the same terms
    as B1's and B2's (_d_and_grad_m, _grad_s), so exactly. The programs of batch row 0 first sum
    over the batch (_batch_sums)."""
    b, c = _ids(nC)
    if b == 0:  # first: nothing of it is live across the row loop
        _batch_sums(R_ptr, gtemp_ptr, dbias_ptr, dtemp_ptr, c, B, H, T, T_bias, p, nC, HP, BT, BTP, RB)
    hh, inside, cols_at = _row_geometry(H, p, HP, P, EVEN_P)
    w_rows, g_rows, gw_rows = _rows(w_ptr, b, s_b, s_h, HP, P), _rows(g_ptr, b, g_b, g_h, HP, P), \
        _rows(gw_ptr, b, o_b, o_h, HP, P)
    pi_heads, R_heads = _heads(pi_ptr, b, H, T, HP), _heads(R_ptr, b, H, T, HP)
    S = _load_chunk(cS_ptr, _chunk_at(b, c, nC, H * p, 1, 0), cols_at, inside)
    at = _chunk_at(b, c, nC, H * p + H, 1, 0)
    M = _load_chunk(cMN_ptr, at, cols_at, inside)
    N = _load_chunk_heads(cMN_ptr, at, H * p, hh, H)
    m_hi, m_lo = _suffix_start(tG_ptr, _chunk_at(b, c, nC, H * p + H, 2, 0), H * p + H, cG_ptr, at, cols_at, inside)
    hi, lo = _suffix_start(tGS_ptr, _chunk_at(b, c, nC, H * p, 2, 0), H * p, cGS_ptr,
                           _chunk_at(b, c, nC, H * p, 1, 0), cols_at, inside)
    for k in tl.range(0, BT, num_stages=STAGES):
        t = c * BT + k
        row_in, heads_in = tl.where(t < T, inside, False), tl.where(t < T, hh < H, False)
        x = tl.load(w_rows + t.to(tl.int64) * s_t, mask=row_in, other=0.0).to(tl.float32)
        g = tl.load(g_rows + t.to(tl.int64) * g_t, mask=row_in, other=0.0).to(tl.float32)
        pi = tl.load(pi_heads + t, mask=heads_in, other=0.0)
        R = tl.load(R_heads + t, mask=heads_in, other=0.0)[:, None]
        q = x * x
        S = S + q
        A, gS = _grad_s(q, R, S, sq_floor)
        M += pi[:, None] * q
        N += pi
        D, inv_n, e, gM = _d_and_grad_m(x, g, pi, M, N, stat_eps)
        gw = -pi[:, None] * D * g + 2.0 * x * (pi[:, None] * (m_hi + m_lo) + R * A + (hi + lo))
        tl.store(gw_rows + t.to(tl.int64) * o_t, gw.to(gw_ptr.dtype.element_ty), mask=row_in)
        m_hi, m_lo = _add_exact(m_hi, m_lo, -gM)
        hi, lo = _add_exact(hi, lo, -gS)


@triton.jit
def _batch_sums(R_ptr, gtemp_ptr, dbias_ptr, dtemp_ptr, c, B, H, T, T_bias, p, nC, HP: tl.constexpr,
                BT: tl.constexpr, BTP: tl.constexpr, RB: tl.constexpr):
    """B3's sums over the batch, in a fixed order, by the programs of batch row 0: dpos_bias
    (H, T_bias) = p * sum_b R at chunk c's tokens (one (HP, BTP) tile a batch row), zeros past T
    (tiles c, c + nC, ...: the whole width, so autograd adds nothing); and (chunk 0) dtemp (H,) =
    the sum of B2's partials (B, nC, H), RB rows a step."""
    hh = tl.arange(0, HP)
    j = tl.arange(0, BTP)
    t = c * BT + j
    keep = (hh < H)[:, None] & ((j < BT) & (t < T))[None, :]
    acc = tl.zeros((HP, BTP), dtype=tl.float32)
    for b1 in range(0, B):
        acc += tl.load(R_ptr + (b1 * H + hh[:, None]).to(tl.int64) * T + t[None, :], mask=keep, other=0.0)
    tl.store(dbias_ptr + hh[:, None].to(tl.int64) * T_bias + t[None, :], p * acc, mask=keep)
    for z in range(c, tl.cdiv(T_bias - T, BTP), nC):  # past T no gradient: tiles c, c + nC, ...
        tz = T + z * BTP + j
        tl.store(dbias_ptr + hh[:, None].to(tl.int64) * T_bias + tz[None, :], tl.zeros((HP, BTP), dtype=tl.float32),
                 mask=(hh < H)[:, None] & (tz < T_bias)[None, :])
    if c == 0:
        r = tl.arange(0, RB)
        part = tl.zeros((RB, HP), dtype=tl.float32)
        for r0 in range(0, B * nC, RB):
            rows = r0 + r
            part += tl.load(gtemp_ptr + rows[:, None].to(tl.int64) * H + hh[None, :],
                            mask=(rows < B * nC)[:, None] & (hh < H)[None, :], other=0.0)
        tl.store(dtemp_ptr + hh, tl.sum(part, axis=0), mask=hh < H)


# -----------------------------------------------------------------------------
# The launches


def geometry(T, p, H, dtype=torch.bfloat16):
    """How a row of T tokens and H heads of width p is cut (kernels/launch_model.py's retiled_geometry):
    nC chunks of BT tokens; a program's (HP, P) row tile and its warps (one 16-byte vector of w's
    dtype a thread); the scans' CB chunk totals and SB columns a program, their warps and steps."""
    return launch_model.retiled_geometry(T, p, H, described(), dtype.itemsize)


def described():
    """These kernels for the launch model: the knobs as they are now (the tests lower them)."""
    return dict(name="retiled", BLOCK_T=BLOCK_T, VECTOR_BYTES=VECTOR_BYTES, MAX_WARPS=MAX_WARPS,
                SCAN_CHUNKS=SCAN_CHUNKS, SCAN_COLUMNS=SCAN_COLUMNS, SCAN_VALUES_PER_WARP=SCAN_VALUES_PER_WARP,
                PARTIAL_BLOCK=PARTIAL_BLOCK)


def launch_plan(B, H, T, p, dtype=torch.bfloat16, bias_width=None):
    """The launches of one causal forward and backward, in order, as RetiledKernels runs them
    (kernels/launch_model.py's retiled_plan): each one's kernel, grid, warps, bytes and work a program.
    Modelled, not measured."""
    return launch_model.retiled_plan(described(), B, H, T, p, dtype, bias_width)


def applies(H, p, causal, dtype):
    """Whether these kernels run a call (else today's do): the causal form, heads whose width is a
    multiple of 16 (so that a thread's vector of a head is aligned: Triton marks strides divisible
    by 16; narrower vectors spread several heads over a thread, past 128 registers), and a row
    that MAX_WARPS warps of one vector a thread hold."""
    return causal and p % 16 == 0 and geometry(1, p, H, dtype)["fits"]


# The module constants geometry() and RetiledKernels.plan() read: a memoised call plan is keyed on
# their values (the tests lower them).
KNOBS = ("BLOCK_T", "STAGES", "VECTOR_BYTES", "MAX_WARPS", "MAX_REGISTERS", "SCAN_CHUNKS", "SCAN_COLUMNS",
         "SCAN_VALUES_PER_WARP", "PARTIAL_BLOCK")


def knob_values():
    """The values of KNOBS now."""
    here = globals()
    return tuple(here[k] for k in KNOBS)


class CallPlan:
    """What one causal forward and backward launch and allocate at one shape, computed once
    (call_plan): applies (else today's kernels run the call), and where it does: plan
    (RetiledKernels.plan's), geo (geometry's), the chunk launches' grid, sizes (H, T, p, nC as the
    kernels take them), scans {totals: (grid, constexprs and warps, W)}, and the workspaces' layouts
    (kernels/triton_launch.py): saved (Pi, u, cS, cMN: kept until the backward), totals (tS, tMN: the
    forward's), work (y, R, tG, cG, cGS, tGS, the dtemp partials: the backward's)."""

    def __init__(self, B, H, T, p, dtype):
        self.applies = applies(H, p, True, dtype)
        if not self.applies:
            return
        geo = geometry(T, p, H, dtype)
        nC = geo["nC"]
        self.geo, self.plan = geo, RetiledKernels.plan(p, H, True, False, T, dtype)
        self.grid, self.sizes = (B * nC,), (H, T, p, nC)
        self.scans = {tot: ((B * triton.cdiv(W, geo["SB"]),), dict(MODE=mode, PARTS=parts, CB=geo["CB"], SB=geo["SB"],
                                                                   num_warps=geo["scan_warps"]), W)
                      for tot, W, mode, parts in (("tS", H * p, PREFIX.value, 1), ("tMN", H * p + H, PREFIX.value, 1),
                                                  ("tG", H * p + H, SUFFIX.value, 2), ("tGS", H * p, SUFFIX.value, 2))}
        per_token, values, with_heads = (B, H, T), (B, nC, H * p), (B, nC, H * p + H)
        self.saved = layout(per_token, per_token, values, with_heads)
        self.totals = layout(values, with_heads)
        self.work = layout(per_token, per_token, (B, nC, 2, H * p + H), with_heads, values, (B, nC, 2, H * p),
                           (B, nC, H))


@functools.lru_cache(maxsize=256)
def call_plan(B, H, T, p, dtype, knobs):
    """The CallPlan of a causal shape, memoised on (B, H, T, p, w's dtype, knob_values()). Not on strides:
    they change no plan (the outputs take w's strides from torch.empty_like, and the direct launches key
    on every argument's specialization, kernels/triton_launch.py)."""
    return CallPlan(B, H, T, p, dtype)


def _scan(tot, carry, scan, nC, at):
    """Launch S over tot (rows, nC, parts, W) -> carry (rows, nC, W): scan is a CallPlan's scans[name of tot]."""
    grid, meta, W = scan
    launch(_r_scan, grid, (tot, carry, nC, W), meta, at)


class RetiledKernels:
    """The causal forward and backward above, for kernels/fused.py's FusedTSSA (BACKENDS
    "triton_retiled"), with TritonKernels' calling convention: forward(w, temp, bias, mask, causal,
    eps) -> out, Pi, u, saved; backward(w, g, temp, pi, u, mask, saved, causal, eps, bias_width) ->
    dw, dtemp, dpos_bias (the whole width). The non-causal form, the decoding step and the rows
    applies() refuses run TritonKernels."""

    name = "triton_retiled"
    raw_inputs = True

    @staticmethod
    def load():  # importing this file imported Triton: nothing more to build before a launch
        pass

    @staticmethod
    def unsupported(w):
        """Why these kernels cannot run w, or None (as today's: CUDA, or TRITON_INTERPRET=1)."""
        return triton_tssa.TritonKernels.unsupported(w)

    @staticmethod
    def prepare(w):  # any float dtype is read as is; unit stride along p
        return triton_tssa.TritonKernels.prepare(w)

    @staticmethod
    def step(w_t, temp, bias, state, eps):
        """One decoding token: today's _k_step (all heads of a batch row in one program already)."""
        return triton_tssa.TritonKernels.step(w_t, temp, bias, state, eps)

    @staticmethod
    def plan(p, H, causal=True, has_mask=False, T=1, dtype=torch.bfloat16):
        """{kernel: its constexprs and num_warps (and fp fusion off where the terms must match)}
        for every kernel of the causal operator at T tokens of w's dtype (the build test builds
        exactly these; a scan's MODE and PARTS are given at each launch)."""
        geo = geometry(T, p, H, dtype)
        row = dict(HP=geo["HP"], P=geo["P"], BT=geo["BT"], EVEN_P=geo["EVEN_P"], STAGES=STAGES,
                   num_warps=geo["warps"])
        exact = dict(row, enable_fp_fusion=False)
        walks_twice = dict(exact, STAGES=max(1, STAGES - 1), maxnreg=MAX_REGISTERS)  # B1: see MAX_REGISTERS
        return dict(_r_scan=dict(CB=geo["CB"], SB=geo["SB"], num_warps=geo["scan_warps"]),
                    _r_sq_totals=row, _r_pi=row, _r_out=row, _r_grad_totals=walks_twice, _r_logit_grad=exact,
                    _r_grad_w=dict(exact, BTP=triton.next_power_of_2(geo["BT"]), RB=PARTIAL_BLOCK))

    @staticmethod
    def shapes(w, causal):
        """Shapes of what forward returns besides out: Pi and u (B, H, T), the carries cS
        (B, nC, H p) and cMN (B, nC, H p + H); today's kernels' where they run."""
        B, H, T, p = w.shape
        if not applies(H, p, causal, w.dtype):
            return triton_tssa.TritonKernels.shapes(w, causal)
        nC = geometry(T, p, H, w.dtype)["nC"]
        return (B, H, T), (B, nC, H * p), (B, nC, H * p + H)

    @classmethod
    def forward(cls, w, temp, bias, mask, causal, eps):
        """out (w's dtype and strides), Pi and u (B, H, T) fp32, and the carries to save. bias: the
        whole position bias (H, T_max). Three allocations, as TritonKernels.forward's: out, one for
        Pi, u and the carries, one for the chunk totals."""
        B, H, T, p = w.shape
        call = call_plan(B, H, T, p, w.dtype, knob_values()) if causal else None
        if call is None or not call.applies:
            return triton_tssa.TritonKernels.forward(w, temp, bias, mask, causal, eps)
        if bias is None or mask is not None:
            raise ValueError("the causal kernels take the position bias and no padding mask")
        wk, temp = cls.prepare(w), temp.float().contiguous()
        plan, grid, sizes = call.plan, call.grid, call.sizes
        pi, u, cS, cMN = carve(call.saved, wk.device)
        tS, tMN = carve(call.totals, wk.device)
        out = torch.empty_like(wk, dtype=w.dtype)  # w's strides: merging the heads after is a view
        sw = wk.stride()[:3]
        with triton_tssa.on_device(wk):
            at = direct_at(wk)
            launch(_r_sq_totals, grid, (wk, *sw, tS, *sizes), plan["_r_sq_totals"], at)
            _scan(tS, cS, call.scans["tS"], sizes[3], at)
            launch(_r_pi, grid, (wk, *sw, bias, bias.stride(0), bias.stride(1), temp, cS, u, pi, tMN, *sizes, eps[0]),
                   plan["_r_pi"], at)
            _scan(tMN, cMN, call.scans["tMN"], sizes[3], at)
            launch(_r_out, grid, (wk, *sw, pi, cMN, out, *out.stride()[:3], *sizes, eps[1]), plan["_r_out"], at)
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal, eps, bias_width=0):
        """dw (w's dtype and strides), dtemp (H,) and dpos_bias (H, bias_width) fp32: the gradient of
        the whole position bias (zeros past T). Four allocations, as TritonKernels.backward's: dw,
        dtemp, dpos_bias, and one for y, R, the chunk totals and carries, and the dtemp partials."""
        B, H, T, p = w.shape
        call = call_plan(B, H, T, p, w.dtype, knob_values()) if causal else None
        if call is None or not call.applies:
            return triton_tssa.TritonKernels.backward(w, g, temp, pi, u, mask, saved, causal, eps, bias_width)
        cS, cMN = saved
        wk, g, temp = cls.prepare(w), cls.prepare(g), temp.float().contiguous()
        plan, grid, sizes = call.plan, call.grid, call.sizes
        y, R, tG, cG, cGS, tGS, gtemp = carve(call.work, wk.device)
        dtemp = torch.empty(H, device=wk.device, dtype=torch.float32)
        dbias = torch.empty(H, bias_width, device=wk.device, dtype=torch.float32)
        gw = torch.empty_like(wk, dtype=w.dtype)
        sw, sg = wk.stride()[:3], g.stride()[:3]
        with triton_tssa.on_device(wk):
            at = direct_at(wk)
            launch(_r_grad_totals, grid, (wk, *sw, g, *sg, pi, cMN, y, tG, *sizes, eps[1]), plan["_r_grad_totals"], at)
            _scan(tG, cG, call.scans["tG"], sizes[3], at)
            launch(_r_logit_grad, grid, (wk, *sw, y, pi, u, temp, cS, cG, R, gtemp, tGS, *sizes, eps[0]),
                   plan["_r_logit_grad"], at)
            _scan(tGS, cGS, call.scans["tGS"], sizes[3], at)
            launch(_r_grad_w, grid, (wk, *sw, g, *sg, pi, R, gtemp, cS, cMN, cG, tG, cGS, tGS, gw, *gw.stride()[:3],
                                     dtemp, dbias, B, H, T, bias_width, p, sizes[3], *eps), plan["_r_grad_w"], at)
        return gw, dtemp, dbias
