/*
 * The fp32 GEMM over low-bit panels (panel_lowbit.h) for a block of at most MR rows:
 * each weight vector is expanded in registers just before its FMAs, instead of the
 * whole panel being expanded into an fp32 buffer and read back by the microkernel.
 * With one register block of rows nothing is reused from such a buffer, and its
 * store and reload were most of the expansion's cost. Included by gemm_f32.c only,
 * after gemm_f32_tile.h and panel_lowbit.h.
 *
 * NOTE: the products and their order are micro's over the expanded panel (k ascending,
 * one FMA a row and column into an accumulator that starts at zero or the bias; a
 * partial sum stored between K chunks and loaded again is the same float), and each
 * weight is the same d * q + m (see panel_lowbit.h on fusing it), so the outputs are
 * those of the fp32 panels bit for bit.
 */
#ifndef INFLIGHT_LOWBIT_MICRO_H
#define INFLIGHT_LOWBIT_MICRO_H

/* NOTE: only where mad is one fused multiply-add. The portable level's mad is a multiply
 * and an add, which -fassociative-math lets GCC regroup one way in micro and another here;
 * that level keeps expanding into a buffer for micro. */
#if defined(INFLIGHT_ISA_AVX2) || VL == 16 || defined(INFLIGHT_ISA_NEON)
#define LOWBIT_IN_REGISTERS 1
#else
#define LOWBIT_IN_REGISTERS 0
#endif

/* acc[r][i] += x[r][k] * w[i] for the R rows, k's x values at a (rows lda apart) */
#define LB_FMA_ROWS(acc, a, w)                                              \
    UNROLL for (int r = 0; r < R; r++) {                                    \
        const vf av = bcast((a) + r * lda);                                 \
        UNROLL for (int i = 0; i < NV; i++) (acc)[r][i] = mad(av, (w)[i], (acc)[r][i]); \
    }

/* Panels a block of R rows takes at once: a panel gives it R x NV accumulators, one FMA
 * chain each, and a decode step of one row then has two on AVX2, too few to keep the FMA
 * units busy between a product and the next into the same chain; P panels give P times as
 * many, up to twelve (AVX2 has sixteen vector registers). */
#define LB_MAX_PANELS 6
#define LB_PANELS(R) ((R) * NV > 4 ? 1 : 12 / ((R) * NV) > LB_MAX_PANELS ? LB_MAX_PANELS : 12 / ((R) * NV))

/* R rows x NR columns of one low-bit panel over all of K (a multiple of LB_K), from
 * zero or the bias (NR values, ncols of them real); the end is micro's (micro_end). */
static inline __attribute__((always_inline)) void lowbit_micro(
        const int R, const float* a, int64_t lda, const uint8_t* panel, int bits, int64_t K, enum fin fin,
        const float* bias, float* c, int64_t ldc, int64_t ncols, const float* g, struct best* best, int64_t col0) {
    vf acc[MR][NV];
    float t[MR * NR] __attribute__((aligned(64)));
    if (bias) tile_in(t, 1, bias, 0, ncols);
    UNROLL for (int i = 0; i < NV; i++) {
        const vf v = bias ? ld(t + i * VL) : vf_zero();
        UNROLL for (int r = 0; r < R; r++) acc[r][i] = v;
    }
    const int64_t bb = lowbit_block_bytes(bits);
    for (int64_t kb = 0; kb < K / LB_K; kb++) {
        const uint8_t* blk = panel + kb * bb;
        const float* xk = a + kb * LB_K;
        vf d[NV], m[NV], w0[NV], w1[NV];
        if (bits == 4) {
            UNROLL for (int i = 0; i < NV; i++) {
                d[i] = ld((const float*)blk + i * VL);
                m[i] = ld((const float*)blk + NR + i * VL);
            }
            const uint8_t* q = blk + 8 * NR;
            _Pragma("GCC unroll 2")
            for (int k = 0; k < LB_K; k += 2, q += NR) {
                UNROLL for (int i = 0; i < NV; i++) {
                    const vi b = vi_load_u8(q + i * VL);
                    w0[i] = d[i] * __builtin_convertvector(b & 15, vf) + m[i];
                    w1[i] = d[i] * __builtin_convertvector(b >> 4, vf) + m[i];
                }
                LB_FMA_ROWS(acc, xk + k, w0)
                LB_FMA_ROWS(acc, xk + k + 1, w1)
            }
        } else if (bits == 6) {
            const int8_t* q = (const int8_t*)(blk + 16 * NR);
            for (int h = 0; h < 2; h++) {
                UNROLL for (int i = 0; i < NV; i++) {
                    d[i] = ld((const float*)blk + h * NR + i * VL);
                    m[i] = ld((const float*)blk + (2 + h) * NR + i * VL);
                }
                _Pragma("GCC unroll 2")
                for (int k = h * LB_HALF; k < (h + 1) * LB_HALF; k++, q += NR) {
                    UNROLL for (int i = 0; i < NV; i++)
                        w0[i] = d[i] * __builtin_convertvector(vi_load_s8(q + i * VL), vf) + m[i];
                    LB_FMA_ROWS(acc, xk + k, w0)
                }
            }
        } else {
            UNROLL for (int i = 0; i < NV; i++) d[i] = ld((const float*)blk + i * VL);
            const int8_t* q = (const int8_t*)(blk + 4 * NR);
            _Pragma("GCC unroll 2")
            for (int k = 0; k < LB_K; k++, q += NR) {
                UNROLL for (int i = 0; i < NV; i++) w0[i] = d[i] * __builtin_convertvector(vi_load_s8(q + i * VL), vf);
                LB_FMA_ROWS(acc, xk + k, w0)
            }
        }
    }
    micro_end(R, acc, t, fin, c, ldc, ncols, g, best, col0);
}

