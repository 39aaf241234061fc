/*
 * bf16 linear layer for the CPU: out[M, N] = x[M, K] . W[N, K]^T (+ bias), float32
 * accumulation, rounded to bf16 once at the end (as oneDNN does).
 *
 * W is packed once at load time (gemm_bf16.py) into panels of 32 output columns:
 * packed[N/32][K/2][32][2], each K pair of 32 columns is one 64-byte vector, the
 * operand layout of the AVX-512-BF16 dot-product instruction. A decode step
 * streams every panel from DRAM exactly once whatever M is; a prefill step keeps
 * one panel in cache while every row block of x passes over it.
 *
 * Entry points: gemm_bf16 (the plain layer); gemm_bf16_silu (the gate_up projection
 * with silu(gate) * up in its epilogue); gemm_bf16_argmax (the logits projection
 * reduced to each row's argmax, for greedy sampling; _masked: over the tokens a
 * grammar allows). All three share the loops.
 *
 * Two implementations of the per-thread loops (gemm_range) from the one file: the
 * bf16 dot product at the avx512_bf16 level, and at every other level (avx512, avx2,
 * neon, scalar) bf16 widened to fp32 in registers with vec.h and fp32 FMAs.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "argmax_best.h"
#include "bf16_simd.h"

#define PANEL 32  /* output columns per packed panel */
#define MR 6      /* rows per register block: 6 x 4 accumulators + 4 weights + 1 broadcast < 32 zmm */
#define MR2 12    /* rows per register block over one panel: 12 x 2 accumulators */
#define MC 96     /* rows per L2 block of x */

int gemm_bf16_panel(void) { return PANEL; }

enum mode { PLAIN, SILU, ARGMAX };

#if defined(INFLIGHT_ISA_AVX512_BF16)

int gemm_bf16_supported(void) { return 1; }

/* x pair (x[k], x[k+1]) as one 32-bit lane; a lone last k of an odd K pairs with 0,
 * never with whatever follows the row. */
static inline __m512bh pair_at(const uint16_t* row, int64_t k, int64_t K) {
    int32_t v;
    if (k + 1 < K) memcpy(&v, row + k, sizeof v);
    else v = row[k];
    return (__m512bh)_mm512_set1_epi32(v);
}

/* R rows x (16 * NV) columns of out over the whole K, from the (one or two) panels
 * b0/b1; float32 accumulators start from the bias and are rounded to bf16 once.
 * SILU: b0 is a gate panel and b1 the matching up panel; out gets the 32 columns
 * bf16(silu(gate)) * up, rounded where silu_mul_bf16 (fused_ops.c) rounds.
 * ARGMAX: nothing is stored; best[r] takes the row's largest bf16-rounded output
 * (the first such column: columns come in increasing order). Each K pair
 * prefetches lpi cache lines from pf (and as many from pf2). */
