"""
fast_tssa: fused TSSA kernels behind model.py's functions (same maths, fewer passes).

model.tssa / model.causal_tssa / model.causal_tssa_step call into this file when
applies(w, pi_mode, impl) says so (impl="auto" on CUDA and on CPU for fp32/bf16/fp16;
impl="fast" forces it; impl="reference" never). The readable maths stays in model.py and is
what every path here is tested against (tests/test_fast_tssa.py).

Three back ends compute the same maths with the same hand-derived backward:
  "triton"  CUDA: Triton kernels over chunks of BLOCK_T tokens; a running sum is a scan
            inside the chunk plus a carry (sum of the other chunks' totals, from a small carry
            kernel). Five launches each way, two of them owning all heads of a chunk so the
            softmax across heads (and its backward) stays inside a kernel: 14 launches per
            causal forward+backward (the reference under autograd: 68 ops). Also runs under
            TRITON_INTERPRET=1 on CPU (slow; that is how the tests run it), and the tests
            compile it for sm_80 / sm_90 without a GPU.
  "cpu"     CPU: a small C file compiled once with the system C compiler (cc -O3 -fopenmp,
            cached in ~/.cache/nanotost or a per-user temp folder; without -march=native or
            OpenMP if the compiler rejects them), called through ctypes. All heads of a token are
            handled together (softmax and its backward inline), w is streamed in the layout
            model.py makes; causal with a batch row per thread: one pass forward, one pass
            backward; otherwise chunks of tokens in parallel with carries between passes.
  "torch"   any device and dtype (float64 too): the same maths as whole-tensor PyTorch ops;
            the executable statement of the backward, checked by gradcheck. Slower than the
            reference's autograd on CPU (used only when asked for, impl="fast").
Pi is returned DETACHED (no gradient path through the returned Pi; model.py uses it for
analysis maps and the decoding state only). Gradients flow to w, temp and pos_bias.

    python -m pytest -q tests/test_fast_tssa.py      # fast path == reference, all gradients
    python bench.py --quick                          # timings (see bench.py)

The maths (per batch row and head; w_t in R^p the features of token t, q_t = w_t^2):
  forward   S_t = sum_{u<=t} q_u                 (prefix; the total for the non-causal form)
            r_t = sum_i q_ti / (S_ti + e1)         u_t = r_t + p * bias_t    logit_t = temp * u_t
            Pi_t = softmax over heads of logit_t
            N_t = sum_{u<=t} Pi_u,  M_t = sum_{u<=t} Pi_u q_u,  n_t = N_t + e2,  s_t = M_t / n_t
            D_t = 1 / (1 + s_t),  out_t = -Pi_t w_t D_t
  backward  with g_t = dL/d out_t (suffix sums G_X_t = sum_{u>=t} X_u; totals if non-causal):
            gM_t = g_t Pi_t w_t D_t^2 / n_t          gN_t = -sum_i gM_ti s_ti
            gPi_t = sum_i (-g_ti w_ti D_ti + G_M_ti q_ti) + G_N_t
            gl = Pi * (gPi - sum_heads Pi gPi)     (softmax backward, across heads)
            dtemp = sum gl * u     dbias_t = p * temp * sum_batch gl_t     R_t = temp * gl_t
            gS_t = -R_t q_t / (S_t + e1)^2
            dw_t = -Pi_t D_t g_t + 2 w_t (Pi_t G_M_t + R_t / (S_t + e1) + G_S_t)
The softmax across heads couples the heads: a kernel that computes Pi (or dL/dlogit) must see
every head of a token. The CPU kernels own every head of a token; the Triton kernels F2 and B2
own every head of a chunk; the "torch" back end does the softmax as a (B, H, T) op between passes.
"""

import contextlib
import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import threading
import warnings

import torch

try:  # Triton is optional: CPU-only machines import this file fine without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

EPS_NORM = 1e-12  # must equal model.EPS_NORM (asserted by the tests)
EPS_STAT = 1e-8  # must equal model.EPS_STAT
BLOCK_T = 64  # tokens per chunk of the Triton kernels (tile height; fewer when p is large)
IMPLS = ("auto", "fast", "reference")


# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when this file is imported
INTERPRET = triton is not None and os.environ.get("TRITON_INTERPRET", "0") == "1"


def _stat_dtype(dtype):  # statistics in fp32 (fp64 for fp64 inputs), as in model.stat_dtype
    return torch.promote_types(dtype, torch.float32)


# -----------------------------------------------------------------------------
# 1. Back end "torch": the passes as whole-tensor PyTorch ops (any device, any float dtype)


def _scan(x, causal):  # prefix sums over tokens (dim 2), or the total broadcast to every token
    return x.cumsum(2) if causal else x.sum(2, keepdim=True)


def _rscan(x, causal):  # suffix sums over tokens, or the total
    return x.flip(2).cumsum(2).flip(2) if causal else x.sum(2, keepdim=True)


class TorchKernels:
    """Four per-head passes (stats, apply; grad_pi, grad_w) as whole-tensor ops, with the
    softmax across heads (and its backward) as PyTorch ops on (B, H, T) tensors between them."""

    name = "torch"

    @classmethod
    def forward(cls, w, temp, bias, mask, causal):
        B, H, T, p = w.shape
        wk = w.to(_stat_dtype(w.dtype))
        r = cls.stats(wk, causal)  # (B, H, T)
        u = r if bias is None else r + p * bias.to(r.dtype)
        pi = (temp.to(r.dtype).view(1, H, 1) * u).softmax(dim=1)  # (B, H, T)
        if mask is not None:
            pi = pi * mask[:, None, :]
        return cls.apply(wk, pi, causal).to(w.dtype), pi, u, ()

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal):
        H, p = w.shape[1], w.shape[3]
        wk = w.to(_stat_dtype(w.dtype))
        gpi, gw_pi = cls.grad_pi(wk, g, pi, causal)
        if mask is not None:
            gpi = gpi * mask[:, None, :]
        gl = pi * (gpi - (pi * gpi).sum(1, keepdim=True))  # softmax backward across heads
        t = temp.to(pi.dtype).view(1, H, 1)
        gw = gw_pi + cls.grad_w_s(wk, t * gl, causal)
        return gw.to(w.dtype), (gl * u).sum((0, 2)), p * t[0] * gl.sum(0)

    @staticmethod
    def stats(wk, causal):  # -> r (B, H, T)
        q = wk.square()
        return (q / (_scan(q, causal) + EPS_NORM)).sum(-1)

    @staticmethod
    def apply(wk, pi, causal):  # -> out (B, H, T, p)
        P = pi.unsqueeze(-1)  # (B, H, T, 1)
        s = _scan(P * wk.square(), causal) / (_scan(P, causal) + EPS_STAT)
        return -P * wk / (1.0 + s)

    @staticmethod
    def grad_pi(wk, g, pi, causal):  # -> dL/dPi (B, H, T), the Pi-path part of dL/dw
        g = g.to(wk.dtype)
        P, q = pi.unsqueeze(-1), wk.square()
        n = _scan(P, causal) + EPS_STAT
        s = _scan(P * q, causal) / n
        D = 1.0 / (1.0 + s)
        gM = g * P * wk * D.square() / n
        G_M = _rscan(gM, causal)
        G_N = _rscan(-(gM * s).sum(-1, keepdim=True), causal)
        gpi = (-g * wk * D + G_M * q).sum(-1) + G_N.squeeze(-1)
        return gpi, P * (2.0 * wk * G_M - D * g)

    @staticmethod
    def grad_w_s(wk, R, causal):  # -> the S-path part of dL/dw, R = temp * dL/dlogit (B, H, T)
        q = wk.square()
        A = 1.0 / (_scan(q, causal) + EPS_NORM)
        R = R.unsqueeze(-1)
        G_S = _rscan(-R * q * A.square(), causal)
        return 2.0 * wk * (R * A + G_S)


