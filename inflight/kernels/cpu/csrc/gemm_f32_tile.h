/*
 * The fp32 GEMM's register tile (gemm_f32.c): the MR x NR block sizes per ISA level,
 * the microkernel that keeps an R x NR block of out in registers over a stretch of K
 * (with its STORE, SILU and ARGMAX epilogues), and panel_block, which runs a block of
 * rows over one panel chunk by chunk. Included by gemm_f32.c only.
 */
#ifndef INFLIGHT_GEMM_F32_TILE_H
#define INFLIGHT_GEMM_F32_TILE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "argmax_best.h"
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
    for (int r = 0; r < R; r++) {
        /* a row of the tile none of whose NR outputs beats the running best (none larger, no
         * NaN) is passed over whole: once a row's best is large, nearly every tile is */
        int pass = 1;
        UNROLL for (int i = 0; i < NV; i++) pass &= vf_all_le(ld(t + r * NR + i * VL), vf_set1(best[r].val));
        if (pass) continue;
        for (int j = 0; j < n; j++)
            if (best_beats(t[r * NR + j], best[r].val) && allowed(best[r].allow, col0 + j)) {
                best[r].val = t[r * NR + j];
                best[r].idx = col0 + j;
            }
    }
}

/* The end of a register block of R rows (micro's and lowbit_micro's): acc into c (STORE, the
 * ncols real columns; SILU, silu(g[r * NR + j]) * acc, all NR columns real) or into best
 * (ARGMAX); a partial panel's columns go through the scratch tile t. NOTE: always inlined with
 * R a constant, so acc stays in registers as in the callers' loops. */
static inline __attribute__((always_inline)) void micro_end(const int R, vf acc[MR][NV], float* t, enum fin fin,
                                                            float* c, int64_t ldc, int64_t ncols, const float* g,
                                                            struct best* best, int64_t col0) {
    if (fin == SILU) {
        UNROLL for (int r = 0; r < R; r++)
            UNROLL for (int i = 0; i < NV; i++) st(c + r * ldc + i * VL, vf_silu(ld(g + r * NR + i * VL)) * acc[r][i]);
    } else if (fin == STORE && ncols >= NR) {
        UNROLL for (int r = 0; r < R; r++)
            UNROLL for (int i = 0; i < NV; i++) st(c + r * ldc + i * VL, acc[r][i]);
    } else {
        UNROLL for (int r = 0; r < R; r++)
            UNROLL for (int i = 0; i < NV; i++) st(t + r * NR + i * VL, acc[r][i]);
        if (fin == STORE) tile_out(t, R, c, ldc, ncols);
        else tile_argmax(t, R, ncols, best, col0);
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
    micro_end(R, acc, t, fin, c, ldc, ncols, g, best, col0);
}

/* X(r) for every row count of a register block, 1..MR: a switch over them calls a kernel
 * with R a constant in each case, so its accumulators stay in registers */
#if MR > 8
#define EACH_ROW_COUNT(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12)
#elif MR > 6
#define EACH_ROW_COUNT(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)
#elif MR > 4
#define EACH_ROW_COUNT(X) X(1) X(2) X(3) X(4) X(5) X(6)
#else
#define EACH_ROW_COUNT(X) X(1) X(2) X(3) X(4)
#endif

/* micro with R a constant, so the accumulators stay in registers */
static void micro_rows(int R, const float* a, int64_t lda, const float* b, int64_t kc, enum init init, enum fin fin,
                       const float* bias, const float* p, int64_t ldp, float* c, int64_t ldc, int64_t ncols,
                       const float* g, struct best* best, int64_t col0, const float* pf) {
#define CASE(r) case r: micro(r, a, lda, b, kc, init, fin, bias, p, ldp, c, ldc, ncols, g, best, col0, pf); break;
    switch (R) { EACH_ROW_COUNT(CASE) }
#undef CASE
}

/* rows [m0, m1) (at most MC_MAX) of one panel over the whole K, chunk by chunk.
 * Partial sums live in c (rows ldc apart) between chunks; the last chunk ends with
 * fin: STORE into c, SILU into fc (rows fldc apart, the gate tile g), ARGMAX into best. */
static void panel_block(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t lda, const float* panel,
                        int64_t kc_len, const float* bias, float* c, int64_t ldc, int64_t ncols, enum fin fin,
                        float* fc, int64_t fldc, const float* g, struct best* best, int64_t col0, const float* next) {
    /* NOTE: rows in groups of even size, not MR-row groups and a remainder: a group of few rows
     * has too few accumulators to hide the FMA latency and takes as long as a larger one (8 rows
     * as 4 + 4, not 6 + 2). A row's products and their order do not depend on its group. */
    const int64_t rows = m1 - m0, groups = (rows + MR - 1) / MR;
    const int64_t base = groups ? rows / groups : 0, extra = groups ? rows % groups : 0;
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kc_len) {  /* K = 0: one empty chunk, out = bias */
        const int64_t kc = K - k0 < kc_len ? K - k0 : kc_len;
        const enum init init = k0 > 0 ? LOAD : bias ? BIAS : ZERO;
        const int last = k0 + kc == K;
        for (int64_t gi = 0; gi < groups; gi++) {
            const int R = (int)(base + (gi < extra));  /* the first `extra` groups take a row more */
            const int64_t i = gi * base + (gi < extra ? gi : extra), m = m0 + i;
            const float* a = x + m * lda + k0;
            /* the second row group fetches the next panel's chunk into the caches, so
             * that the next panel's first row group does not wait on DRAM */
            const float* pf = next && gi == 1 ? next + k0 * NR : NULL;
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

#endif
