/*
 * The bf16 GEMM's per-thread loops at every level without the bf16 dot product
 * (AVX-512F, AVX2, NEON, scalar), for gemm_bf16.c: bf16 weights widened to fp32 in
 * registers, fp32 FMAs. Included by gemm_bf16.c only, after PANEL, MC and enum mode.
 *
 * The same packed panels and the same three entry points, written against vec.h:
 * a K pair of VL columns is VL 32-bit lanes, (x[k], x[k+1]) of each column; a shift
 * and a mask widen them to two fp32 vectors in registers. Accumulation in fp32 (FMA),
 * one rounding to bf16 at the end, as the dot-product path: the two agree to bf16
 * rounding of the fp32 sums (the summation order differs). x is widened once per
 * block of MC rows into a per-thread fp32 buffer. */
#ifndef INFLIGHT_GEMM_BF16_WIDEN_H
#define INFLIGHT_GEMM_BF16_WIDEN_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "argmax_best.h"
#include "bf16_simd.h"
#include "vec.h"

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
            if (best_beats(b, best->val) && allowed(best->allow, n0 + l)) {
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