/* lowbit_micro over P > 1 full panels of NR columns at once (panel p at panel + p * pb, its
 * columns from col0 + p * NR); each panel ends as micro's (micro_end) into c + p * cstep, with
 * gate tile g + p * MR * NR (SILU). Its block scales are read where they are used: in
 * registers they would take the accumulators' place. NOTE: a body of its own, not
 * lowbit_micro with P = 1: one body for both doubled the library's compile time. */
static inline __attribute__((always_inline)) void lowbit_micro_panels(
        const int R, const int P, const float* a, int64_t lda, const uint8_t* panel, int64_t pb, int bits, int64_t K,
        enum fin fin, const float* bias, float* c, int64_t ldc, int64_t cstep, const float* g, struct best* best,
        int64_t col0) {
    vf acc[LB_MAX_PANELS][MR][NV];
    float t[MR * NR] __attribute__((aligned(64)));
    UNROLL for (int p = 0; p < P; p++) {
        if (bias) tile_in(t, 1, bias + p * NR, 0, NR);
        UNROLL for (int i = 0; i < NV; i++) {
            const vf v = bias ? ld(t + i * VL) : vf_zero();
            UNROLL for (int r = 0; r < R; r++) acc[p][r][i] = v;
        }
    }
    const int64_t bb = lowbit_block_bytes(bits);
    for (int64_t kb = 0; kb < K / LB_K; kb++) {
        const float* xk = a + kb * LB_K;
        const uint8_t* blk[LB_MAX_PANELS];
        UNROLL for (int p = 0; p < P; p++) blk[p] = panel + p * pb + kb * bb;
#define LB_D(p, i) ld((const float*)blk[p] + (i) * VL)
#define LB_M(p, i) ld((const float*)blk[p] + NR + (i) * VL)
#define LB_KD(p, h, i) ld((const float*)blk[p] + (h) * NR + (i) * VL)        /* K-quant: d[h] */
#define LB_KM(p, h, i) ld((const float*)blk[p] + (2 + (h)) * NR + (i) * VL)  /* K-quant: m[h] */
        if (bits == 4) {
            _Pragma("GCC unroll 2")
            for (int k = 0; k < LB_K; k += 2) {
                UNROLL for (int p = 0; p < P; p++) {
                    const uint8_t* q = blk[p] + 8 * NR + k / 2 * NR;  /* after d[NR] and m[NR] */
                    vf w0[NV], w1[NV];
                    UNROLL for (int i = 0; i < NV; i++) {
                        const vi b = vi_load_u8(q + i * VL);
                        w0[i] = LB_D(p, i) * __builtin_convertvector(b & 15, vf) + LB_M(p, i);
                        w1[i] = LB_D(p, i) * __builtin_convertvector(b >> 4, vf) + LB_M(p, i);
                    }
                    LB_FMA_ROWS(acc[p], xk + k, w0)
                    LB_FMA_ROWS(acc[p], xk + k + 1, w1)
                }
            }
        } else if (bits == 6) {
            _Pragma("GCC unroll 2")
            for (int k = 0; k < LB_K; k++) {
                const int h = k / LB_HALF;
                UNROLL for (int p = 0; p < P; p++) {
                    const int8_t* q = (const int8_t*)(blk[p] + 16 * NR) + k * NR;  /* after d[2][NR], m[2][NR] */
                    vf w0[NV];
                    UNROLL for (int i = 0; i < NV; i++)
                        w0[i] = LB_KD(p, h, i) * __builtin_convertvector(vi_load_s8(q + i * VL), vf) + LB_KM(p, h, i);
                    LB_FMA_ROWS(acc[p], xk + k, w0)
                }
            }
        } else {
            _Pragma("GCC unroll 2")
            for (int k = 0; k < LB_K; k++) {
                UNROLL for (int p = 0; p < P; p++) {
                    const int8_t* q = (const int8_t*)(blk[p] + 4 * NR) + k * NR;  /* after d[NR] */
                    vf w0[NV];
                    UNROLL for (int i = 0; i < NV; i++)
                        w0[i] = LB_D(p, i) * __builtin_convertvector(vi_load_s8(q + i * VL), vf);
                    LB_FMA_ROWS(acc[p], xk + k, w0)
                }
            }
        }
    }
    UNROLL for (int p = 0; p < P; p++)
        micro_end(R, acc[p], t, fin, c + p * cstep, ldc, NR, g ? g + p * MR * NR : NULL, best, col0 + p * NR);
}
#undef LB_FMA_ROWS
#undef LB_D
#undef LB_M
#undef LB_KD
#undef LB_KM