static inline __attribute__((always_inline)) void micro(
        const int R, const int NV, const int MODE, struct best* best, const uint16_t* x, int64_t lda, int64_t K,
        const uint16_t* b0, const uint16_t* b1, const char* pf, const char* pf2, int lpi, const uint16_t* bias,
        int64_t n0, int64_t N, uint16_t* out, int64_t ldc) {
    const int64_t pairs = (K + 1) / 2;
    __m512 acc[MR2][4];
    for (int i = 0; i < NV; i++) {
        const int64_t c = n0 + 16 * i;
        const __m512 init = bias && c < N ? load_bf16x16(bias + c, tail_mask(N - c)) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++) acc[r][i] = init;
    }
    const int64_t even = K / 2;  /* pairs whose two x values are both inside the row */
    for (int64_t p = 0; p < pairs; p++) {
        for (int l = 0; l < lpi; l++) {
            _mm_prefetch(pf + (p * lpi + l) * 64, _MM_HINT_T1);
            if (pf2) _mm_prefetch(pf2 + (p * lpi + l) * 64, _MM_HINT_T1);
        }
        __m512bh w[4];
        w[0] = (__m512bh)_mm512_loadu_si512(b0 + p * 2 * PANEL);
        w[1] = (__m512bh)_mm512_loadu_si512(b0 + p * 2 * PANEL + 32);
        if (NV == 4) {
            w[2] = (__m512bh)_mm512_loadu_si512(b1 + p * 2 * PANEL);
            w[3] = (__m512bh)_mm512_loadu_si512(b1 + p * 2 * PANEL + 32);
        }
        for (int r = 0; r < R; r++) {
            __m512bh a;
            if (p < even) {
                int32_t v;
                memcpy(&v, x + r * lda + 2 * p, sizeof v);
                a = (__m512bh)_mm512_set1_epi32(v);
            } else {
                a = pair_at(x + r * lda, 2 * p, K);
            }
            for (int i = 0; i < NV; i++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], a, w[i]);
        }
    }
    /* a panel's K-pair row is [32 columns][2]: vector 0 holds columns 0-15, vector 1 columns 16-31 */
    if (MODE == ARGMAX) {
        for (int r = 0; r < R; r++)
            for (int i = 0; i < NV; i++) {
                const int64_t c = n0 + 16 * i;
                if (c >= N) break;
                /* c is a multiple of 16: its 16 columns' bits are one half of a mask word */
                const __mmask16 ok = best[r].allow ? (__mmask16)((uint32_t)best[r].allow[c >> 5] >> (c & 31)) : 0xFFFF;
                const __m512 v = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), tail_mask(N - c) & ok,
                                                    round_bf16(acc[r][i]));
                const float mx = _mm512_reduce_max_ps(v);
                if (mx > best[r].val) {
                    best[r].val = mx;
                    best[r].idx = c + __builtin_ctz(_mm512_cmpeq_ps_mask(v, _mm512_set1_ps(mx)));
                }
            }
        return;
    }
    if (MODE == SILU) {
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 2; i++) {
                const __m512 g = round_bf16(acc[r][i]), u = round_bf16(acc[r][2 + i]);
                const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
                const __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
                store_bf16x16(out + r * ldc + n0 + 16 * i, _mm512_mul_ps(round_bf16(sg), u), 0xFFFF);
            }
        return;
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < NV; i++) {
            const int64_t c = n0 + 16 * i;
            if (c < N) store_bf16x16(out + r * ldc + c, acc[r][i], tail_mask(N - c));
        }
}

/* micro with R (<= MR, or <= MR2 over one panel), NV and MODE as constants, so the
 * accumulators stay in registers */
static void micro_rows(int R, int NV, int MODE, struct best* best, const uint16_t* x, int64_t lda, int64_t K,
                       const uint16_t* b0, const uint16_t* b1, const char* pf, const char* pf2, int lpi,
                       const uint16_t* bias, int64_t n0, int64_t N, uint16_t* out, int64_t ldc) {
#define CALL(r, nv, mode) micro(r, nv, mode, best, x, lda, K, b0, b1, pf, pf2, lpi, bias, n0, N, out, ldc)
#define CASE(r) case r: \
        if (MODE == SILU) CALL(r, 4, SILU); \
        else if (MODE == ARGMAX) { if (NV == 4) CALL(r, 4, ARGMAX); else CALL(r, 2, ARGMAX); } \
        else if (NV == 4) CALL(r, 4, PLAIN); \
        else CALL(r, 2, PLAIN); \
        break;
    switch (R) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) }
#undef CASE
#define CASE(r) case r: CALL(r, 2, PLAIN); break;
    switch (R) { CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12) }
#undef CASE
#undef CALL
}

/* One thread's share: panels [q0, q1) for every row. Per block of MC rows, each
 * pair of panels streams from DRAM once and stays in L2 while the row blocks pass
 * over it. The first pass waits on DRAM; the later ones prefetch the next pair,
 * spread evenly, so that its DRAM time hides under their arithmetic.
 * silu_half > 0: gate panels [q0, q1), each paired with up panel q + silu_half,
 * written as silu(gate) * up (out has silu_half * PANEL columns).
 * best != NULL: each row's argmax goes to best[row] instead of out. */