# -----------------------------------------------------------------------------
# 2. Back end "cpu": C kernels, compiled on first use, called through ctypes
#
# Work is split into items (batch row b, chunk c of L tokens), spread over OpenMP threads;
# inside an item tokens are walked in order and ALL heads of a token are handled together,
# so w is streamed sequentially in model._split_heads' (B, T, H, p) layout and the softmax
# across heads (and its backward) happens in registers, not as separate PyTorch ops.
# Running sums cross chunks through carries: each pass that needs them is preceded by one
# that writes chunk totals (B, nC, H, p), turned into carries by tssa_carry. The backward
# rebuilds a chunk's prefix sums into an L2-sized buffer and walks it backwards.
#   forward : F1 chunk sums of w^2 | F2 r, u, Pi (softmax inline), chunk sums of Pi w^2, Pi
#             | F3 out
#   backward: B1 chunk sums of dL/dM, dL/dN | B2 dL/dPi, softmax backward inline, Pi-path
#             part of dL/dw, chunk sums of dL/dS | B3 the S-path part of dL/dw

C_SOURCE = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>
typedef long long i64;
#define EPS_NORM 1e-12f
#define EPS_STAT 1e-8f
/* d = {B, H, T, p, L, causal}; nC chunks of L tokens */
#define DIMS i64 B = d[0], H = d[1], T = d[2], p = d[3], L = d[4], nC = (T + L - 1) / L; \
             int causal = (int)d[5]; (void)B; (void)causal
/* element (b, h, t, 0) of a (B, H, T, p) tensor with unit stride along p, strides s */
#define AT(x, s, b, h, t) ((x) + (b) * (s)[0] + (h) * (s)[1] + (t) * (s)[2])
#define BHT(x, b, h, t) ((x)[((b) * H + (h)) * T + (t)])      /* (B, H, T) contiguous */
#define CHUNK(x, b, c) ((x) + ((b) * nC + (c)) * H * p)       /* (B, nC, H, p) contiguous */
#define CHUNK1(x, b, c) ((x) + ((b) * nC + (c)) * H)          /* (B, nC, H) contiguous */
#define FOR_ITEMS for (i64 bc = 0; bc < B * nC; bc++)
#define ITEM i64 b = bc / nC, c = bc % nC, t0 = c * L, t1 = t0 + L < T ? t0 + L : T

/* ---- per (token, head) pieces shared by the chunked and the sequential kernels ---- */

/* sum_i w^2 / (S + EPS_NORM); with update, S += w^2 first (causal) */
static inline float tok_stats(const float *x, float *S, i64 p, int update) {
    float acc = 0.f;
    if (update) {
        #pragma omp simd reduction(+:acc)
        for (i64 i = 0; i < p; i++) { float q = x[i] * x[i]; S[i] += q; acc += q / (S[i] + EPS_NORM); }
    } else {
        #pragma omp simd reduction(+:acc)
        for (i64 i = 0; i < p; i++) acc += x[i] * x[i] / (S[i] + EPS_NORM);
    }
    return acc;
}

/* temp * (acc + p bias) for every head -> Pi (softmax over heads, times m) into lg */
static inline void tok_softmax(float *lg, i64 H, float m) {
    float mx = -INFINITY, z = 0.f;
    for (i64 h = 0; h < H; h++) mx = lg[h] > mx ? lg[h] : mx;
    for (i64 h = 0; h < H; h++) { lg[h] = expf(lg[h] - mx); z += lg[h]; }
    for (i64 h = 0; h < H; h++) lg[h] = lg[h] / z * m;
}

/* out = -Pi w n / (n + M), n = N + EPS_STAT; with update, M += Pi w^2 first */
static inline void tok_out(const float *x, float *o, float Pt, float *M, float n, i64 p, int update) {
    if (update) {
        #pragma omp simd
        for (i64 i = 0; i < p; i++) { M[i] += Pt * (x[i] * x[i]); o[i] = -Pt * x[i] * n / (n + M[i]); }
    } else {
        #pragma omp simd
        for (i64 i = 0; i < p; i++) o[i] = -Pt * x[i] * n / (n + M[i]);
    }
}

/* Pi path of the backward at one token (tokens walked backwards). D = n / (n + M),
   gM = g Pi w D^2 / n, gN = -sum_i gM M / n; with update, GM += gM (suffix sums). Writes
   o = Pi (2 w GM - D g); returns sum_i (GM w^2 - g w D) and adds gN to *gN_out. */
static inline float tok_grad_pi(const float *x, const float *g, float Pt, const float *M, float n,
                                float *GM, float *o, i64 p, int update, float *gN_out) {
    float inv_n = 1.f / n, gN = 0.f, acc = 0.f;
    #pragma omp simd reduction(+:gN, acc)
    for (i64 i = 0; i < p; i++) {
        float D = n / (n + M[i]), gM = g[i] * Pt * x[i] * D * D * inv_n;
        if (update) GM[i] += gM;
        gN -= gM * M[i] * inv_n;
        acc += GM[i] * (x[i] * x[i]) - g[i] * x[i] * D;
        o[i] = Pt * (2.f * x[i] * GM[i] - D * g[i]);
    }
    *gN_out += gN;
    return acc;
}

/* S path of the backward at one token: gS = -R w^2 A^2, A = 1 / (S + EPS_NORM). With
   update, GS += gS (suffix sums); if o, o += 2 w (R A + GS); if part, part += gS. */
static inline void tok_grad_s(const float *x, const float *S, float R, float *GS, float *o, float *part,
                              i64 p, int update) {
    #pragma omp simd
    for (i64 i = 0; i < p; i++) {
        float A = 1.f / (S[i] + EPS_NORM), gS = -R * (x[i] * x[i]) * A * A;
        if (update) GS[i] += gS;
        if (part) part[i] += gS;
        if (o) o[i] += 2.f * x[i] * (R * A + GS[i]);
    }
}

/* softmax backward across heads at one token: gl = Pi (gpi - sum_h Pi gpi) */
static inline void tok_softmax_grad(const float *Pt, const float *gpi, float *gl, i64 H) {
    float dot = 0.f;
    for (i64 h = 0; h < H; h++) dot += Pt[h] * gpi[h];
    for (i64 h = 0; h < H; h++) gl[h] = Pt[h] * (gpi[h] - dot);
}

/* Rebuild the prefix sums of chunk [t0, t1) from its carries: rows of H*p (M, S) and H (N). */
static void rebuild(const float *w, const i64 *sw, const float *pi, i64 b, i64 H, i64 T, i64 p,
                    i64 t0, i64 t1, const float *cM, const float *cN, const float *cS,
                    float *Mbuf, float *Nbuf, float *Sbuf) {
    for (i64 t = t0; t < t1; t++) {
        i64 k = t - t0;
        const float *Mp = k ? Mbuf + (k - 1) * H * p : cM, *Np = k ? Nbuf + (k - 1) * H : cN;
        const float *Sp = k ? Sbuf + (k - 1) * H * p : cS;
        for (i64 h = 0; h < H; h++) {
            const float *x = AT(w, sw, b, h, t), *Mph = Mp + h * p, *Sph = Sp + h * p;
            float *St = Sbuf + (k * H + h) * p;
            if (Mbuf) {
                float *Mt = Mbuf + (k * H + h) * p, Pt = BHT(pi, b, h, t);
                Nbuf[k * H + h] = Np[h] + Pt;
                #pragma omp simd
                for (i64 i = 0; i < p; i++) Mt[i] = Mph[i] + Pt * (x[i] * x[i]);
            }
            #pragma omp simd
            for (i64 i = 0; i < p; i++) St[i] = Sph[i] + x[i] * x[i];
        }
    }
}

