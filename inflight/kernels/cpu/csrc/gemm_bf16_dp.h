/*
 * The bf16 GEMM's per-thread loops at the avx512_bf16 level (gemm_bf16.c): the
 * register block on the bf16 dot-product instruction (micro, with its PLAIN, SILU and
 * ARGMAX epilogues) and dp_gemm_range, which streams each pair of panels once per block
 * of rows. Included by gemm_bf16.c only, after PANEL, MC and enum mode.
 */
#ifndef INFLIGHT_GEMM_BF16_DP_H
#define INFLIGHT_GEMM_BF16_DP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "argmax_best.h"
#include "bf16_simd.h"

#define MR 6      /* rows per register block: 6 x 4 accumulators + 4 weights + 1 broadcast < 32 zmm */
#define MR2 12    /* rows per register block over one panel: 12 x 2 accumulators */

/* x pair (x[k], x[k+1]) as one 32-bit lane; a lone last k of an odd K pairs with 0,
 * never with whatever follows the row. */
static inline __m512bh pair_at(const uint16_t* row, int64_t k, int64_t K) {
    int32_t v;
    if (k + 1 < K) memcpy(&v, row + k, sizeof v);
    else v = row[k];
    return (__m512bh)_mm512_set1_epi32(v);
}

/* the ARGMAX epilogue of 16 sums for columns [c, c + 16) (c < N, a multiple of 16) */
static inline void argmax16(struct best* best, int64_t c, int64_t N, __m512 acc) {
    /* c is a multiple of 16: its 16 columns' bits are one half of a mask word */
    const __mmask16 ok = best->allow ? (__mmask16)((uint32_t)best->allow[c >> 5] >> (c & 31)) : 0xFFFF;
    const __m512 v = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), tail_mask(N - c) & ok, round_bf16(acc));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan) {  /* the first NaN wins, as in torch.argmax (best_beats); the max below would skip it */
        if (best->val == best->val) {
            best->val = NAN;
            best->idx = c + __builtin_ctz(nan);
        }
        return;
    }
    const float mx = _mm512_reduce_max_ps(v);
    if (mx > best->val) {
        best->val = mx;
        best->idx = c + __builtin_ctz(_mm512_cmpeq_ps_mask(v, _mm512_set1_ps(mx)));
    }
}

/* the SILU epilogue: 16 outputs bf16(silu(gate)) * up, rounded where silu_mul_bf16 (fused_ops.c) rounds */
static inline void silu_mul16(uint16_t* out, __m512 gate, __m512 up) {
    const __m512 g = round_bf16(gate), u = round_bf16(up);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 sg = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
    store_bf16x16(out, _mm512_mul_ps(round_bf16(sg), u), 0xFFFF);
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
            for (int i = 0; i < NV && n0 + 16 * i < N; i++) argmax16(best + r, n0 + 16 * i, N, acc[r][i]);
        return;
    }
    if (MODE == SILU) {
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 2; i++) silu_mul16(out + r * ldc + n0 + 16 * i, acc[r][i], acc[r][2 + i]);
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
static void dp_gemm_range(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed,
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

#endif