static void gemm_range(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed,
                       int64_t N, const uint16_t* bias, uint16_t* out, int64_t ldc, int64_t q0, int64_t q1,
                       int64_t silu_half, struct best* best) {
    const int64_t pairs = (K + 1) / 2, panel_elems = pairs * 2 * PANEL;
    const int silu = silu_half > 0;
    const int mode = silu ? SILU : best ? ARGMAX : PLAIN;
    for (int64_t mc = 0; mc < M; mc += MC) {
        const int64_t mend = mc + MC < M ? mc + MC : M;
        if (mode == PLAIN && mend - mc > MR && mend - mc <= MR2) {
            /* one pass over single panels: each weight byte is read once */
            for (int64_t q = q0; q < q1; q++) {
                const uint16_t* b0 = packed + q * panel_elems;
                micro_rows((int)(mend - mc), 2, PLAIN, NULL, x + mc * lda, lda, K, b0, b0, NULL, NULL, 0, bias,
                           q * PANEL, N, out + mc * ldc, ldc);
            }
            continue;
        }
        const int64_t passes = (mend - mc + MR - 1) / MR;
        /* cache lines of the next pair to prefetch per K pair: 4 lines a pair in all
         * (SILU: 2 from each of the next gate and up panels) */
        const int lines = silu ? 2 : 4;
        const int lpi = passes > 1 ? (int)((lines + passes - 2) / (passes - 1)) : 0;
        for (int64_t q = q0; q < q1; q += silu ? 1 : 2) {
            const int NV = silu || q + 1 < q1 ? 4 : 2;
            const uint16_t* b0 = packed + q * panel_elems;
            const uint16_t* b1 = silu ? b0 + silu_half * panel_elems : NV == 4 ? b0 + panel_elems : b0;
            const int64_t step = silu ? 1 : 2;
            const char* next = q + step < q1 ? (const char*)(b0 + step * panel_elems) : NULL;
            const char* next2 = silu && next ? (const char*)(b1 + panel_elems) : NULL;
            for (int64_t m = mc, j = 0; m < mend; m += MR, j++) {
                const int R = mend - m < MR ? (int)(mend - m) : MR;
                const int64_t first = (j - 1) * lpi * pairs;  /* first line this pass prefetches */
                const int on = next != NULL && j > 0 && first < lines * pairs;
                micro_rows(R, NV, mode, best ? best + m : NULL, x + m * lda, lda, K, b0, b1,
                           on ? next + first * 64 : NULL, on && next2 ? next2 + first * 64 : NULL, on ? lpi : 0,
                           bias, q * PANEL, N, best ? NULL : out + m * ldc, ldc);
            }
        }
    }
}

#else
/* ---- every level without the bf16 dot product (AVX-512F, AVX2, NEON, scalar) ----
 * The same packed panels and the same three entry points, written against vec.h:
 * a K pair of VL columns is VL 32-bit lanes, (x[k], x[k+1]) of each column; a shift
 * and a mask widen them to two fp32 vectors in registers. Accumulation in fp32 (FMA),
 * one rounding to bf16 at the end, as the dot-product path: the two agree to bf16
 * rounding of the fp32 sums (the summation order differs). x is widened once per
 * block of MC rows into a per-thread fp32 buffer. */
#include "vec.h"

int gemm_bf16_supported(void) { return 1; }

/* VL K pairs of the packed bf16 weight, one 32-bit lane each */
typedef int32_t vpair __attribute__((vector_size(VL * 4), aligned(2), may_alias));

#define SLAB 16            /* output columns per slab; a panel is two */
#define SV (SLAB / VL)     /* vectors per slab: 1 (AVX-512), 2 (AVX2), 4 (NEON, scalar) */
/* rows per register block: 2 * SV accumulators a row (two slabs), about half the registers */
#if VEC_REGS >= 32
#define PMR (SV == 1 ? 8 : SV == 2 ? 4 : 2)
#else
#define PMR (SV == 1 ? 6 : SV == 2 ? 2 : 1)
#endif
#define PMR_MAX 8

/* a * b + c: fused where the level has FMA; the portable build (no FMA in its
 * baseline) multiplies and adds rather than calling fmaf per lane */
#if defined(INFLIGHT_ISA_SCALAR)
#define PFMA(a, b, c) ((c) + (a) * (b))
#else
#define PFMA(a, b, c) vf_fma((a), (b), (c))
#endif

