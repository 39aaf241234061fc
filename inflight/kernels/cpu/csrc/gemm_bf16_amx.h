/*
 * The bf16 GEMM's per-thread loops at the amx_bf16 level (gemm_bf16.c): Intel AMX tile
 * matrix multiplies (TDPBF16PS), with the dot-product loops of gemm_bf16_dp.h for what
 * the tiles cannot run. Included by gemm_bf16.c only, after PANEL, MC and enum mode.
 *
 * The packing is the dot-product level's: a panel's K-pair row is [32 columns][2], 128
 * bytes, so 16 K pairs of a panel's first or second 16 columns are one B tile (16 rows
 * of 64 bytes) read with a 128-byte stride, and 32 K values of 16 rows of x are one A
 * tile read in place with the row stride. A register block is 32 rows x one panel:
 * four fp32 C tiles, two A tiles, two B tiles, the eight tile registers. Where the
 * epilogue costs (SILU's exp and divide, ARGMAX's maxima) a block's tile products are
 * issued a K step at a time between the epilogue rows of the block before it.
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

/* one register block: 32 rows (x1 NULL: 16) x one panel, its tile products issued a K
 * step at a time (amx_job_steps) so that they run beside the epilogue of the block
 * before it, or in one pass (amx_job_whole). Tiles 0-3: C (rows 0-15 x cols 0-15, 0-15
 * x 16-31, 16-31 x 0-15, 16-31 x 16-31); 4, 5: A (rows 0-15, 16-31); 6, 7: B (cols 0-15,
 * 16-31). SILU runs the gate panel b over K into acc, then the up panel bu over K into
 * up. init: 32 floats every row starts from (NULL: zero). pf: a panel whose lines each K
 * step prefetches into L2 as many of as it reads of b (NULL: none), so the next panel
 * streams in from memory while this one runs. */
struct amx_job {
    const uint16_t *x0, *x1, *b, *bu;
    int64_t s0, s1;
    const float* init;
    const char *pf, *pfu;
    float *acc, *up;
    int step, nsteps;        /* K steps issued, of K / AMX_K (twice that for SILU) */
    int R;                   /* rows of the epilogue */
    int64_t m, n0;           /* the block's first row and first column */
};

/* the K steps [k0, k1) of rows x0 (16 rows, stride st0 bytes) and x1 (the next 16; NULL:
 * none) times the panel b into the C tiles.
 * NOTE: tile registers are not renamed: a load waits until the products before it that
 * read that tile have, so each tile is loaded in the order the last step frees them */