/* lowbit_micro with R a constant (or lowbit_micro_panels over LB_PANELS(R) panels where multi
 * is set and R takes several), so the accumulators stay in registers */
static void lowbit_micro_rows(int R, int multi, const float* a, int64_t lda, const uint8_t* panel, int64_t pb,
                              int bits, int64_t K, enum fin fin, const float* bias, float* c, int64_t ldc,
                              int64_t cstep, int64_t ncols, const float* g, struct best* best, int64_t col0) {
#define CASE(r) case r:                                                                                     \
        if (multi && LB_PANELS(r) > 1)                                                                    \
            lowbit_micro_panels(r, LB_PANELS(r), a, lda, panel, pb, bits, K, fin, bias, c, ldc, cstep, g, best, \
                                col0);                                                                    \
        else                                                                                              \
            lowbit_micro(r, a, lda, panel, bits, K, fin, bias, c, ldc, ncols, g, best, col0);               \
        break;
    switch (R) { EACH_ROW_COUNT(CASE) }
#undef CASE
}

/* gemm_range's work for rows [m0, m1), at most MR of them, over low-bit panels [q0, q1)
 * (the same arguments and outputs). Full panels go LB_PANELS(R) at a time, the rest one by
 * one. NOTE: no software prefetch: a thread's panels are one contiguous run that the
 * hardware prefetcher streams, and asking for whole panels ahead (hundreds of lines at once)
 * stalled the loads of the panels in use. */
static void lowbit_range(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t lda, const uint8_t* low,
                         int bits, int64_t N, const float* bias, float* out, int64_t ldc, int64_t q0, int64_t q1,
                         int64_t silu_half, struct best* best) {
    const int R = (int)(m1 - m0), P = LB_PANELS(R);
    const int64_t pb = lowbit_panel_bytes(bits, K);
    const float* a = x + m0 * lda;
    float g[LB_MAX_PANELS * MR * NR] __attribute__((aligned(64)));  /* the gate tiles */
    for (int64_t q = q0, n; q < q1; q += n) {
        n = q + P <= q1 && (q + P) * NR <= N ? P : 1;  /* panels this step */
        const int64_t col0 = q * NR, ncols = N - col0 < NR ? N - col0 : NR;
        const int multi = n > 1;
        if (silu_half > 0) {
            lowbit_micro_rows(R, multi, a, lda, low + q * pb, pb, bits, K, STORE, NULL, g, NR, MR * NR, NR, NULL, NULL,
                              0);
            lowbit_micro_rows(R, multi, a, lda, low + (q + silu_half) * pb, pb, bits, K, SILU, NULL,
                              out + m0 * ldc + col0, ldc, NR, NR, g, NULL, 0);
        } else {
            lowbit_micro_rows(R, multi, a, lda, low + q * pb, pb, bits, K, best ? ARGMAX : STORE,
                              bias ? bias + col0 : NULL, best ? NULL : out + m0 * ldc + col0, ldc, NR, ncols, NULL,
                              best ? best + m0 : NULL, col0);
        }
    }
}
#endif
