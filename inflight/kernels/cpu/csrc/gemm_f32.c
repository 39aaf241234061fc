/*
 * fp32 linear layer for the CPU, every ISA level from this one source (vec.h):
 * out[M, N] = x[M, K] . W[N, K]^T (+ bias).
 *
 * W is packed once at load time (gemm_f32.py) into panels of NR output columns,
 * K-major inside a panel: packed[N/NR][K][NR], zero-padded past N. The
 * microkernel keeps an R x NR block of out (R <= MR rows) in MR * NV vector
 * registers over a stretch of K: per k it loads the panel's NV vectors and
 * broadcasts one x value per row (BLIS style; x is read in place, rows lda apart).
 *
 *   level     VL  regs  MR x NR   accumulators + B + broadcast
 *   avx512    16  32     8 x 48   24 + 3 + 1
 *   avx2       8  16     6 x 16   12 + 2 + 1
 *   neon       4  32     8 x 12   24 + 3 + 1
 *   scalar     4  16     4 x 8     8 + 2 + 1 (whatever the baseline makes of it)
 *
 * Blocking: per block of MC rows (its MC x K slice of x stays in L2), each panel
 * passes under the block's row groups, from L2; the second row group prefetches the
 * next panel, so that only the first panel of a block waits on DRAM. A K longer than
 * a 96 KB chunk of a panel goes in chunks (smaller chunks, sized for L1, measured
 * slower at K = 576-1536: the partial sums cost more than the L1 reuse saved);
 * partial sums go to out (or a per-thread scratch for the epilogues) between chunks
 * and come back unchanged, so every output is the same fp32 sum in the same order
 * whatever M, the blocking or the thread count: a row's result does not depend on
 * the batch it is in.
 *
 * Threads split the panels (each streams its own contiguous stretch of the packed
 * weight: a decode step reads it once at DRAM speed) and, when the panels are too
 * few for all of them, the row blocks too.
 *
 * Entry points: gemm_f32 (plain, optional bias); gemm_f32_silu (the gate_up
 * projection, silu(gate) * up in its epilogue); gemm_f32_argmax (the logits
 * projection reduced to each row's argmax, for greedy sampling; _masked: over the
 * tokens a grammar allows); gemm_f32_q4* and gemm_f32_q8* (the same over 4- and 8-bit
 * panels, panel_lowbit.h: for the few rows of a decode step).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

#if VL == 16
#define MR 8
#define NV 3
#elif defined(INFLIGHT_ISA_AVX2)
#define MR 6
#define NV 2
#elif defined(INFLIGHT_ISA_NEON)
#define MR 8
#define NV 3
#else
#define MR 4
#define NV 2
#endif
#define NR (NV * VL)        /* output columns per packed panel */
#ifndef KC_MAX
#define KC_MAX (24576 / NR)  /* a KC x NR chunk of a panel: 96 KB */
#endif
#ifndef MC_MAX
#define MC_MAX (32 * MR)    /* rows per L2 block of x */
#endif
#ifndef L2_X_BYTES
#define L2_X_BYTES (320 * 1024)  /* the block's MC x K slice of x */
#endif

_Static_assert(MR * NV + NV + 1 <= VEC_REGS, "the register tile does not fit the vector registers");

#include "panel_lowbit.h"

#if defined(INFLIGHT_ISA_AVX512_BF16)
#define ISA_NAME "avx512_bf16"
#else
#define ISA_NAME VEC_ISA_NAME
#endif

int gemm_f32_panel(void) { return NR; }
const char* gemm_f32_isa(void) { return ISA_NAME; }

/* a * b + c: fused where the ISA has an FMA; the portable build multiplies and adds
 * (x86-64's baseline has no FMA instruction, and fmaf would be a libm call per lane) */
static inline vf mad(vf a, vf b, vf c) {
#if defined(INFLIGHT_ISA_AVX2) || VL == 16 || defined(INFLIGHT_ISA_NEON)
    return vf_fma(a, b, c);
#else
    return a * b + c;
#endif
}

/* vector loads and stores at any float address: vec.h's go through memcpy, which
 * GCC 12 lowers here to copies through the stack that keep the accumulators there */
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4), may_alias));
static inline vf ld(const float* p) { return *(const vfu*)p; }
static inline void st(float* p, vf v) { *(vfu*)p = v; }