static inline void amx_k_steps(const uint16_t* x0, int64_t st0, const uint16_t* x1, int64_t st1,
                               const uint16_t* b, const char* pf, int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k += AMX_K) {
        if (pf)
            for (int l = 0; l < AMX_K * PANEL * 2; l += 64) _mm_prefetch(pf + k * PANEL * 2 + l, _MM_HINT_T1);
        _tile_loadd(4, x0 + k, st0);
        _tile_loadd(6, b + k * PANEL, 2 * PANEL * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b + k * PANEL + 32, 2 * PANEL * 2);
        _tile_dpbf16ps(1, 4, 7);
        if (x1) {
            _tile_loadd(5, x1 + k, st1);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* the C tiles to init (32 floats every row starts from) or to zero (init NULL) */
static inline void amx_start_c(const float* init) {
    if (!init) {
        amx_zero_c();
        return;
    }
    _tile_loadd(0, init, 0);  /* a zero stride: every row of the tile reads the same 64 bytes */
    _tile_loadd(1, init + 16, 0);
    _tile_loadd(2, init, 0);
    _tile_loadd(3, init + 16, 0);
}

/* the C tiles into dst (32 rows of 32 floats; rows 16-31 only with both halves) */
static inline void amx_store_c(float* dst, int both) {
    _tile_stored(0, dst, 32 * 4);
    _tile_stored(1, dst + 16, 32 * 4);
    if (both) {
        _tile_stored(2, dst + 16 * 32, 32 * 4);
        _tile_stored(3, dst + 16 * 32 + 16, 32 * 4);
    }
}

/* the job's whole pass over K, not interleaved with anything: a plain GEMM's epilogue
 * is a few stores a row, and the bookkeeping of steps costs a plain block more than the
 * overlap gains */
static inline void amx_job_whole(struct amx_job* j, int64_t K) {
    amx_start_c(j->init);
    amx_k_steps(j->x0, j->s0 * 2, j->x1, j->s1 * 2, j->b, j->pf, 0, K);
    amx_store_c(j->acc, j->x1 != NULL);
}

/* issue the job's K steps up to (not past) `upto`; a pass over K starts from init or
 * zero and ends with its C tiles stored (SILU's second pass: the up panel from zero) */
static inline void amx_job_steps(struct amx_job* j, int64_t K, int upto) {
    const int half = (int)(K / AMX_K);
    for (; j->step < upto; j->step++) {
        const int second = j->step >= half;
        const int64_t k = (int64_t)(j->step - (second ? half : 0)) * AMX_K;
        if (k == 0) amx_start_c(second ? NULL : j->init);
        amx_k_steps(j->x0, j->s0 * 2, j->x1, j->s1 * 2, second ? j->bu : j->b, second ? j->pfu : j->pf, k,
                    k + AMX_K);
        if (k + AMX_K == K) amx_store_c(second ? j->up : j->acc, j->x1 != NULL);
    }
}

/* row r of a finished job's sums (acc; up: the matching up panel's, SILU) into out or
 * best, through the epilogues of gemm_bf16_dp.h's micro */
static inline void amx_epilogue_row(int mode, const struct amx_job* j, int r, struct best* best, int64_t N,
                                    uint16_t* out, int64_t ldc) {
    for (int i = 0; i < 2; i++) {
        const int64_t c = j->n0 + 16 * i;
        const __m512 a = _mm512_loadu_ps(j->acc + r * 32 + 16 * i);
        if (mode == SILU) silu_mul16(out + (j->m + r) * ldc + c, a, _mm512_loadu_ps(j->up + r * 32 + 16 * i));
        else if (c >= N) break;
        else if (mode == ARGMAX) argmax16(best + j->m + r, c, N, a);
        else store_bf16x16(out + (j->m + r) * ldc + c, a, tail_mask(N - c));
    }
}

/* the epilogue of done (NULL: none) with the K steps of next (NULL: none) spread over
 * its rows, then whatever steps of next are left.
 * NOTE: the tiles and the vector units work at once only where the program interleaves
 * them: an epilogue written after the whole K loop waits on the loop's last product,
 * and the next block's products then wait behind the epilogue. */
static inline void amx_overlap(int mode, const struct amx_job* done, struct amx_job* next, int64_t K,
                               struct best* best, int64_t N, uint16_t* out, int64_t ldc) {
    if (done)
        for (int r = 0; r < done->R; r++) {
            if (next) amx_job_steps(next, K, (r + 1) * next->nsteps / done->R);
            amx_epilogue_row(mode, done, r, best, N, out, ldc);
        }
    if (next) amx_job_steps(next, K, next->nsteps);
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

/* tile loads read 16 rows: the last M % 16 rows of x as a zero-padded copy of 16 rows
 * of K (NULL: out of memory) */
static uint16_t* amx_tail_rows(const uint16_t* x, int64_t M, int64_t K, int64_t lda) {
    uint16_t* tail = (uint16_t*)calloc((size_t)(16 * K), sizeof(uint16_t));
    if (tail)
        for (int64_t r = 0; r < M % 16; r++) memcpy(tail + r * K, x + (M - M % 16 + r) * lda, K * sizeof(uint16_t));
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
    if (M % 16 && !(tail = amx_tail_rows(x, M, K, lda))) {
        dp_gemm_range(x, M, K, lda, packed, N, bias, out, ldc, q0, q1, silu_half, best);
        return;
    }
    /* two blocks' sums: one block's epilogue reads one while the next block's tiles fill the other */
    float acc[2][32 * 32] __attribute__((aligned(64))), up[2][32 * 32] __attribute__((aligned(64)));
    float init[32] __attribute__((aligned(64)));
    struct amx_job jobs[2];
    struct amx_job* prev = NULL;
    int n = 0;
    amx_configure();
    const int64_t mrows = amx_block_rows(K);
    for (int64_t mc = 0; mc < M; mc += mrows) {
        const int64_t mend = mc + mrows < M ? mc + mrows : M;
        for (int64_t q = q0; q < q1; q++) {
            const uint16_t* b = packed + q * panel_elems;
            if (bias)
                for (int i = 0; i < 32; i++) init[i] = q * PANEL + i < N ? bf16_to_f32(bias[q * PANEL + i]) : 0.f;
            for (int64_t m = mc; m < mend; m += 32, n ^= 1) {
                struct amx_job* j = &jobs[n];
                *j = (struct amx_job){.b = b, .bu = mode == SILU ? b + silu_half * panel_elems : NULL,
                                      .init = bias ? init : NULL, .acc = acc[n], .up = up[n],
                                      .nsteps = (int)(K / AMX_K) * (mode == SILU ? 2 : 1),
                                      .R = mend - m < 32 ? (int)(mend - m) : 32, .m = m, .n0 = q * PANEL};
                j->x0 = amx_rows(x, lda, M, m, tail, K, &j->s0);
                if (m + 16 < mend) j->x1 = amx_rows(x, lda, M, m + 16, tail, K, &j->s1);
                if (m == mc && q + 1 < q1) {  /* the first row block of an L2 block asks for the next panel */
                    j->pf = (const char*)(b + panel_elems);
                    if (mode == SILU) j->pfu = j->pf + silu_half * panel_elems * 2;
                }
                if (mode == PLAIN) {
                    amx_job_whole(j, K);
                    amx_overlap(mode, j, NULL, K, best, N, out, ldc);
                } else {
                    amx_overlap(mode, prev, j, K, best, N, out, ldc);
                    prev = j;
                }
            }
        }
    }
    amx_overlap(mode, prev, NULL, K, best, N, out, ldc);
    _tile_release();
    free(tail);
}

#endif
