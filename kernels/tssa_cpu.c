/* The CPU kernels of kernels/cpu.py (which documents the maths and the passes), compiled
   at first use with the system C compiler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
typedef long long i64;
/* Shapes and guards of one call: nC chunks of L tokens. The two guards come from model.py
   (PI_NORM_EPS, STAT_EPS) through kernels/cpu.py: sq_floor floors the running sum of
   squares inside Pi (max(S, sq_floor), as the released clamp), stat_eps is added to the
   Pi-weighted token count. */
typedef struct { i64 B, H, T, p, L, causal; float sq_floor, stat_eps; } dims_t;
#define DIMS i64 B = d->B, H = d->H, T = d->T, p = d->p, L = d->L, nC = (T + L - 1) / L; \
             int causal = (int)d->causal; float FLOOR = d->sq_floor, SEPS = d->stat_eps; \
             (void)B; (void)causal; (void)FLOOR; (void)SEPS
/* element (b, h, t, 0) of a (B, H, T, p) tensor with unit stride along p, strides s */
#define AT(x, s, b, h, t) ((x) + (b) * (s)[0] + (h) * (s)[1] + (t) * (s)[2])
#define BHT(x, b, h, t) ((x)[((b) * H + (h)) * T + (t)])      /* (B, H, T) contiguous */
#define CHUNK(x, b, c) ((x) + ((b) * nC + (c)) * H * p)       /* (B, nC, H, p) contiguous */
#define CHUNK1(x, b, c) ((x) + ((b) * nC + (c)) * H)          /* (B, nC, H) contiguous */
#define FOR_ITEMS for (i64 bc = 0; bc < B * nC; bc++)
#define ITEM i64 b = bc / nC, c = bc % nC, t0 = c * L, t1 = t0 + L < T ? t0 + L : T

/* ---- per (token, head) pieces shared by the chunked and the sequential kernels ---- */

/* sum_i w^2 / max(S, floor); with update, S += w^2 first (causal). The max is a ternary,
   not fmaxf: fmaxf's NaN rules keep GCC from vectorising the loop (1.6x slower end to end). */
static inline float tok_stats(const float *x, float *S, i64 p, int update, float floor) {
    float acc = 0.f;
    if (update) {
        #pragma omp simd reduction(+:acc)
        for (i64 i = 0; i < p; i++) { float q = x[i] * x[i]; S[i] += q; acc += q / (S[i] > floor ? S[i] : floor); }
    } else {
        #pragma omp simd reduction(+:acc)
        for (i64 i = 0; i < p; i++) acc += x[i] * x[i] / (S[i] > floor ? S[i] : floor);
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

/* out = -Pi w n / (n + M), n = N + stat_eps; with update, M += Pi w^2 first */
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

/* S path of the backward at one token: gS = -R w^2 A^2, A = 1 / max(S, floor), and no
   gradient where the floor holds (as torch's clamp_min: none where S < floor). With
   update, GS += gS (suffix sums); if o, o += 2 w (R A + GS); if part, part += gS. */
static inline void tok_grad_s(const float *x, const float *S, float R, float *GS, float *o, float *part,
                              i64 p, int update, float floor) {
    #pragma omp simd
    for (i64 i = 0; i < p; i++) {
        float A = 1.f / (S[i] > floor ? S[i] : floor), gS = S[i] >= floor ? -R * (x[i] * x[i]) * A * A : 0.f;
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
void tssa_sum_sq(const float *w, const i64 *sw, const dims_t *d, float *partS, int nth) {
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

/* F2: u = sum_i w^2 / max(S, floor) + p bias, Pi = softmax over heads of temp u (times the
   mask), chunk totals of Pi w^2 and Pi. S = carry + running sum (causal) or the total. */
void tssa_fwd_pi(const float *w, const i64 *sw, const float *mask, const float *temp,
                 const float *bias, const i64 *sbias, const dims_t *d, const float *cS,
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
                    float acc = tok_stats(AT(w, sw, b, h, t), S + h * p, p, causal, FLOOR);
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
void tssa_fwd_out(const float *w, const i64 *sw, const float *pi, const dims_t *d, const float *cM,
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
                    tok_out(AT(w, sw, b, h, t), AT(out, so, b, h, t), Pt, M + h * p, N[h] + SEPS, p, causal);
                }
        }
        free(M); free(N);
    }
}

/* B1: chunk totals of gM and gN */
void tssa_bwd_sum_gm(const float *w, const i64 *sw, const float *g, const i64 *sg, const float *pi,
                     const dims_t *d, const float *cM, const float *cN, float *partGM, float *partGN, int nth) {
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
                    tok_grad_pi(x, AT(g, sg, b, h, t), Pt, Mh, N[h] + SEPS, PGM + h * p, o, p, 1, PGN + h);
                }
        }
        free(M); free(N); free(o);
    }
}

/* B2, tokens walked backwards: dL/dPi, softmax backward (gl stored, gtemp partials), the Pi
   path of gw, chunk totals of gS. */