/* One row's outputs for columns n0 .. n0 + n (those below N) from their fp32 sums v:
 * PLAIN: rounded to bf16 into orow[n0 ..]; SILU: v the gate and u the up sums,
 * bf16(silu(bf16(gate))) * bf16(up) as silu_mul_bf16 (fused_ops.c) computes it at these
 * levels, bit for bit; ARGMAX: *best takes the largest bf16-rounded output (the first
 * on ties: columns come in increasing order). */
static inline __attribute__((always_inline)) void epilogue(const int MODE, const float* v, const float* u, int n,
                                                           int64_t n0, int64_t N, uint16_t* orow, struct best* best) {
    if (MODE == SILU) {
        for (int l = 0; l < n; l++) {
            const float g = bf16_to_f32(f32_to_bf16(v[l])), up = bf16_to_f32(f32_to_bf16(u[l]));
            orow[n0 + l] = f32_to_bf16(bf16_to_f32(f32_to_bf16(g / (1.f + expf(-g)))) * up);
        }
    } else if (MODE == ARGMAX) {
        for (int l = 0; l < n && n0 + l < N; l++) {
            const float b = bf16_to_f32(f32_to_bf16(v[l]));
            if (b > best->val && allowed(best->allow, n0 + l)) {
                best->val = b;
                best->idx = n0 + l;
            }
        }
    } else {
        for (int l = 0; l < n && n0 + l < N; l++) orow[n0 + l] = f32_to_bf16(v[l]);
    }
}

/* R rows (fp32, xf rows kp apart) x two slabs of SLAB columns over the whole K, slab
 * s0 starting at b0 and slab s1 at b1 (pointers into a panel's first K pair row, pairs
 * 2 * PANEL elements apart). PLAIN and ARGMAX: the slabs are columns n0 .. n0 + 31;
 * accumulators start from the bias. SILU: s0 is a gate slab and s1 the matching up
 * slab, out gets the SLAB columns bf16(silu(bf16(gate))) * bf16(up), computed as
 * silu_mul_bf16 (fused_ops.c) computes it at these levels, bit for bit. ARGMAX:
 * best[r] takes the row's largest bf16-rounded output, the first on ties. */
static inline __attribute__((always_inline)) void pmicro(
        const int R, const int MODE, struct best* best, const float* xf, int64_t kp, int64_t pairs,
        const uint16_t* b0, const uint16_t* b1, const uint16_t* bias, int64_t n0, int64_t N, uint16_t* out,
        int64_t ldc) {
    vf acc[PMR_MAX][2 * SV];
    for (int i = 0; i < 2 * SV; i++) {
        float init[VL];
        for (int l = 0; l < VL; l++) {
            const int64_t c = n0 + i * VL + l;
            init[l] = MODE != SILU && bias && c < N ? bf16_to_f32(bias[c]) : 0.f;
        }
        for (int r = 0; r < R; r++) acc[r][i] = vf_load(init);
    }
    const vi hi_mask = (vi){0} + (int32_t)0xFFFF0000;
    for (int64_t p = 0; p < pairs; p++) {
        if (R == 1) {  /* every vector widened first: more independent work per pair */
            vf we[2 * SV], wo[2 * SV];
            for (int i = 0; i < 2 * SV; i++) {
                const vi raw = *(const vpair*)((i < SV ? b0 + i * 2 * VL : b1 + (i - SV) * 2 * VL) + p * 2 * PANEL);
                we[i] = (vf)(raw << 16);
                wo[i] = (vf)(raw & hi_mask);
            }
            const vf xe = vf_set1(xf[2 * p]), xo = vf_set1(xf[2 * p + 1]);
            for (int i = 0; i < 2 * SV; i++) acc[0][i] = PFMA(xo, wo[i], PFMA(xe, we[i], acc[0][i]));
            continue;
        }
        /* one weight vector at a time, even half then odd half: the widened pair of
         * every vector at once did not fit the AVX2 registers beside the accumulators.
         * The same FMAs in the same order per accumulator in every branch (and in
         * wmicro): a row's result does not depend on the rows beside it. */
        vf xe[PMR_MAX], xo[PMR_MAX];
        for (int r = 0; r < R; r++) {
            xe[r] = vf_set1(xf[r * kp + 2 * p]);
            xo[r] = vf_set1(xf[r * kp + 2 * p + 1]);
        }
        for (int i = 0; i < 2 * SV; i++) {
            const vi raw = *(const vpair*)((i < SV ? b0 + i * 2 * VL : b1 + (i - SV) * 2 * VL) + p * 2 * PANEL);
            const vf we = (vf)(raw << 16), wo = (vf)(raw & hi_mask);
            for (int r = 0; r < R; r++) acc[r][i] = PFMA(xe[r], we, acc[r][i]);
            for (int r = 0; r < R; r++) acc[r][i] = PFMA(xo[r], wo, acc[r][i]);
        }
    }
    for (int r = 0; r < R; r++) {
        float v[2 * SLAB];
        for (int i = 0; i < 2 * SV; i++) vf_store(v + i * VL, acc[r][i]);
        if (MODE == SILU) epilogue(SILU, v, v + SLAB, SLAB, n0, N, out + r * ldc, NULL);
        else epilogue(MODE, v, NULL, 2 * SLAB, n0, N, out ? out + r * ldc : NULL, best ? best + r : NULL);
    }
}