/* the register tile's loops, unrolled whatever their size: GCC 12 leaves the
 * larger ones rolled, and an array indexed by a loop variable lives on the stack
 * (a store per FMA, seen in the assembly) */
#define UNROLL _Pragma("GCC unroll 16")

/* one x value on every lane (a broadcast load) */
static inline vf bcast(const float* p) {
#if VL == 16
    return (vf)_mm512_set1_ps(*p);
#elif defined(INFLIGHT_ISA_AVX2)
    return (vf)_mm256_broadcast_ss(p);
#elif defined(INFLIGHT_ISA_NEON)
    return (vf)vld1q_dup_f32(p);
#else
    return vf_set1(*p);
#endif
}

/* a row's running argmax over the outputs seen so far; allow: the row's grammar
 * bitmask (bit c % 32 of word c / 32 set: column c may win), NULL = every column */
struct best {
    float val;
    int64_t idx;
    const int32_t* allow;
};

static inline int allowed(const int32_t* allow, int64_t c) {
    return !allow || (((uint32_t)allow[c >> 5] >> (c & 31)) & 1u);
}

enum init { ZERO, BIAS, LOAD };
enum fin { STORE, SILU, ARGMAX };

/* the first n columns of R rows of src (ld apart) into the tile t (rows NR apart),
 * zeros after them */
static void tile_in(float* t, int R, const float* src, int64_t ld, int64_t n) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NR; j++) t[r * NR + j] = j < n ? src[r * ld + j] : 0.f;
}

static void tile_out(const float* t, int R, float* dst, int64_t ld, int64_t n) {
    for (int r = 0; r < R; r++) memcpy(dst + r * ld, t + r * NR, sizeof(float) * (size_t)n);
}

/* each row's running argmax over the tile's first n columns (panel column col0 on) */
static void tile_argmax(const float* t, int R, int64_t n, struct best* best, int64_t col0) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < n; j++)
            if (t[r * NR + j] > best[r].val && allowed(best[r].allow, col0 + j)) {
                best[r].val = t[r * NR + j];
                best[r].idx = col0 + j;
            }
}

/* R rows x NR columns over k in [0, kc): a = x + row * lda + k0, b = the panel's
 * chunk (kc x NR). The accumulators start from zero, the bias (NR values from
 * bias, ncols of them real) or p (a partial sum, rows ldp apart); at the end:
 *   STORE   c[r * ldc + j] for the ncols real columns
 *   SILU    c[r * ldc + j] = silu(g[r * NR + j]) * acc (all NR columns real)
 *   ARGMAX  best[r] takes the row's largest output (the first such column; col0 is
 *           the panel's first column and panels come in increasing order)
 * Every access to acc has a constant index once R is one (the loops unroll fully),
 * so the accumulators stay in registers; a panel's last, partial columns go through
 * the local tile t. */