void tssa_bwd_pi(const float *w, const i64 *sw, const float *g, const i64 *sg, const float *pi,
                 const float *u, const float *temp, const dims_t *d, const float *cS, const float *cM,
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
                    float acc = tok_grad_pi(AT(w, sw, b, h, t), AT(g, sg, b, h, t), Pt[h], M + h * p, N[h] + SEPS,
                                            GM + h * p, AT(gw, sgw, b, h, t), p, causal, &gN);
                    if (causal) GN[h] += gN;
                    gpi[h] = acc + GN[h];
                }
                tok_softmax_grad(Pt, gpi, glt, H);
                for (i64 h = 0; h < H; h++) {
                    BHT(gl, b, h, t) = glt[h];
                    gtp[h] += glt[h] * BHT(u, b, h, t);
                    tok_grad_s(AT(w, sw, b, h, t), S + h * p, temp[h] * glt[h], NULL, NULL, PGS + h * p, p, 0, FLOOR);
                }
            }
        }
        free(Mbuf); free(Sbuf); free(Nbuf); free(GM); free(GN); free(gpi); free(Pt); free(glt);
    }
}

/* B3, tokens walked backwards: gw += 2 w (R A + G_S), R = temp gl */
void tssa_bwd_w(const float *w, const i64 *sw, const float *gl, const float *temp, const dims_t *d,
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
                               AT(gw, sgw, b, h, t), NULL, p, causal, FLOOR);
            }
        }
        free(Sbuf); free(GS);
    }
}

/* ---- sequential causal kernels: one work item per batch row, one pass each way ----
   Kept beside the chunked kernels above, which alone would suffice: when every thread has a
   batch row (training) one pass each way is 1.5-1.7x faster than three (measured at
   B, H, T, p = 16, 4, 128, 24 and 8, 12, 1024, 64 on one thread); the chunked kernels are
   what parallelises one long sequence. */

/* Forward in one pass; the running sums before every chunk are saved as cS, cM, cN (the
   same carries the chunked forward makes), for the backward to rebuild from. */
void tssa_seq_fwd(const float *w, const i64 *sw, const float *temp, const float *bias, const i64 *sbias,
                  const dims_t *d, float *pi, float *u, float *out, const i64 *so, float *cS, float *cM,
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
                    float acc = tok_stats(AT(w, sw, b, h, t), S + h * p, p, 1, FLOOR);
                    if (bias) acc += (float)p * bias[h * sbias[0] + t * sbias[1]];
                    BHT(u, b, h, t) = acc;
                    lg[h] = temp[h] * acc;
                }
                tok_softmax(lg, H, 1.f);
                for (i64 h = 0; h < H; h++) {
                    BHT(pi, b, h, t) = lg[h];
                    N[h] += lg[h];
                    tok_out(AT(w, sw, b, h, t), AT(out, so, b, h, t), lg[h], M + h * p, N[h] + SEPS, p, 1);
                }
            }
        }
        free(S); free(M); free(N); free(lg);
    }
}

/* Backward in one reverse pass: chunk by chunk from the end, rebuild its prefix sums, then
   walk its tokens backwards carrying the suffix sums GM, GN, GS. */
void tssa_seq_bwd(const float *w, const i64 *sw, const float *g, const i64 *sg, const float *pi,
                  const float *u, const float *temp, const dims_t *d, const float *cS, const float *cM,
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
                                                Nbuf[k * H + h] + SEPS, GM + h * p, AT(gw, sgw, b, h, t), p, 1, &gN);
                        GN[h] += gN;
                        gpi[h] = acc + GN[h];
                    }
                    tok_softmax_grad(Pt, gpi, glt, H);
                    for (i64 h = 0; h < H; h++) {
                        BHT(gl, b, h, t) = glt[h];
                        gtp[h] += glt[h] * BHT(u, b, h, t);
                        tok_grad_s(AT(w, sw, b, h, t), Sbuf + (k * H + h) * p, temp[h] * glt[h], GS + h * p,
                                   AT(gw, sgw, b, h, t), NULL, p, 1, FLOOR);
                    }
                }
            }
        }
        free(Mbuf); free(Sbuf); free(Nbuf); free(GM); free(GS); free(GN); free(gpi); free(Pt); free(glt);
    }
}

/* One decoding step for (B, H, p) contiguous tensors; the state is updated in place. */
void tssa_step(const float *w, const float *temp, const float *bias, float *sum_sq, float *sum_pi_sq,
               float *sum_pi, float *out, float *pi, i64 B, i64 H, i64 p, float sq_floor, float stat_eps) {
    for (i64 b = 0; b < B; b++) {
        float *lg = pi + b * H;
        for (i64 h = 0; h < H; h++)
            lg[h] = temp[h] * (tok_stats(w + (b * H + h) * p, sum_sq + (b * H + h) * p, p, 1, sq_floor) + (float)p * bias[h]);
        tok_softmax(lg, H, 1.f);
        for (i64 h = 0; h < H; h++) {
            sum_pi[b * H + h] += lg[h];
            tok_out(w + (b * H + h) * p, out + (b * H + h) * p, lg[h], sum_pi_sq + (b * H + h) * p,
                    sum_pi[b * H + h] + stat_eps, p, 1);
        }
    }
}