/* pmicro with R (<= PMR) and MODE as constants, so the accumulators stay in registers */
static void pmicro_rows(int R, int MODE, struct best* best, const float* xf, int64_t kp, int64_t pairs,
                        const uint16_t* b0, const uint16_t* b1, const uint16_t* bias, int64_t n0, int64_t N,
                        uint16_t* out, int64_t ldc) {
#define CALL(r, mode) pmicro(r, mode, best, xf, kp, pairs, b0, b1, bias, n0, N, out, ldc)
#define CASE(r) case r: \
        if (MODE == SILU) CALL(r, SILU); else if (MODE == ARGMAX) CALL(r, ARGMAX); else CALL(r, PLAIN); \
        break;
    switch (R) {
    CASE(1)
#if PMR >= 2
    CASE(2)
#endif
#if PMR >= 3
    CASE(3) CASE(4)
#endif
#if PMR >= 5
    CASE(5) CASE(6)
#endif
#if PMR >= 7
    CASE(7) CASE(8)
#endif
    }
#undef CASE
#undef CALL
}

/* Row blocks of at least WIDE_ROWS rows widen each panel once into a per-thread fp32
 * copy, [kp][PANEL] (k-major), so that the inner loop is a plain fp32 register tile
 * of WMR rows x 2 vectors (x broadcast per k); fewer rows widen in the inner loop. */
#define WIDE_ROWS 8
#define WMR (VEC_REGS >= 32 ? 12 : 6)
#define WT (2 * VL)  /* columns per register tile */

/* R rows x WT columns over kp values of k from the widened panel(s): wa (PLAIN,
 * ARGMAX; accumulators from the bias) or gate wa and up wb (SILU, R <= WMR / 2);
 * columns n0 .. n0 + WT of the output. */