static inline __attribute__((always_inline)) void micro(
        const int R, const float* a, int64_t lda, const float* b, int64_t kc, enum init init, enum fin fin,
        const float* bias, const float* p, int64_t ldp, float* c, int64_t ldc, int64_t ncols, const float* g,
        struct best* best, int64_t col0, const float* pf) {
    vf acc[MR][NV];
    float t[MR * NR] __attribute__((aligned(64)));
    const int full = ncols >= NR;
    if (init == LOAD) {
        if (full) {
            UNROLL for (int r = 0; r < R; r++)
                UNROLL for (int i = 0; i < NV; i++) acc[r][i] = ld(p + r * ldp + i * VL);
        } else {
            tile_in(t, R, p, ldp, ncols);
            UNROLL for (int r = 0; r < R; r++)
                UNROLL for (int i = 0; i < NV; i++) acc[r][i] = ld(t + r * NR + i * VL);
        }
    } else {
        if (init == BIAS) tile_in(t, 1, bias, 0, ncols);
        UNROLL for (int i = 0; i < NV; i++) {
            const vf v = init == BIAS ? ld(t + i * VL) : vf_zero();
            UNROLL for (int r = 0; r < R; r++) acc[r][i] = v;
        }
    }
    _Pragma("GCC unroll 4")  /* fewer loop and address updates per FMA */
    for (int64_t k = 0; k < kc; k++) {
        vf w[NV];
        UNROLL for (int i = 0; i < NV; i++) w[i] = ld(b + k * NR + i * VL);
        if (pf) {
            UNROLL for (int l = 0; l < NR * 4; l += 64) __builtin_prefetch(pf + k * NR + l / 4, 0, 2);
        }
        UNROLL for (int r = 0; r < R; r++) {
            const vf av = bcast(a + r * lda + k);
            UNROLL for (int i = 0; i < NV; i++) acc[r][i] = mad(av, w[i], acc[r][i]);
        }
    }
    if (fin == SILU) {
        UNROLL for (int r = 0; r < R; r++)
            UNROLL for (int i = 0; i < NV; i++) st(c + r * ldc + i * VL, vf_silu(ld(g + r * NR + i * VL)) * acc[r][i]);
    } else if (fin == STORE && full) {
        UNROLL for (int r = 0; r < R; r++)
            UNROLL for (int i = 0; i < NV; i++) st(c + r * ldc + i * VL, acc[r][i]);
    } else {
        UNROLL for (int r = 0; r < R; r++)
            UNROLL for (int i = 0; i < NV; i++) st(t + r * NR + i * VL, acc[r][i]);
        if (fin == STORE) tile_out(t, R, c, ldc, ncols);
        else tile_argmax(t, R, ncols, best, col0);
    }
}

/* micro with R a constant, so the accumulators stay in registers */
static void micro_rows(int R, const float* a, int64_t lda, const float* b, int64_t kc, enum init init, enum fin fin,
                       const float* bias, const float* p, int64_t ldp, float* c, int64_t ldc, int64_t ncols,
                       const float* g, struct best* best, int64_t col0, const float* pf) {
#define CASE(r) case r: micro(r, a, lda, b, kc, init, fin, bias, p, ldp, c, ldc, ncols, g, best, col0, pf); break;
    switch (R) {
        CASE(1) CASE(2) CASE(3) CASE(4)
#if MR > 4
        CASE(5) CASE(6)
#endif
#if MR > 6
        CASE(7) CASE(8)
#endif
#if MR > 8
        CASE(9) CASE(10) CASE(11) CASE(12)
#endif
    }
#undef CASE
}

/* rows [m0, m1) (at most MC_MAX) of one panel over the whole K, chunk by chunk.
 * Partial sums live in c (rows ldc apart) between chunks; the last chunk ends with
 * fin: STORE into c, SILU into fc (rows fldc apart, the gate tile g), ARGMAX into best. */
static void panel_block(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t lda, const float* panel,
                        int64_t kc_len, const float* bias, float* c, int64_t ldc, int64_t ncols, enum fin fin,
                        float* fc, int64_t fldc, const float* g, struct best* best, int64_t col0, const float* next) {
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kc_len) {  /* K = 0: one empty chunk, out = bias */
        const int64_t kc = K - k0 < kc_len ? K - k0 : kc_len;
        const enum init init = k0 > 0 ? LOAD : bias ? BIAS : ZERO;
        const int last = k0 + kc == K;
        for (int64_t m = m0; m < m1; m += MR) {
            const int R = m1 - m < MR ? (int)(m1 - m) : MR;
            const int64_t i = m - m0;
            const float* a = x + m * lda + k0;
            /* the second row group fetches the next panel's chunk into the caches, so
             * that the next panel's first row group does not wait on DRAM */
            const float* pf = next && m == m0 + MR ? next + k0 * NR : NULL;
            if (!last || fin == STORE)
                micro_rows(R, a, lda, panel + k0 * NR, kc, init, STORE, bias, c + i * ldc, ldc, c + i * ldc, ldc,
                           ncols, NULL, NULL, 0, pf);
            else if (fin == SILU)
                micro_rows(R, a, lda, panel + k0 * NR, kc, init, SILU, bias, c + i * ldc, ldc, fc + i * fldc, fldc,
                           ncols, g + i * NR, NULL, 0, pf);
            else
                micro_rows(R, a, lda, panel + k0 * NR, kc, init, ARGMAX, bias, c + i * ldc, ldc, NULL, 0, ncols,
                           NULL, best + i, col0, pf);
        }
    }
}

