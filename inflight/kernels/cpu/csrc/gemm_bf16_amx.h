/*
 * The bf16 GEMM's per-thread loops at the amx_bf16 level (gemm_bf16.c): Intel AMX tile
 * matrix multiplies (TDPBF16PS), with the dot-product loops of gemm_bf16_dp.h for what
 * the tiles cannot run. Included by gemm_bf16.c only, after PANEL, MC and enum mode.
 *
 * The packing is the dot-product level's: a panel's K-pair row is [32 columns][2], 128
 * bytes, so 16 K pairs of a panel's first or second 16 columns are one B tile (16 rows
 * of 64 bytes) read with a 128-byte stride, and 32 K values of 16 rows of x are one A
 * tile read in place with the row stride. A register block is 32 rows x one panel:
 * four fp32 C tiles, two A tiles, two B tiles, the eight tile registers.
 *
 * NOTE: the tiles' sums differ from the dot-product loops' in the last bit now and then
 * (the order of each K pair's two products), so every call with K a multiple of AMX_K
 * runs on the tiles, one row as well as a thousand: a row's outputs then never depend
 * on how many other rows share its call (a sequence's tokens on the batch it runs in).
 * A lone row costs no more on the tiles than on the dot product: both wait on the
 * weights' bytes.
 */
#ifndef INFLIGHT_GEMM_BF16_AMX_H
#define INFLIGHT_GEMM_BF16_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "argmax_best.h"
#include "bf16_simd.h"
#include "gemm_bf16_dp.h"

#define AMX_MC 128                  /* rows per L2 block of x */
#define AMX_XBLOCK (640 << 10)      /* bytes of x per L2 block of rows, where a panel fits L1 */
#define AMX_L1_PANEL_K ((48 << 10) / (PANEL * 2))  /* the longest K whose panel fits a 48 KiB L1 */

/* rows per L2 block of x. Where a panel stays in L1 while a block passes over it, a
 * taller block (AMX_XBLOCK bytes of x, up to 512 rows) passes over the thread's panels
 * fewer times; a panel that does not fit L1 streams from L2 for every 32 rows anyway,
 * and a taller block there only adds L2 traffic. */
static inline int64_t amx_block_rows(int64_t K) {
    if (K > AMX_L1_PANEL_K) return AMX_MC;
    const int64_t rows = AMX_XBLOCK / (2 * K) / 32 * 32;
    return rows < AMX_MC ? AMX_MC : rows > 512 ? 512 : rows;
}

/* acc[32][32] = init + rows x0 (16 rows, stride0 elements) and x1 (the next 16; NULL:
 * none, acc rows 16-31 untouched) . the panel b over K (a multiple of AMX_K). init:
 * 32 floats every row starts from (NULL: zero). Tiles 0-3: C (rows 0-15 x cols 0-15,
 * 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31); 4, 5: A (rows 0-15, 16-31); 6, 7: B (cols
 * 0-15, 16-31). pf: a panel whose lines each K step prefetches into L2 as many of as it
 * reads of b (NULL: none), so the next panel streams in from memory while this one runs. */