static inline __attribute__((always_inline)) void wmicro(
        const int R, const int MODE, struct best* best, const float* xf, int64_t kp, const float* wa,
        const float* wb, const uint16_t* bias, int64_t n0, int64_t N, uint16_t* out, int64_t ldc) {
    const int SI = MODE == SILU;
    /* NOTE: one array per column vector, and no array of weights: a [rows][4] array
     * (or a conditionally filled one) went through the stack every k (GCC 12) */
    vf a0[WMR], a1[WMR], a2[WMR], a3[WMR];
    {
        float i0[VL], i1[VL];
        for (int l = 0; l < VL; l++) {
            i0[l] = !SI && bias && n0 + l < N ? bf16_to_f32(bias[n0 + l]) : 0.f;
            i1[l] = !SI && bias && n0 + VL + l < N ? bf16_to_f32(bias[n0 + VL + l]) : 0.f;
        }
        for (int r = 0; r < R; r++) {
            a0[r] = vf_load(i0);
            a1[r] = vf_load(i1);
            a2[r] = a3[r] = vf_zero();
        }
    }
    for (int64_t k = 0; k < kp; k++) {
        const vf w0 = vf_load(wa + k * PANEL), w1 = vf_load(wa + k * PANEL + VL);
        const vf w2 = SI ? vf_load(wb + k * PANEL) : vf_zero(), w3 = SI ? vf_load(wb + k * PANEL + VL) : vf_zero();
        for (int r = 0; r < R; r++) {
            const vf xb = vf_set1(xf[r * kp + k]);
            a0[r] = PFMA(xb, w0, a0[r]);
            a1[r] = PFMA(xb, w1, a1[r]);
            if (SI) {
                a2[r] = PFMA(xb, w2, a2[r]);
                a3[r] = PFMA(xb, w3, a3[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        float v[4 * VL];
        vf_store(v, a0[r]);
        vf_store(v + VL, a1[r]);
        vf_store(v + 2 * VL, a2[r]);
        vf_store(v + 3 * VL, a3[r]);
        if (SI) epilogue(SILU, v, v + WT, WT, n0, N, out + r * ldc, NULL);
        else epilogue(MODE, v, NULL, WT, n0, N, out ? out + r * ldc : NULL, best ? best + r : NULL);
    }
}

static void wmicro_rows(int R, int MODE, struct best* best, const float* xf, int64_t kp, const float* wa,
                        const float* wb, const uint16_t* bias, int64_t n0, int64_t N, uint16_t* out, int64_t ldc) {
#define CALL(r, mode) wmicro(r, mode, best, xf, kp, wa, wb, bias, n0, N, out, ldc)
#define CASE(r) case r: \
        if (MODE == SILU && r <= WMR / 2) CALL(r, SILU); else if (MODE == ARGMAX) CALL(r, ARGMAX); \
        else CALL(r, PLAIN); \
        break;
    switch (R) {
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#if WMR > 6
    CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#endif
    }
#undef CASE
#undef CALL
}

/* panel (pairs K pairs of PANEL columns) -> wf [2 * pairs][PANEL] fp32 */
static void widen_panel(const uint16_t* panel, int64_t pairs, float* wf) {
    const vi hi_mask = (vi){0} + (int32_t)0xFFFF0000;
    for (int64_t p = 0; p < pairs; p++)
        for (int i = 0; i < PANEL / VL; i++) {
            const vi raw = *(const vpair*)(panel + p * 2 * PANEL + i * 2 * VL);
            vf_store(wf + 2 * p * PANEL + i * VL, (vf)(raw << 16));
            vf_store(wf + (2 * p + 1) * PANEL + i * VL, (vf)(raw & hi_mask));
        }
}

/* One thread's share: panels [q0, q1) for every row (silu_half > 0: gate panels, each
 * with up panel q + silu_half; best != NULL: argmax into best[row]). Per block of MC
 * rows, x is widened into xf, then each panel stays in cache while the row blocks
 * pass over it. */
static void gemm_range(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed,
                       int64_t N, const uint16_t* bias, uint16_t* out, int64_t ldc, int64_t q0, int64_t q1,
                       int64_t silu_half, struct best* best) {
    const int64_t pairs = (K + 1) / 2, kp = 2 * pairs, panel_elems = pairs * 2 * PANEL;
    const int mode = silu_half > 0 ? SILU : best ? ARGMAX : PLAIN;
    const int64_t rows = M < MC ? M : MC;
    float* xf = (float*)malloc(sizeof(float) * (size_t)(rows * kp));
    float* wf = NULL;  /* widened panels, for row blocks of WIDE_ROWS or more */
    for (int64_t mc = 0; mc < M; mc += MC) {
        const int64_t mend = mc + MC < M ? mc + MC : M;
        for (int64_t m = mc; m < mend; m++) {
            float* dst = xf + (m - mc) * kp;
            for (int64_t k = 0; k < K; k++) dst[k] = bf16_to_f32(x[m * lda + k]);
            if (kp > K) dst[K] = 0.f;  /* odd K: the last pair's second value, never what follows the row */
        }
        if (mend - mc >= WIDE_ROWS) {
            if (!wf) wf = (float*)malloc(sizeof(float) * (size_t)(2 * kp * PANEL));
            for (int64_t q = q0; q < q1; q++) {
                widen_panel(packed + q * panel_elems, pairs, wf);
                if (mode == SILU) widen_panel(packed + (q + silu_half) * panel_elems, pairs, wf + kp * PANEL);
                for (int c = 0; c < PANEL; c += WT) {
                    const int rb = mode == SILU ? WMR / 2 : WMR;
                    for (int64_t m = mc; m < mend; m += rb) {
                        const int R = mend - m < rb ? (int)(mend - m) : rb;
                        wmicro_rows(R, mode, best ? best + m : NULL, xf + (m - mc) * kp, kp, wf + c,
                                    wf + kp * PANEL + c, bias, q * PANEL + c, N, best ? NULL : out + m * ldc, ldc);
                    }
                }
            }
            continue;
        }
        for (int64_t q = q0; q < q1; q++)
            for (int s = 0; s < (mode == SILU ? 2 : 1); s++) {
                const uint16_t* b0 = packed + q * panel_elems + s * 2 * SLAB;
                /* PLAIN, ARGMAX: the panel's two slabs; SILU: slab s of the gate and of the up panel */
                const uint16_t* b1 = mode == SILU ? b0 + silu_half * panel_elems : b0 + 2 * SLAB;
                const int64_t n0 = q * PANEL + s * SLAB;
                for (int64_t m = mc; m < mend; m += PMR) {
                    const int R = mend - m < PMR ? (int)(mend - m) : PMR;
                    pmicro_rows(R, mode, best ? best + m : NULL, xf + (m - mc) * kp, kp, pairs, b0, b1, bias, n0,
                                N, best ? NULL : out + m * ldc, ldc);
                }
            }
    }
    free(xf);
    free(wf);
}
#endif

/* out = x . W^T (+ bias); x rows lda apart, out rows ldc apart. Threads split the
 * panels evenly, so each reads its own contiguous stretch of the packed weight. */
int gemm_bf16(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
              const uint16_t* bias, uint16_t* out, int64_t ldc) {
    if (M <= 0 || N <= 0) return 0;
    const int64_t panels = (N + PANEL - 1) / PANEL;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = panels * t / nt, q1 = panels * (t + 1) / nt;
        if (q0 < q1) gemm_range(x, M, K, lda, packed, N, bias, out, ldc, q0, q1, 0, NULL);
    }
    return 0;
}

/* out[M, N/2] = bf16(silu(gate)) * up for the gate_up projection, [gate | up] = x . W^T
 * (no bias), as gemm_bf16 then silu_mul_bf16 give it, bit for bit, without writing
 * gate_up out. N/2 must be a multiple of the panel (else -2: use the two calls). */
int gemm_bf16_silu(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
                   uint16_t* out, int64_t ldc) {
    if (N % (2 * PANEL)) return -2;
    if (M <= 0) return 0;
    const int64_t half = N / 2 / PANEL;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = half * t / nt, q1 = half * (t + 1) / nt;
        if (q0 < q1) gemm_range(x, M, K, lda, packed, N / 2, NULL, out, ldc, q0, q1, half, NULL);
    }
    return 0;
}

/* tokens[m] = argmax over columns of bf16(x . W^T)[m] (no bias), the first column on
 * ties: what rounding the logits to bf16 and taking their argmax gives, without
 * writing the logits out (greedy sampling). bitmask (NULL: none) holds grammar masks of
 * `words` int32 each: row m considers only the columns set in mask row mask_rows[m]
 * (every column where that is negative), as argmax of the logits with the disallowed
 * ones at -inf gives it; a row whose allowed outputs are all -inf (or that allows
 * none) gets 0, as that argmax does. */
int gemm_bf16_argmax_masked(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
                            const int32_t* bitmask, int64_t words, const int64_t* mask_rows, int64_t* tokens) {
    if (M <= 0) return 0;
    if (bitmask && words * 32 < N) return -4;
    const int64_t panels = (N + PANEL - 1) / PANEL;
    const int nt = omp_get_max_threads();
    struct best* all = best_alloc(M, nt, bitmask, words, mask_rows);
    if (!all) return -3;
    #pragma omp parallel num_threads(nt)
    {
        const int n = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = panels * t / n, q1 = panels * (t + 1) / n;
        if (q0 < q1) gemm_range(x, M, K, lda, packed, N, NULL, NULL, 0, q0, q1, 0, all + (int64_t)t * M);
    }
    best_reduce(all, M, nt, tokens);  /* threads hold increasing column ranges */
    return 0;
}

int gemm_bf16_argmax(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
                     int64_t* tokens) {
    return gemm_bf16_argmax_masked(x, M, K, lda, packed, N, NULL, 0, NULL, tokens);
}