/* Chunk totals -> carries, in place, per batch row, for each of K values per chunk.
   mode 0: sum of the EARLIER chunks; 1: sum of the LATER chunks; 2: the total (non-causal). */
void tssa_carry(float *part, i64 B, i64 nC, i64 K, int mode) {
    float *acc = malloc(K * sizeof(float));
    for (i64 b = 0; b < B; b++) {
        float *base = part + b * nC * K;
        memset(acc, 0, K * sizeof(float));
        if (mode == 2) {
            for (i64 c = 0; c < nC; c++) for (i64 k = 0; k < K; k++) acc[k] += base[c * K + k];
            for (i64 c = 0; c < nC; c++) memcpy(base + c * K, acc, K * sizeof(float));
            continue;
        }
        for (i64 j = 0; j < nC; j++) {
            float *row = base + (mode == 0 ? j : nC - 1 - j) * K;
            for (i64 k = 0; k < K; k++) { float v = row[k]; row[k] = acc[k]; acc[k] += v; }
        }
    }
    free(acc);
}

/* ---- chunk-parallel kernels: work items (b, chunk), carries between passes ---- */

/* F1: partS[b, c, h] = sum over the chunk of w^2 */
void tssa_sum_sq(const float *w, const i64 *sw, const i64 *d, float *partS, int nth) {
    DIMS;
    #pragma omp parallel for num_threads(nth) schedule(dynamic, 1)
    FOR_ITEMS {
        ITEM;
        float *PS = CHUNK(partS, b, c);
        memset(PS, 0, H * p * sizeof(float));
        for (i64 t = t0; t < t1; t++)
            for (i64 h = 0; h < H; h++) {
                const float *x = AT(w, sw, b, h, t);
                float *Ps = PS + h * p;
                #pragma omp simd
                for (i64 i = 0; i < p; i++) Ps[i] += x[i] * x[i];
            }
    }
}

/* F2: u = sum_i w^2/(S + EPS_NORM) + p bias, Pi = softmax over heads of temp u (times the
   mask), chunk totals of Pi w^2 and Pi. S = carry + running sum (causal) or the total. */
void tssa_fwd_pi(const float *w, const i64 *sw, const float *mask, const float *temp,
                 const float *bias, const i64 *sbias, const i64 *d, const float *cS,
                 float *pi, float *u, float *partM, float *partN, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *S = malloc(H * p * sizeof(float)), *lg = malloc(H * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        FOR_ITEMS {
            ITEM;
            float *PM = CHUNK(partM, b, c), *PN = CHUNK1(partN, b, c);
            memcpy(S, CHUNK(cS, b, c), H * p * sizeof(float));
            memset(PM, 0, H * p * sizeof(float));
            memset(PN, 0, H * sizeof(float));
            for (i64 t = t0; t < t1; t++) {
                for (i64 h = 0; h < H; h++) {
                    float acc = tok_stats(AT(w, sw, b, h, t), S + h * p, p, causal);
                    if (bias) acc += (float)p * bias[h * sbias[0] + t * sbias[1]];
                    BHT(u, b, h, t) = acc;
                    lg[h] = temp[h] * acc;
                }
                tok_softmax(lg, H, mask ? mask[b * T + t] : 1.f);
                for (i64 h = 0; h < H; h++) {
                    const float *x = AT(w, sw, b, h, t);
                    float Pt = lg[h], *Pm = PM + h * p;
                    BHT(pi, b, h, t) = Pt;
                    PN[h] += Pt;
                    #pragma omp simd
                    for (i64 i = 0; i < p; i++) Pm[i] += Pt * (x[i] * x[i]);
                }
            }
        }
        free(S); free(lg);
    }
}

/* F3: out from Pi and M, N = carry + running sums (causal) or the totals */
void tssa_fwd_out(const float *w, const i64 *sw, const float *pi, const i64 *d, const float *cM,
                  const float *cN, float *out, const i64 *so, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *M = malloc(H * p * sizeof(float)), *N = malloc(H * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        FOR_ITEMS {
            ITEM;
            memcpy(M, CHUNK(cM, b, c), H * p * sizeof(float));
            memcpy(N, CHUNK1(cN, b, c), H * sizeof(float));
            for (i64 t = t0; t < t1; t++)
                for (i64 h = 0; h < H; h++) {
                    float Pt = BHT(pi, b, h, t);
                    if (causal) N[h] += Pt;
                    tok_out(AT(w, sw, b, h, t), AT(out, so, b, h, t), Pt, M + h * p, N[h] + EPS_STAT, p, causal);
                }
        }
        free(M); free(N);
    }
}

/* B1: chunk totals of gM and gN */
void tssa_bwd_sum_gm(const float *w, const i64 *sw, const float *g, const i64 *sg, const float *pi,
                     const i64 *d, const float *cM, const float *cN, float *partGM, float *partGN, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *M = malloc(H * p * sizeof(float)), *N = malloc(H * sizeof(float)), *o = malloc(p * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        FOR_ITEMS {
            ITEM;
            float *PGM = CHUNK(partGM, b, c), *PGN = CHUNK1(partGN, b, c);
            memcpy(M, CHUNK(cM, b, c), H * p * sizeof(float));
            memcpy(N, CHUNK1(cN, b, c), H * sizeof(float));
            memset(PGM, 0, H * p * sizeof(float));
            memset(PGN, 0, H * sizeof(float));
            for (i64 t = t0; t < t1; t++)
                for (i64 h = 0; h < H; h++) {
                    const float *x = AT(w, sw, b, h, t);
                    float *Mh = M + h * p, Pt = BHT(pi, b, h, t);
                    if (causal) {
                        N[h] += Pt;
                        #pragma omp simd
                        for (i64 i = 0; i < p; i++) Mh[i] += Pt * (x[i] * x[i]);
                    }
                    /* GM accumulates the chunk total of gM (o is scratch) */
                    tok_grad_pi(x, AT(g, sg, b, h, t), Pt, Mh, N[h] + EPS_STAT, PGM + h * p, o, p, 1, PGN + h);
                }
        }
        free(M); free(N); free(o);
    }
}

/* B2, tokens walked backwards: dL/dPi, softmax backward (gl stored, gtemp partials), the Pi
   path of gw, chunk totals of gS. */