/* a low-bit weight (panel_lowbit.h): its panels and their width in bits */
struct lowbit {
    const uint8_t* data;
    int bits;
};

/* panel q of the weight: in place, or (lb.data != NULL) a low-bit panel expanded into buf */
static const float* panel_at(const float* packed, struct lowbit lb, int64_t q, int64_t K, float* buf) {
    if (!lb.data) return packed + q * K * NR;
    lowbit_dequant(lb.data + q * lowbit_panel_bytes(lb.bits, K), lb.bits, K, buf);
    return buf;
}

/* One thread's share: rows [m0, m1), panels [q0, q1) of packed, or of lb (low-bit
 * panels, panel_lowbit.h) when lb.data is not NULL.
 * silu_half > 0: gate panels [q0, q1), each paired with up panel q + silu_half,
 * written as silu(gate) * up (out has silu_half * NR columns).
 * best != NULL: each row's argmax goes to best[row] instead of out.
 * Returns -3 when the buffer for expanded low-bit panels cannot be had. */
static int gemm_range(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t lda, const float* packed,
                      struct lowbit lb, int64_t N, const float* bias, float* out, int64_t ldc, int64_t q0,
                      int64_t q1, int64_t silu_half, struct best* best) {
    float* qbuf = NULL;  /* the gate (or only) panel, then the up panel, expanded */
    const uint8_t* low = lb.data;
    if (low && !(qbuf = (float*)aligned_alloc(64, sizeof(float) * (size_t)(2 * K * NR)))) return -3;
    /* partial sums of a gate tile and of an up / logits tile, for the epilogues */
    float scratch[2 * MC_MAX * NR] __attribute__((aligned(64)));
    float* g = scratch;
    float* u = scratch + MC_MAX * NR;
    /* K in nk chunks of even length */
    const int64_t nk = K > KC_MAX ? (K + KC_MAX - 1) / KC_MAX : 1, kc_len = K > 0 ? (K + nk - 1) / nk : 1;
    int64_t mc_len = L2_X_BYTES / (4 * (K > 0 ? K : 1)) / MR * MR;
    mc_len = mc_len < MR ? MR : mc_len > MC_MAX ? MC_MAX : mc_len;
    for (int64_t mc = m0; mc < m1; mc += mc_len) {
        const int64_t mend = mc + mc_len < m1 ? mc + mc_len : m1;
        for (int64_t q = q0; q < q1; q++) {
            const int64_t col0 = q * NR, ncols = N - col0 < NR ? N - col0 : NR;
            /* fp32 panels: the panel after this one (the next in the range, or the first for
             * the next row block) is fetched while this one's second row group runs; low-bit
             * panels are asked for here, two ahead (the first two of a range on its first) */
            const int64_t qn = q + 1 < q1 ? q + 1 : mend < m1 ? q0 : -1;
            for (int64_t p = q == q0 ? q : q + 2; low && p <= q + 2 && p < q1; p++) {
                lowbit_prefetch(low + p * lowbit_panel_bytes(lb.bits, K), lb.bits, K);
                if (silu_half > 0) lowbit_prefetch(low + (p + silu_half) * lowbit_panel_bytes(lb.bits, K), lb.bits, K);
            }
            const float* panel = panel_at(packed, lb, q, K, qbuf);
            const float* next = low || qn < 0 ? NULL : packed + qn * K * NR;
            if (silu_half > 0) {
                const float* up = panel_at(packed, lb, q + silu_half, K, qbuf + K * NR);
                panel_block(x, mc, mend, K, lda, panel, kc_len, NULL, g, NR, NR, STORE, NULL, 0, NULL, NULL, 0,
                            low ? NULL : up);
                panel_block(x, mc, mend, K, lda, up, kc_len, NULL, u, NR, NR, SILU, out + mc * ldc + col0, ldc, g,
                            NULL, 0, next);
            } else if (best) {
                panel_block(x, mc, mend, K, lda, panel, kc_len, bias ? bias + col0 : NULL, u, NR, ncols, ARGMAX,
                            NULL, 0, NULL, best + mc, col0, next);
            } else {
                panel_block(x, mc, mend, K, lda, panel, kc_len, bias ? bias + col0 : NULL, out + mc * ldc + col0, ldc,
                            ncols, STORE, NULL, 0, NULL, NULL, 0, next);
            }
        }
    }
    free(qbuf);
    return 0;
}