static inline void amx_block(const uint16_t* x0, int64_t stride0, const uint16_t* x1, int64_t stride1, int64_t K,
                             const uint16_t* b, const float* init, float* acc, const char* pf) {
    if (init) {  /* a zero stride: every row of the tile reads the same 64 bytes */
        _tile_loadd(0, init, 0);
        _tile_loadd(1, init + 16, 0);
        _tile_loadd(2, init, 0);
        _tile_loadd(3, init + 16, 0);
    } else {
        amx_zero_c();
    }
    for (int64_t k = 0; k < K; k += AMX_K) {
        if (pf)
            for (int l = 0; l < AMX_K * PANEL * 2; l += 64) _mm_prefetch(pf + k * PANEL * 2 + l, _MM_HINT_T1);
        _tile_loadd(6, b + k * PANEL, 2 * PANEL * 2);
        _tile_loadd(7, b + k * PANEL + 32, 2 * PANEL * 2);
        _tile_loadd(4, x0 + k, stride0 * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (x1) {
            _tile_loadd(5, x1 + k, stride1 * 2);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, acc, 32 * 4);
    _tile_stored(1, acc + 16, 32 * 4);
    if (x1) {
        _tile_stored(2, acc + 16 * 32, 32 * 4);
        _tile_stored(3, acc + 16 * 32 + 16, 32 * 4);
    }
}

/* rows [0, R) of a block's sums (acc; up: the matching up panel's, SILU) into out or
 * best, through the epilogues of gemm_bf16_dp.h's micro */
static void amx_epilogue(int mode, int R, const float* acc, const float* up, struct best* best, int64_t n0,
                         int64_t N, uint16_t* out, int64_t ldc) {
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 2; i++) {
            const int64_t c = n0 + 16 * i;
            const __m512 a = _mm512_loadu_ps(acc + r * 32 + 16 * i);
            if (mode == SILU) silu_mul16(out + r * ldc + c, a, _mm512_loadu_ps(up + r * 32 + 16 * i));
            else if (c >= N) break;
            else if (mode == ARGMAX) argmax16(best + r, c, N, a);
            else store_bf16x16(out + r * ldc + c, a, tail_mask(N - c));
        }
}

/* the rows [m, m + 16) as an A tile source: x itself, or for the last M % 16 rows the
 * zero-padded copy tail (16 rows of K) */
static inline const uint16_t* amx_rows(const uint16_t* x, int64_t lda, int64_t M, int64_t m, const uint16_t* tail,
                                       int64_t K, int64_t* stride) {
    if (m + 16 <= M) {
        *stride = lda;
        return x + m * lda;
    }
    *stride = K;
    return tail;
}

/* gemm_range of gemm_bf16_dp.h on AMX tiles: panels [q0, q1) for every row, each panel
 * kept in cache while every 32-row block of an L2 block of rows passes over it.
 * Calls with K not a multiple of AMX_K, or without the kernel's permission for the
 * tiles, run the dot-product loops. */
static void amx_gemm_range(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed,
                           int64_t N, const uint16_t* bias, uint16_t* out, int64_t ldc, int64_t q0, int64_t q1,
                           int64_t silu_half, struct best* best) {
    if (K % AMX_K || !amx_permitted()) {
        dp_gemm_range(x, M, K, lda, packed, N, bias, out, ldc, q0, q1, silu_half, best);
        return;
    }
    const int mode = silu_half > 0 ? SILU : best ? ARGMAX : PLAIN;
    const int64_t panel_elems = K * PANEL;
    uint16_t* tail = NULL;
    if (M % 16) {  /* tile loads read 16 rows: the last rows go through a zero-padded copy */
        tail = (uint16_t*)calloc((size_t)(16 * K), sizeof(uint16_t));
        if (!tail) {
            dp_gemm_range(x, M, K, lda, packed, N, bias, out, ldc, q0, q1, silu_half, best);
            return;
        }
        for (int64_t r = 0; r < M % 16; r++) memcpy(tail + r * K, x + (M - M % 16 + r) * lda, K * sizeof(uint16_t));
    }
    float acc[32 * 32] __attribute__((aligned(64))), up[32 * 32] __attribute__((aligned(64)));
    float init[32] __attribute__((aligned(64)));
    amx_configure();
    const int64_t mrows = amx_block_rows(K);
    for (int64_t mc = 0; mc < M; mc += mrows) {
        const int64_t mend = mc + mrows < M ? mc + mrows : M;
        for (int64_t q = q0; q < q1; q++) {
            const uint16_t* b = packed + q * panel_elems;
            if (bias)
                for (int i = 0; i < 32; i++) init[i] = q * PANEL + i < N ? bf16_to_f32(bias[q * PANEL + i]) : 0.f;
            for (int64_t m = mc; m < mend; m += 32) {
                int64_t s0, s1 = 0;
                const uint16_t* x0 = amx_rows(x, lda, M, m, tail, K, &s0);
                const uint16_t* x1 = m + 16 < mend ? amx_rows(x, lda, M, m + 16, tail, K, &s1) : NULL;
                /* the first row block of an L2 block asks for the next panel */
                const char* pf = m == mc && q + 1 < q1 ? (const char*)(b + panel_elems) : NULL;
                amx_block(x0, s0, x1, s1, K, b, bias ? init : NULL, acc, pf);
                if (mode == SILU)
                    amx_block(x0, s0, x1, s1, K, b + silu_half * panel_elems, NULL, up,
                              pf ? pf + silu_half * panel_elems * 2 : NULL);
                const int R = mend - m < 32 ? (int)(mend - m) : 32;
                amx_epilogue(mode, R, acc, up, best ? best + m : NULL, q * PANEL, N, out ? out + m * ldc : NULL, ldc);
            }
        }
    }
    _tile_release();
    free(tail);
}

#endif