void tssa_bwd_pi(const float *w, const i64 *sw, const float *g, const i64 *sg, const float *pi,
                 const float *u, const float *temp, const i64 *d, const float *cS, const float *cM,
                 const float *cN, const float *cGM, const float *cGN, float *gw, const i64 *sgw,
                 float *gl, float *partGS, float *gtemp_part, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *Mbuf = malloc(L * H * p * sizeof(float)), *Sbuf = malloc(L * H * p * sizeof(float));
        float *Nbuf = malloc(L * H * sizeof(float)), *GM = malloc(H * p * sizeof(float));
        float *GN = malloc(H * sizeof(float)), *gpi = malloc(H * sizeof(float));
        float *Pt = malloc(H * sizeof(float)), *glt = malloc(H * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        FOR_ITEMS {
            ITEM;
            float *PGS = CHUNK(partGS, b, c), *gtp = gtemp_part + bc * H;
            if (causal) rebuild(w, sw, pi, b, H, T, p, t0, t1, CHUNK(cM, b, c), CHUNK1(cN, b, c), CHUNK(cS, b, c), Mbuf, Nbuf, Sbuf);
            memcpy(GM, CHUNK(cGM, b, c), H * p * sizeof(float));
            memcpy(GN, CHUNK1(cGN, b, c), H * sizeof(float));
            memset(PGS, 0, H * p * sizeof(float));
            memset(gtp, 0, H * sizeof(float));
            for (i64 t = t1 - 1; t >= t0; t--) {
                i64 k = t - t0;
                const float *M = causal ? Mbuf + k * H * p : CHUNK(cM, b, c);
                const float *N = causal ? Nbuf + k * H : CHUNK1(cN, b, c);
                const float *S = causal ? Sbuf + k * H * p : CHUNK(cS, b, c);
                for (i64 h = 0; h < H; h++) {
                    float gN = 0.f;
                    Pt[h] = BHT(pi, b, h, t);
                    float acc = tok_grad_pi(AT(w, sw, b, h, t), AT(g, sg, b, h, t), Pt[h], M + h * p, N[h] + EPS_STAT,
                                            GM + h * p, AT(gw, sgw, b, h, t), p, causal, &gN);
                    if (causal) GN[h] += gN;
                    gpi[h] = acc + GN[h];
                }
                tok_softmax_grad(Pt, gpi, glt, H);
                for (i64 h = 0; h < H; h++) {
                    BHT(gl, b, h, t) = glt[h];
                    gtp[h] += glt[h] * BHT(u, b, h, t);
                    tok_grad_s(AT(w, sw, b, h, t), S + h * p, temp[h] * glt[h], NULL, NULL, PGS + h * p, p, 0);
                }
            }
        }
        free(Mbuf); free(Sbuf); free(Nbuf); free(GM); free(GN); free(gpi); free(Pt); free(glt);
    }
}

/* B3, tokens walked backwards: gw += 2 w (R A + G_S), R = temp gl */
void tssa_bwd_w(const float *w, const i64 *sw, const float *gl, const float *temp, const i64 *d,
                const float *cS, const float *cGS, float *gw, const i64 *sgw, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *Sbuf = malloc(L * H * p * sizeof(float)), *GS = malloc(H * p * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        FOR_ITEMS {
            ITEM;
            if (causal) rebuild(w, sw, NULL, b, H, T, p, t0, t1, NULL, NULL, CHUNK(cS, b, c), NULL, NULL, Sbuf);
            memcpy(GS, CHUNK(cGS, b, c), H * p * sizeof(float));
            for (i64 t = t1 - 1; t >= t0; t--) {
                const float *S = causal ? Sbuf + (t - t0) * H * p : CHUNK(cS, b, c);
                for (i64 h = 0; h < H; h++)
                    tok_grad_s(AT(w, sw, b, h, t), S + h * p, temp[h] * BHT(gl, b, h, t), GS + h * p,
                               AT(gw, sgw, b, h, t), NULL, p, causal);
            }
        }
        free(Sbuf); free(GS);
    }
}

/* ---- sequential causal kernels: one work item per batch row, one pass each way ---- */

/* Forward in one pass; the running sums before every chunk are saved as cS, cM, cN (the
   same carries the chunked forward makes), for the backward to rebuild from. */
void tssa_seq_fwd(const float *w, const i64 *sw, const float *temp, const float *bias, const i64 *sbias,
                  const i64 *d, float *pi, float *u, float *out, const i64 *so, float *cS, float *cM,
                  float *cN, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *S = malloc(H * p * sizeof(float)), *M = malloc(H * p * sizeof(float));
        float *N = malloc(H * sizeof(float)), *lg = malloc(H * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (i64 b = 0; b < B; b++) {
            memset(S, 0, H * p * sizeof(float));
            memset(M, 0, H * p * sizeof(float));
            memset(N, 0, H * sizeof(float));
            for (i64 t = 0; t < T; t++) {
                if (t % L == 0) {
                    memcpy(CHUNK(cS, b, t / L), S, H * p * sizeof(float));
                    memcpy(CHUNK(cM, b, t / L), M, H * p * sizeof(float));
                    memcpy(CHUNK1(cN, b, t / L), N, H * sizeof(float));
                }
                for (i64 h = 0; h < H; h++) {
                    float acc = tok_stats(AT(w, sw, b, h, t), S + h * p, p, 1);
                    if (bias) acc += (float)p * bias[h * sbias[0] + t * sbias[1]];
                    BHT(u, b, h, t) = acc;
                    lg[h] = temp[h] * acc;
                }
                tok_softmax(lg, H, 1.f);
                for (i64 h = 0; h < H; h++) {
                    BHT(pi, b, h, t) = lg[h];
                    N[h] += lg[h];
                    tok_out(AT(w, sw, b, h, t), AT(out, so, b, h, t), lg[h], M + h * p, N[h] + EPS_STAT, p, 1);
                }
            }
        }
        free(S); free(M); free(N); free(lg);
    }
}

/* Backward in one reverse pass: chunk by chunk from the end, rebuild its prefix sums, then
   walk its tokens backwards carrying the suffix sums GM, GN, GS. */
void tssa_seq_bwd(const float *w, const i64 *sw, const float *g, const i64 *sg, const float *pi,
                  const float *u, const float *temp, const i64 *d, const float *cS, const float *cM,
                  const float *cN, float *gw, const i64 *sgw, float *gl, float *gtemp_part, int nth) {
    DIMS;
    #pragma omp parallel num_threads(nth)
    {
        float *Mbuf = malloc(L * H * p * sizeof(float)), *Sbuf = malloc(L * H * p * sizeof(float));
        float *Nbuf = malloc(L * H * sizeof(float)), *GM = malloc(H * p * sizeof(float));
        float *GS = malloc(H * p * sizeof(float)), *GN = malloc(H * sizeof(float));
        float *gpi = malloc(H * sizeof(float)), *Pt = malloc(H * sizeof(float)), *glt = malloc(H * sizeof(float));
        #pragma omp for schedule(dynamic, 1)
        for (i64 b = 0; b < B; b++) {
            float *gtp = gtemp_part + b * H;
            memset(GM, 0, H * p * sizeof(float));
            memset(GS, 0, H * p * sizeof(float));
            memset(GN, 0, H * sizeof(float));
            memset(gtp, 0, H * sizeof(float));
            for (i64 c = nC - 1; c >= 0; c--) {
                i64 t0 = c * L, t1 = t0 + L < T ? t0 + L : T;
                rebuild(w, sw, pi, b, H, T, p, t0, t1, CHUNK(cM, b, c), CHUNK1(cN, b, c), CHUNK(cS, b, c), Mbuf, Nbuf, Sbuf);
                for (i64 t = t1 - 1; t >= t0; t--) {
                    i64 k = t - t0;
                    for (i64 h = 0; h < H; h++) {
                        float gN = 0.f;
                        Pt[h] = BHT(pi, b, h, t);
                        float acc = tok_grad_pi(AT(w, sw, b, h, t), AT(g, sg, b, h, t), Pt[h], Mbuf + (k * H + h) * p,
                                                Nbuf[k * H + h] + EPS_STAT, GM + h * p, AT(gw, sgw, b, h, t), p, 1, &gN);
                        GN[h] += gN;
                        gpi[h] = acc + GN[h];
                    }
                    tok_softmax_grad(Pt, gpi, glt, H);
                    for (i64 h = 0; h < H; h++) {
                        BHT(gl, b, h, t) = glt[h];
                        gtp[h] += glt[h] * BHT(u, b, h, t);
                        tok_grad_s(AT(w, sw, b, h, t), Sbuf + (k * H + h) * p, temp[h] * glt[h], GS + h * p,
                                   AT(gw, sgw, b, h, t), NULL, p, 1);
                    }
                }
            }
        }
        free(Mbuf); free(Sbuf); free(Nbuf); free(GM); free(GS); free(GN); free(gpi); free(Pt); free(glt);
    }
}