/* The thread grid: tn groups over the panels times tm over the rows (tm * tn = nt).
 * Panels first (each group streams its own weight); rows as well only when each
 * thread would get fewer than 4 panels and there are rows enough to share. */
static void split(int64_t M, int64_t panels, int nt, int* tm, int* tn) {
    int best_tn = nt;
    if (panels < 4 * (int64_t)nt && M > MR)
        for (best_tn = nt; best_tn > 1; best_tn--)
            if (nt % best_tn == 0 && panels >= 4 * (int64_t)best_tn) break;
    if ((M + MR - 1) / MR < nt / best_tn) best_tn = nt;  /* too few row groups: the panels it is */
    *tn = best_tn;
    *tm = nt / best_tn;
}

/* thread t's rows and panels */
static void share(int t, int tm, int tn, int64_t M, int64_t panels, int64_t* m0, int64_t* m1, int64_t* q0,
                  int64_t* q1) {
    const int ti = t / tn, tj = t % tn;
    const int64_t groups = (M + MR - 1) / MR;  /* whole register blocks per thread */
    *m0 = groups * ti / tm * MR;
    *m1 = groups * (ti + 1) / tm * MR;
    if (*m1 > M) *m1 = M;
    *q0 = panels * tj / tn;
    *q1 = panels * (tj + 1) / tn;
}

/* out = x . W^T (+ bias) over the panels in packed, or in lb when lb.data is not NULL */
static int gemm_panels(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, struct lowbit lb,
                       int64_t N, const float* bias, float* out, int64_t ldc) {
    if (M <= 0 || N <= 0) return 0;
    const int64_t panels = (N + NR - 1) / NR;
    int rc = 0;
    #pragma omp parallel
    {
        int tm, tn;  /* from the team's real size: inside another parallel region it is 1 */
        int64_t m0, m1, q0, q1;
        split(M, panels, omp_get_num_threads(), &tm, &tn);
        share(omp_get_thread_num(), tm, tn, M, panels, &m0, &m1, &q0, &q1);
        if (m0 < m1 && q0 < q1 && gemm_range(x, m0, m1, K, lda, packed, lb, N, bias, out, ldc, q0, q1, 0, NULL))
            rc = -3;  /* NOTE: a benign race: every thread that fails writes the same value */
    }
    return rc;
}

/* silu(gate) * up over the panels in packed, or in lb when lb.data is not NULL */
static int silu_panels(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, struct lowbit lb,
                       int64_t N, float* out, int64_t ldc) {
    if (N % (2 * NR)) return -2;
    if (M <= 0 || N <= 0) return 0;
    const int64_t half = N / 2 / NR;
    int rc = 0;
    #pragma omp parallel
    {
        int tm, tn;
        int64_t m0, m1, q0, q1;
        split(M, half, omp_get_num_threads(), &tm, &tn);
        share(omp_get_thread_num(), tm, tn, M, half, &m0, &m1, &q0, &q1);
        if (m0 < m1 && q0 < q1 && gemm_range(x, m0, m1, K, lda, packed, lb, N / 2, NULL, out, ldc, q0, q1, half, NULL))
            rc = -3;
    }
    return rc;
}

/* tokens[m] = argmax over the columns of (x . W^T)[m] (no bias), the first column on
 * ties, as torch.argmax of the fp32 outputs gives it, without writing them out.
 * bitmask (NULL: none) holds grammar masks of `words` int32 each: row m considers only
 * the columns set in mask row mask_rows[m] (every column where that is negative), as
 * argmax of the logits with the disallowed ones at -inf gives it; a row whose allowed
 * outputs are all -inf (or that allows none) gets 0, as that argmax does. */