/* One decoding step for (B, H, p) contiguous tensors; the state is updated in place. */
void tssa_step(const float *w, const float *temp, const float *bias, float *sum_sq, float *sum_pi_sq,
               float *sum_pi, float *out, float *pi, i64 B, i64 H, i64 p) {
    for (i64 b = 0; b < B; b++) {
        float *lg = pi + b * H;
        for (i64 h = 0; h < H; h++)
            lg[h] = temp[h] * (tok_stats(w + (b * H + h) * p, sum_sq + (b * H + h) * p, p, 1) + (float)p * bias[h]);
        tok_softmax(lg, H, 1.f);
        for (i64 h = 0; h < H; h++) {
            sum_pi[b * H + h] += lg[h];
            tok_out(w + (b * H + h) * p, out + (b * H + h) * p, lg[h], sum_pi_sq + (b * H + h) * p,
                    sum_pi[b * H + h] + EPS_STAT, p, 1);
        }
    }
}
"""

# Flag sets tried in order: the first that builds wins. Without -march=native (compilers that
# reject it), then without OpenMP (e.g. clang with no libomp: the pragmas are ignored and the
# kernels run on one thread; the C source calls no omp_* function, so it builds either way).
C_FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3"])
C_COMMON = ["-fPIC", "-shared", "-std=c99"]
_c_lib_cache = []  # [lib or None] once tried
_c_lib_lock = threading.Lock()  # one build per process, even if two threads ask at once


def _cache_dirs():
    """Where the compiled kernels may live, in order: $NANOTOST_CACHE, else
    $XDG_CACHE_HOME/nanotost or ~/.cache/nanotost; then a per-user folder in the temp dir
    (read-only home directories, containers). Only folders we can create and write to."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    candidates = [os.environ.get("NANOTOST_CACHE") or os.path.join(base, "nanotost"),
                  os.path.join(tempfile.gettempdir(), f"nanotost-{uid}")]
    for root in candidates:
        try:
            os.makedirs(root, mode=0o700, exist_ok=True)
        except OSError:
            continue
        owned = not hasattr(os, "getuid") or os.stat(root).st_uid == os.getuid()  # never load another user's .so
        if owned and os.access(root, os.W_OK | os.X_OK):
            yield root


def _cpu_signature():  # -march=native code must not be reused on another CPU model
    try:
        with open("/proc/cpuinfo") as f:
            lines = [l for l in f if l.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "".join(lines) + platform.machine()


def _build(path):
    """Compile C_SOURCE into path with the first flag set that works. Concurrency-safe: each
    process compiles in its own temp folder and publishes the result with an atomic rename,
    so two processes building at once (torchrun ranks, pytest workers) both end with a whole
    file and nobody ever loads half of one. Raises the last build error if no flags work."""
    cc = shlex.split(os.environ.get("CC", "cc"))
    err = None
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
        src, tmp_so = os.path.join(tmp, "fast_tssa.c"), os.path.join(tmp, "fast_tssa.so")
        with open(src, "w") as f:
            f.write(C_SOURCE)
        for flags in C_FLAG_SETS:
            try:
                subprocess.run([*cc, *flags, *C_COMMON, src, "-o", tmp_so, "-lm"], check=True,
                               capture_output=True, timeout=300)
            except (OSError, subprocess.SubprocessError) as e:
                err = e
                continue
            os.replace(tmp_so, path)  # same folder, so an atomic rename
            return flags
    raise err


def c_library():
    """The compiled C kernels (ctypes.CDLL), or None if no C compiler could build them
    (then the CPU falls back to model.py's reference; impl="fast" uses the "torch" back end).
    Built once into the first writable folder of _cache_dirs(), keyed by source, flag sets,
    compiler and CPU; later processes load the cached file. NANOTOST_NO_C=1 skips the C
    kernels altogether."""
    if _c_lib_cache:
        return _c_lib_cache[0]
    with _c_lib_lock:
        if not _c_lib_cache:
            _c_lib_cache.append(_load_c_library())
    return _c_lib_cache[0]


def _load_c_library():
    if os.environ.get("NANOTOST_NO_C") == "1":
        return None
    key = (C_SOURCE + repr(C_FLAG_SETS + (C_COMMON,)) + os.environ.get("CC", "cc") + _cpu_signature()).encode()
    name = f"fast_tssa_{hashlib.sha256(key).hexdigest()[:16]}.so"
    errors = []
    for root in _cache_dirs():
        path = os.path.join(root, name)
        try:
            if os.path.exists(path):
                try:
                    return ctypes.CDLL(path)
                except OSError:  # not loadable (e.g. a foreign file): build it again
                    pass
            flags = _build(path)
            if flags != C_FLAG_SETS[0]:
                warnings.warn(f"fast_tssa: built the C kernels with {' '.join(flags)} only (the compiler rejected "
                              f"{' '.join(C_FLAG_SETS[0])}); without -fopenmp they run on one thread.")
            return ctypes.CDLL(path)
        except (OSError, subprocess.SubprocessError) as e:
            detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace")[-300:]
            errors.append(f"{root}: {e} {detail}".strip())
            if isinstance(e, (subprocess.SubprocessError, FileNotFoundError)) and not os.path.exists(path):
                break  # the compiler failed (not the folder): another folder will not help
    warnings.warn("fast_tssa: could not build the C kernels (" + "; ".join(errors or ["no writable cache folder"])
                  + "); CPU runs use the PyTorch reference. Install a C compiler (gcc) to enable them.")
    return None


def _ptr(t):  # a tensor's data pointer for ctypes (None -> NULL)
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _strides(t):  # element strides of the B, H, T dims of a (B, H, T, p) tensor
    return (ctypes.c_longlong * 3)(*t.stride()[:3])


def _nthreads():
    return ctypes.c_int(max(1, torch.get_num_threads()))


class CKernels:
    name = "cpu"
    L = 128  # tokens per work item: two (L, H, p) fp32 rebuild buffers stay in L2

    @staticmethod
    def prepare(w):  # fp32 with unit stride along p, any strides otherwise (no copy in the model)
        w = w.float()
        return w if w.stride(-1) == 1 else w.contiguous()

    @staticmethod
    def _dims(wk, causal):
        B, H, T, p = wk.shape
        nC = -(-T // CKernels.L)
        return B, H, T, p, nC, (ctypes.c_longlong * 6)(B, H, T, p, CKernels.L, int(causal))

    @staticmethod
    def sequential(B, causal, mask=None):
        """One pass each way per batch row when every thread can have a row (or there is
        one thread); otherwise chunks of L tokens in parallel with carries between passes."""
        return causal and mask is None and (B >= torch.get_num_threads() or torch.get_num_threads() == 1)

    @staticmethod
    def forward(w, temp, bias, mask, causal):
        lib, nth = c_library(), _nthreads()
        wk = CKernels.prepare(w)
        B, H, T, p, nC, d = CKernels._dims(wk, causal)
        sw, mode = _strides(wk), ctypes.c_int(0 if causal else 2)
        carry = lambda part, K: lib.tssa_carry(_ptr(part), *(ctypes.c_longlong(n) for n in (B, nC, K)), mode)
        temp = temp.float().contiguous()
        bias = None if bias is None else bias.float()
        sbias = None if bias is None else (ctypes.c_longlong * 2)(*bias.stride())
        f32 = dict(dtype=torch.float32)  # explicit: a float64 default dtype must not reach the C pointers
        pi, u = torch.empty(B, H, T, **f32), torch.empty(B, H, T, **f32)
        cS, cM, cN = torch.empty(B, nC, H, p, **f32), torch.empty(B, nC, H, p, **f32), torch.empty(B, nC, H, **f32)
        out = torch.empty_like(wk)  # same strides as w: merging the heads afterwards is a view
        if CKernels.sequential(B, causal, mask):
            lib.tssa_seq_fwd(_ptr(wk), sw, _ptr(temp), _ptr(bias), sbias, d, _ptr(pi), _ptr(u), _ptr(out),
                             _strides(out), _ptr(cS), _ptr(cM), _ptr(cN), nth)
            return out.to(w.dtype), pi, u, (cS, cM, cN)
        lib.tssa_sum_sq(_ptr(wk), sw, d, _ptr(cS), nth)
        carry(cS, H * p)
        mask = None if mask is None else mask.float().contiguous()
        lib.tssa_fwd_pi(_ptr(wk), sw, _ptr(mask), _ptr(temp), _ptr(bias), sbias, d, _ptr(cS),
                        _ptr(pi), _ptr(u), _ptr(cM), _ptr(cN), nth)
        carry(cM, H * p)
        carry(cN, H)
        lib.tssa_fwd_out(_ptr(wk), sw, _ptr(pi), d, _ptr(cM), _ptr(cN), _ptr(out), _strides(out), nth)
        return out.to(w.dtype), pi, u, (cS, cM, cN)

    @staticmethod
    def backward(w, g, temp, pi, u, mask, saved, causal):
        lib, nth = c_library(), _nthreads()
        wk, g = CKernels.prepare(w), CKernels.prepare(g)
        B, H, T, p, nC, d = CKernels._dims(wk, causal)
        sw, sg, mode = _strides(wk), _strides(g), ctypes.c_int(1 if causal else 2)
        carry = lambda part, K: lib.tssa_carry(_ptr(part), *(ctypes.c_longlong(n) for n in (B, nC, K)), mode)
        cS, cM, cN = saved
        temp32 = temp.float().contiguous()
        f32 = dict(dtype=torch.float32)
        gw, gl = torch.empty_like(wk), torch.empty(B, H, T, **f32)
        if CKernels.sequential(B, causal, mask):
            gtemp_part = torch.empty(B, H, **f32)
            lib.tssa_seq_bwd(_ptr(wk), sw, _ptr(g), sg, _ptr(pi), _ptr(u), _ptr(temp32), d, _ptr(cS), _ptr(cM),
                             _ptr(cN), _ptr(gw), _strides(gw), _ptr(gl), _ptr(gtemp_part), nth)
        else:
            cGM, cGN = torch.empty(B, nC, H, p, **f32), torch.empty(B, nC, H, **f32)
            lib.tssa_bwd_sum_gm(_ptr(wk), sw, _ptr(g), sg, _ptr(pi), d, _ptr(cM), _ptr(cN), _ptr(cGM), _ptr(cGN), nth)
            carry(cGM, H * p)
            carry(cGN, H)
            cGS, gtemp_part = torch.empty(B, nC, H, p, **f32), torch.empty(B * nC, H, **f32)
            lib.tssa_bwd_pi(_ptr(wk), sw, _ptr(g), sg, _ptr(pi), _ptr(u), _ptr(temp32), d, _ptr(cS), _ptr(cM),
                            _ptr(cN), _ptr(cGM), _ptr(cGN), _ptr(gw), _strides(gw), _ptr(gl), _ptr(cGS),
                            _ptr(gtemp_part), nth)
            carry(cGS, H * p)
            lib.tssa_bwd_w(_ptr(wk), sw, _ptr(gl), _ptr(temp32), d, _ptr(cS), _ptr(cGS), _ptr(gw), _strides(gw), nth)
        return gw.to(w.dtype), gtemp_part.sum(0), p * temp32.view(H, 1) * gl.sum(0)

    @staticmethod
    def step(w_t, temp, bias, state):
        """One decoding token: w_t (B, H, p); state tensors fp32 contiguous, updated in place."""
        B, H, p = w_t.shape
        x = w_t.float().contiguous()
        temp, bias = temp.float().contiguous(), bias.float().contiguous()
        out, pi = torch.empty(B, H, p, dtype=torch.float32), torch.empty(B, H, dtype=torch.float32)
        ll = ctypes.c_longlong
        c_library().tssa_step(_ptr(x), _ptr(temp), _ptr(bias), _ptr(state.sum_sq), _ptr(state.sum_pi_sq),
                              _ptr(state.sum_pi), _ptr(out), _ptr(pi), ll(B), ll(H), ll(p))
        return out.to(w_t.dtype), pi


# -----------------------------------------------------------------------------
# 3. Back end "triton": chunked kernels (CUDA; TRITON_INTERPRET=1 runs them on CPU)
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

if triton is not None:

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
    def _mn(q, Pt, cMN_ptr, pid_bh, c, nC, p, CAUSAL: tl.constexpr, P: tl.constexpr):
        """M (BT, P) = running sum of Pi w^2 and n (BT, 1) = running sum of Pi + EPS_STAT."""
        M = _carry(cMN_ptr, pid_bh, c, nC, p + 1, p, P)[None, :]
        N = _carry_n(cMN_ptr, pid_bh, c, nC, p)
        if CAUSAL:
            M = M + tl.cumsum(Pt[:, None] * q, axis=0)
            n = (N + tl.cumsum(Pt, axis=0))[:, None] + 1e-8
        else:
            n = (N + tl.zeros_like(Pt))[:, None] + 1e-8
        return M, n

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
    def _logit(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, b, h, c, H, T, p, nC,
               HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
        """Head h of chunk c of row b: w^2 (BT, P), u = r + p * bias (BT,) and logit = temp * u."""
        x = _tile(w_ptr, s_b, s_h, s_t, b * H + h, H, c * BT, T, p, BT, P)
        q = x * x
        u = tl.sum(q / (_running_sq(q, cS_ptr, b * H + h, c, nC, p, CAUSAL, P) + 1e-12), axis=1)
        if HAS_BIAS:
            t = c * BT + tl.arange(0, BT)
            u += p * tl.load(bias_ptr + h * bias_h + t * bias_t, mask=t < T, other=0.0).to(tl.float32)
        return q, u, tl.load(temp_ptr + h) * u

    @triton.jit
    def _k_stats_pi(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, mask_ptr, u_ptr, pi_ptr,
                    part_ptr, B, H, T, p, nC, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
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
                              nC, HAS_BIAS, CAUSAL, BT, P)
            new_top = tl.maximum(top, lg)
            den = den * tl.exp(top - new_top) + tl.exp(lg - new_top)
            top = new_top
        keep = t < T  # tokens past T must add nothing to the totals
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptr + b.to(tl.int64) * T + t, mask=t < T, other=0.0) != 0)
        for h in range(H):  # pass 2: Pi, recomputing the logits (the tiles are hot in cache)
            q, u, lg = _logit(w_ptr, s_b, s_h, s_t, cS_ptr, temp_ptr, bias_ptr, bias_h, bias_t, b, h, c, H, T, p,
                              nC, HAS_BIAS, CAUSAL, BT, P)
            Pt = tl.where(keep, tl.exp(lg - top) / den, 0.0)
            _store_row(u_ptr, u, b * H + h, c * BT, T, BT)
            _store_row(pi_ptr, Pt, b * H + h, c * BT, T, BT)
            _store_total(part_ptr, Pt[:, None] * q, b * H + h, c, nC, p + 1, p, P)
            _store_total_n(part_ptr, Pt, b * H + h, c, nC, p)

    @triton.jit
    def _k_apply(w_ptr, s_b, s_h, s_t, pi_ptr, cMN_ptr, out_ptr, o_b, o_h, o_t, H, T, p, nC, BH,
                 CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
        """F3: out = -Pi w n / (n + M)."""
        pid_bh, c = _pids(BH)
        x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
        Pt = _row(pi_ptr, pid_bh, c * BT, T, BT)
        M, n = _mn(x * x, Pt, cMN_ptr, pid_bh, c, nC, p, CAUSAL, P)
        _store_tile(out_ptr, -Pt[:, None] * x * n / (n + M), o_b, o_h, o_t, pid_bh, H, c * BT, T, p, BT, P)

    @triton.jit
    def _k_sum_gm(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, cMN_ptr, part_ptr, H, T, p, nC, BH,
                  CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
        """B1: chunk totals of dL/dM (columns 0..p-1) and dL/dN (column p) -> part (B*H, nC, p + 1)."""
        pid_bh, c = _pids(BH)
        x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
        g = _tile(g_ptr, g_b, g_h, g_t, pid_bh, H, c * BT, T, p, BT, P)
        Pt = _row(pi_ptr, pid_bh, c * BT, T, BT)
        M, n = _mn(x * x, Pt, cMN_ptr, pid_bh, c, nC, p, CAUSAL, P)
        gM, gN, _ = _gm(x, g, Pt, M, n)
        _store_total(part_ptr, gM, pid_bh, c, nC, p + 1, p, P)
        _store_total_n(part_ptr, gN, pid_bh, c, nC, p)

    @triton.jit
    def _k_grad_pi(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, u_ptr, temp_ptr, mask_ptr, cS_ptr, cMN_ptr,
                   cGMN_ptr, gpi_ptr, R_ptr, gtemp_ptr, part_ptr, B, H, T, p, nC, HAS_MASK: tl.constexpr,
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
            M, n = _mn(x * x, Pt, cMN_ptr, bh, c, nC, p, CAUSAL, P)
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
            A = 1.0 / (_running_sq(q, cS_ptr, bh, c, nC, p, CAUSAL, P) + 1e-12)
            _store_total(part_ptr, -Rt[:, None] * q * A * A, bh, c, nC, p, p, P)

    @triton.jit
    def _k_grad_w(w_ptr, s_b, s_h, s_t, g_ptr, g_b, g_h, g_t, pi_ptr, R_ptr, cS_ptr, cMN_ptr, cGMN_ptr, cGS_ptr,
                  gw_ptr, o_b, o_h, o_t, H, T, p, nC, BH, CAUSAL: tl.constexpr, BT: tl.constexpr, P: tl.constexpr):
        """B3: dL/dw = Pi (2 w G_M - D g) + 2 w (R A + G_S)."""
        pid_bh, c = _pids(BH)
        x = _tile(w_ptr, s_b, s_h, s_t, pid_bh, H, c * BT, T, p, BT, P)
        g = _tile(g_ptr, g_b, g_h, g_t, pid_bh, H, c * BT, T, p, BT, P)
        Pt = _row(pi_ptr, pid_bh, c * BT, T, BT)
        Rt = _row(R_ptr, pid_bh, c * BT, T, BT)[:, None]
        q = x * x
        M, n = _mn(q, Pt, cMN_ptr, pid_bh, c, nC, p, CAUSAL, P)
        GM, _, D = _suffix_gm(x, g, Pt, M, n, cGMN_ptr, pid_bh, c, nC, p, CAUSAL, P)
        A = 1.0 / (_running_sq(q, cS_ptr, pid_bh, c, nC, p, CAUSAL, P) + 1e-12)
        gS = -Rt * q * A * A
        GS = _carry(cGS_ptr, pid_bh, c, nC, p, p, P)[None, :]
        if CAUSAL:
            GS = GS + tl.cumsum(gS, axis=0, reverse=True)
        gw = Pt[:, None] * (2.0 * x * GM - D * g) + 2.0 * x * (Rt * A + GS)
        _store_tile(gw_ptr, gw, o_b, o_h, o_t, pid_bh, H, c * BT, T, p, BT, P)

    @triton.jit
    def _k_step(w_ptr, temp_ptr, bias_ptr, bias_stride, ssq_ptr, spsq_ptr, sp_ptr, out_ptr, pi_ptr, H, p,
                HP: tl.constexpr, P: tl.constexpr):
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
        logit = temp * (tl.sum(q / (S + 1e-12), axis=1) + p * bias)
        logit = tl.where(h < H, logit, float("-inf"))
        e = tl.exp(logit - tl.max(logit, axis=0))
        Pt = e / tl.sum(e, axis=0)
        N = tl.load(sp_ptr + b * H + h, mask=h < H, other=0.0) + Pt
        tl.store(sp_ptr + b * H + h, N, mask=h < H)
        M = tl.load(spsq_ptr + offs, mask=m, other=0.0) + Pt[:, None] * q
        tl.store(spsq_ptr + offs, M, mask=m)
        n = N[:, None] + 1e-8
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
    """The five-kernel forward and backward of section 3 (out, Pi, u, saved carries)."""

    name = "triton"

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
    def forward(cls, w, temp, bias, mask, causal):
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
        _k_stats_pi[per_row](wk, *sw, cS, temp, *bias_args, mask, u, pi, part_MN, B, H, T, p, nC,
                             HAS_BIAS=has_bias, HAS_MASK=has_mask, CAUSAL=causal, **meta)
        cMN = _carries(part_MN, "prefix" if causal else "total")
        out = torch.empty_like(wk, dtype=w.dtype)
        _k_apply[per_head](wk, *sw, pi, cMN, out, *out.stride()[:3], H, T, p, nC, B * H, CAUSAL=causal, **meta)
        return out, pi, u, (cS, cMN)

    @classmethod
    def backward(cls, w, g, temp, pi, u, mask, saved, causal):
        cS, cMN = saved
        wk, g = cls.prepare(w), cls.prepare(g)
        B, H, T, p = wk.shape
        meta, nC, per_head, per_row, buf = cls._setup(wk)
        sw, sg = wk.stride()[:3], g.stride()[:3]
        part_GMN = buf(B * H, nC, p + 1)
        _k_sum_gm[per_head](wk, *sw, g, *sg, pi, cMN, part_GMN, H, T, p, nC, B * H, CAUSAL=causal, **meta)
        cGMN = _carries(part_GMN, "suffix" if causal else "total")
        gpi, R, gtemp, part_S = buf(B, H, T), buf(B, H, T), buf(B * nC, H), buf(B * H, nC, p)
        temp = temp.reshape(H).float().contiguous()
        has_mask = mask is not None
        mask = mask.float().contiguous() if has_mask else gpi  # gpi: an unread stand-in
        _k_grad_pi[per_row](wk, *sw, g, *sg, pi, u, temp, mask, cS, cMN, cGMN, gpi, R, gtemp, part_S,
                            B, H, T, p, nC, HAS_MASK=has_mask, CAUSAL=causal, **meta)
        cGS = _carries(part_S, "suffix" if causal else "total")
        gw = torch.empty_like(wk, dtype=w.dtype)
        _k_grad_w[per_head](wk, *sw, g, *sg, pi, R, cS, cMN, cGMN, cGS, gw, *gw.stride()[:3], H, T, p, nC, B * H,
                            CAUSAL=causal, **meta)
        return gw, gtemp.sum(0), (p * R.sum(0) if causal else None)  # dbias = p * temp * sum_b gl

    @staticmethod
    def step(w_t, temp, bias, state):
        B, H, p = w_t.shape
        x = w_t.contiguous()
        out = torch.empty_like(x)
        pi = torch.empty(B, H, device=x.device, dtype=torch.float32)
        bias = bias.float()
        _k_step[(B,)](x, temp.float().contiguous(), bias, bias.stride(0), state.sum_sq, state.sum_pi_sq,
                      state.sum_pi, out, pi, H, p, HP=triton.next_power_of_2(H), P=triton.next_power_of_2(p))
        return out, pi


def _on_device(t):
    """Launch on t's GPU (Triton launches on the current CUDA device: a tensor on cuda:1 while
    cuda:0 is current would be an illegal address); nothing to do elsewhere."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# -----------------------------------------------------------------------------
# 4. The autograd.Function shared by every back end, and the entry points model.py calls


class FusedTSSA(torch.autograd.Function):
    """out, Pi = TSSA(w) with the hand-derived backward of the module docstring. Saves w, Pi
    and u (B, H, T) and per-chunk carries, about 1/p of w besides w itself, where autograd
    through the reference keeps ~10 tensors the size of w. bias (H, T) or None; mask (B, T)
    float or None (non-causal only); kernels: a back end class."""

    @staticmethod
    def forward(ctx, w, temp, bias, mask, causal, kernels):
        with torch.autocast(w.device.type, enabled=False), _on_device(w):
            wm = w if mask is None else w * mask[:, None, :, None].to(w.dtype)  # padded tokens are zeros
            out, pi, u, saved = kernels.forward(wm, temp, bias, mask, causal)
        tensors = [x for x in saved if torch.is_tensor(x)]
        ctx.layout = [torch.is_tensor(x) for x in saved]
        ctx.constants = [x for x in saved if not torch.is_tensor(x)]
        ctx.causal, ctx.kernels = causal, kernels
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(w, temp, mask, pi, u, *tensors)
        ctx.mark_non_differentiable(pi)
        return out, pi

    @staticmethod
    def backward(ctx, g_out, _g_pi):  # _g_pi is ignored: Pi is returned detached
        w, temp, mask, pi, u, *tensors = ctx.saved_tensors
        tensors, constants = iter(tensors), iter(ctx.constants)
        saved = tuple(next(tensors) if is_t else next(constants) for is_t in ctx.layout)
        with torch.autocast(w.device.type, enabled=False), _on_device(w):
            wm = w if mask is None else w * mask[:, None, :, None].to(w.dtype)
            gw, gtemp, gbias = ctx.kernels.backward(wm, g_out, temp, pi, u, mask, saved, ctx.causal)
            if mask is not None:
                gw = gw * mask[:, None, :, None].to(gw.dtype)
        gbias = None if ctx.bias_dtype is None else gbias.to(ctx.bias_dtype)
        return gw.to(w.dtype), gtemp.to(temp.dtype), gbias, None, None, None


def kernels_for(w, impl="fast"):
    """The back end that runs w: Triton on CUDA (or under TRITON_INTERPRET=1 on CPU), the C
    kernels on CPU for fp16/bf16/fp32 when they build, else the PyTorch form."""
    if triton is not None and (w.device.type == "cuda" or INTERPRET) and w.dtype != torch.float64:
        return TritonKernels
    if w.device.type == "cpu" and w.dtype != torch.float64 and c_library() is not None:
        return CKernels
    return TorchKernels


def applies(w, pi_mode="softmax", impl="auto"):
    """Whether model.py should hand this call to fast_tssa. impl: "auto" (Triton on CUDA; the C
    kernels on CPU for fp32/bf16/fp16 when a C compiler built them), "fast" (always, falling
    back to the PyTorch form of the hand-derived backward), "reference" (never). The uniform-Pi
    ablation and float64 under "auto" stay on the reference. w: (B, H, T, p) or (B, H, p)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "reference" or pi_mode != "softmax" or w.dim() not in (3, 4):
        return False
    if impl == "fast":
        return True
    if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if w.device.type == "cuda":
        return triton is not None
    return w.device.type == "cpu" and (c_library() is not None or (triton is not None and INTERPRET))


# Under torch.compile the three entry points below run as they are, between compiled graphs (a graph break per call): Dynamo would otherwise trace into the kernel
# launches (on CPU into ctypes calls, or into the Triton interpreter, where it fails).
@torch.compiler.disable
def tssa(w, temp, return_pi=False, mask=None, kernels=None):
    """Non-causal TSSA, as model.tssa: w (B, H, T, p), temp (H,), mask (B, T) bool or None."""
    if mask is not None:
        if mask.shape != (w.shape[0], w.shape[2]):
            raise ValueError(f"mask must have shape (B, T) = {(w.shape[0], w.shape[2])}, got {tuple(mask.shape)}")
        mask = mask.to(w.dtype if w.dtype == torch.float64 else torch.float32)
    out, pi = FusedTSSA.apply(w, temp, None, mask, False, kernels or kernels_for(w))
    return (out, pi) if return_pi else out


@torch.compiler.disable
def causal_tssa(w, temp, bias, return_pi=False, kernels=None):
    """Causal TSSA, as model.causal_tssa: w (B, H, T, p), temp (H,), bias (H, T) (already
    sliced to T tokens)."""
    out, pi = FusedTSSA.apply(w, temp, bias, None, True, kernels or kernels_for(w))
    return (out, pi) if return_pi else out


def step_applies(w_t, temp, pos_bias, state, pi_mode="softmax"):
    """Whether model.causal_tssa_step should run the fused step: decoding only (no gradient
    wanted), softmax Pi, fp32 contiguous state on w_t's device, and a fused back end."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (w_t, temp, pos_bias))
    if needs_grad or w_t.dim() != 3 or not applies(w_t, pi_mode, "auto"):
        return False
    stats = (state.sum_sq, state.sum_pi_sq, state.sum_pi)
    return kernels_for(w_t) in (CKernels, TritonKernels) and all(
        t.dtype == torch.float32 and t.is_contiguous() and t.device == w_t.device for t in stats)


@torch.compiler.disable
def causal_tssa_step(w_t, temp, pos_bias, state, return_pi=False, kernels=None):
    """One decoding token, as model.causal_tssa_step, in one fused call (no autograd: use it
    where step_applies says so). w_t (B, H, p); the state is advanced in place."""
    H = w_t.shape[1]
    pos_bias = pos_bias.reshape(H, -1)  # (H, T_max)
    bias = pos_bias[:, min(state.pos, pos_bias.shape[1] - 1)]  # (H,); the last one past the end
    with torch.no_grad(), _on_device(w_t):
        out, pi = (kernels or kernels_for(w_t)).step(w_t, temp.reshape(H), bias.float(), state)
    state.pos += 1
    return (out, state, pi) if return_pi else (out, state)