static int argmax_panels(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, struct lowbit lb,
                         int64_t N, const int32_t* bitmask, int64_t words, const int64_t* mask_rows, int64_t* tokens) {
    if (M <= 0) return 0;
    if (N <= 0) return -2;
    if (bitmask && words * 32 < N) return -4;
    const int64_t panels = (N + NR - 1) / NR;
    const int nt = omp_get_max_threads();  /* at least the team's size */
    struct best* all = (struct best*)malloc(sizeof(struct best) * (size_t)M * (size_t)nt);
    if (!all) return -3;
    for (int64_t i = 0; i < M * nt; i++) {
        const int64_t r = bitmask ? mask_rows[i % M] : -1;
        all[i] = (struct best){-INFINITY, -1, r >= 0 ? bitmask + r * words : NULL};
    }
    int tn = 1, rc = 0;
    #pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        int tm, tn_t;
        int64_t m0, m1, q0, q1;
        split(M, panels, omp_get_num_threads(), &tm, &tn_t);
        if (t == 0) tn = tn_t;
        share(t, tm, tn_t, M, panels, &m0, &m1, &q0, &q1);
        if (m0 < m1 && q0 < q1 &&
            gemm_range(x, m0, m1, K, lda, packed, lb, N, NULL, NULL, 0, q0, q1, 0, all + (int64_t)(t % tn_t) * M))
            rc = -3;
    }
    /* the panel groups hold increasing column ranges: a later one wins only when strictly greater */
    for (int64_t m = 0; m < M; m++) {
        struct best b = all[m];
        for (int j = 1; j < tn; j++)
            if (all[(int64_t)j * M + m].val > b.val) b = all[(int64_t)j * M + m];
        tokens[m] = b.idx < 0 ? 0 : b.idx;
    }
    free(all);
    return rc;
}

static const struct lowbit FP32 = {NULL, 0};

/* out = x . W^T (+ bias); x rows lda apart, out rows ldc apart. */
int gemm_f32(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N, const float* bias,
             float* out, int64_t ldc) {
    return gemm_panels(x, M, K, lda, packed, FP32, N, bias, out, ldc);
}

/* out[M, N/2] = silu(gate) * up for the gate_up projection, [gate | up] = x . W^T
 * (no bias), without writing gate_up out. N/2 must be a multiple of the panel (else
 * -2: the caller runs gemm_f32 and the product itself). */
int gemm_f32_silu(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N, float* out,
                  int64_t ldc) {
    return silu_panels(x, M, K, lda, packed, FP32, N, out, ldc);
}

int gemm_f32_argmax_masked(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                           const int32_t* bitmask, int64_t words, const int64_t* mask_rows, int64_t* tokens) {
    return argmax_panels(x, M, K, lda, packed, FP32, N, bitmask, words, mask_rows, tokens);
}

int gemm_f32_argmax(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                    int64_t* tokens) {
    return argmax_panels(x, M, K, lda, packed, FP32, N, NULL, 0, NULL, tokens);
}

/* The four entry points over low-bit panels (panel_lowbit.h; K a multiple of 32, else
 * -2): gemm_f32_q4*, gemm_f32_q8*, the same outputs, bit for bit, as over the fp32
 * panels they expand to. */
#define LOWBIT_ENTRY_POINTS(B)                                                                                       \
    int gemm_f32_q##B(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,            \
                      const float* bias, float* out, int64_t ldc) {                                                  \
        return K % LB_K ? -2 : gemm_panels(x, M, K, lda, NULL, (struct lowbit){qp, B}, N, bias, out, ldc);           \
    }                                                                                                                \
    int gemm_f32_q##B##_silu(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,     \
                             float* out, int64_t ldc) {                                                              \
        return K % LB_K ? -2 : silu_panels(x, M, K, lda, NULL, (struct lowbit){qp, B}, N, out, ldc);                 \
    }                                                                                                                \
    int gemm_f32_q##B##_argmax_masked(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp,        \
                                      int64_t N, const int32_t* bitmask, int64_t words, const int64_t* mask_rows,    \
                                      int64_t* tokens) {                                                             \
        return K % LB_K ? -2                                                                                         \
                        : argmax_panels(x, M, K, lda, NULL, (struct lowbit){qp, B}, N, bitmask, words, mask_rows,    \
                                        tokens);                                                                     \
    }                                                                                                                \
    int gemm_f32_q##B##_argmax(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,   \
                               int64_t* tokens) {                                                                    \
        return gemm_f32_q##B##_argmax_masked(x, M, K, lda, qp, N, NULL, 0, NULL, tokens);                            \
    }

LOWBIT_ENTRY_POINTS(4)
LOWBIT_ENTRY_POINTS(8)
