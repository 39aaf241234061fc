/*
 * Paged bf16 prefill at the amx_bf16 level (paged_prefill.c): the avx512_bf16 level's
 * kernel (prefill_bf16_dp.h: the repack, the work lists, short chunks) with the rows'
 * attention on Intel AMX tiles. Per block of 16 rows (token, head pairs of one kv head):
 * Q.K^T on the tiles into the row's stretch of the thread's score rows, the max and
 * exp passes in AVX-512 as the dot-product level does them (bf16 probabilities over
 * the front of each row), then P.V on the tiles.
 *
 * The repacked tiles are already what TDPBF16PS reads: K tile [D/2][KT] pairs is K^T
 * with head-dim pairs as rows, V tile [KT/2][D] pairs is V with key pairs as rows, so
 * B tiles load from them in place; Q rows and probability rows are A tiles as they are.
 * Without the kernel's permission for the tiles, the dot-product level's loops run.
 */
#ifndef INFLIGHT_PREFILL_BF16_AMX_H
#define INFLIGHT_PREFILL_BF16_AMX_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "amx_tiles.h"

#define AMX_ROWS 16  /* rows per block: an A tile's rows */

static void amx_attend_item(const uint32_t* qrows, const int64_t* pos, int nrows, const uint32_t* ktiles, int D,
                            float scale, uint16_t* const* dst, float* sbuf, int64_t kpad);
#define PF_ATTEND amx_attend_item
#define PF_SBUF_ROWS AMX_ROWS
#include "prefill_bf16_dp.h"

_Static_assert(KT == 64, "amx_scores runs four 16-key C tiles per key tile");

/* Raw scores (unscaled, unmasked) of 16 query rows q (D/2 pairs each) against every key
 * tile up to kend, into sbuf rows kpad floats apart. Tiles 0-3: the scores of a key
 * tile's four groups of 16 keys; 4: 32 head-dim values of the queries; 5, 6: 16 head-dim
 * pairs x 16 keys of the K tile, read with its KT-pair row stride. */
static void amx_scores(const uint32_t* q, int D, const uint32_t* ktiles, int64_t kend, float* sbuf, int64_t kpad) {
    const int half = D / 2;
    const int64_t tile_words = (int64_t)KT * half;
    for (int64_t t0 = 0; t0 < kend; t0 += KT) {
        const uint32_t* kp = ktiles + (t0 / KT) * 2 * tile_words;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int dp = 0; dp < half; dp += AMX_K / 2) {
            const uint32_t* kb = kp + (int64_t)dp * KT;
            _tile_loadd(4, q + dp, half * 4);
            _tile_loadd(5, kb, KT * 4);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, kb + 16, KT * 4);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(5, kb + 32, KT * 4);
            _tile_dpbf16ps(2, 4, 5);
            _tile_loadd(6, kb + 48, KT * 4);
            _tile_dpbf16ps(3, 4, 6);
        }
        _tile_stored(0, sbuf + t0, kpad * 4);
        _tile_stored(1, sbuf + t0 + 16, kpad * 4);
        _tile_stored(2, sbuf + t0 + 32, kpad * 4);
        _tile_stored(3, sbuf + t0 + 48, kpad * 4);
    }
}

/* lanes [0, n) of a 16-lane vector, none for n <= 0 */
static inline __mmask16 lanes_below(int64_t n) { return n <= 0 ? 0 : tail_mask(n); }

/* One row's raw scores sr to bf16 probabilities written over the front of the row: keys
 * [0, lim) visible, keys [lim, kfill) zero (kfill a multiple of 32, its scores finite or
 * NaN). Returns the row's sum. NOTE: two accumulators in each pass, 32 keys a step: one
 * would chain every step on the latency of the last max or add. */
static float amx_softmax_row(float* sr, int64_t lim, int64_t kfill, float scale) {
    const float c = scale * 1.44269504088896341f;  /* e^(s scale - m) = 2^(s c - m log2 e) */
    const int64_t full = lim & ~(int64_t)63;
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t t = 0;
    for (; t < full; t += 64) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sr + t));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(sr + t + 16));
        m2 = _mm512_max_ps(m2, _mm512_loadu_ps(sr + t + 32));
        m3 = _mm512_max_ps(m3, _mm512_loadu_ps(sr + t + 48));
    }
    m0 = _mm512_max_ps(m0, m2);
    m1 = _mm512_max_ps(m1, m3);
    for (; t < lim; t += 16) m0 = _mm512_mask_max_ps(m0, tail_mask(lim - t), m0, _mm512_loadu_ps(sr + t));
    const __m512 sc = _mm512_set1_ps(c);
    const __m512 mm = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)) * c);  /* c > 0: max of s * c */
    uint16_t* pr = (uint16_t*)sr;  /* written behind the read position */
    __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;
    for (t = 0; t < kfill; t += 32) {
        __m512 p0 = exp2_for_bf16(_mm512_fmsub_ps(_mm512_loadu_ps(sr + t), sc, mm));
        __m512 p1 = exp2_for_bf16(_mm512_fmsub_ps(_mm512_loadu_ps(sr + t + 16), sc, mm));
        if (t + 32 > lim) {
            p0 = _mm512_maskz_mov_ps(lanes_below(lim - t), p0);
            p1 = _mm512_maskz_mov_ps(lanes_below(lim - t - 16), p1);
        }
        sum0 = _mm512_add_ps(sum0, p0);
        sum1 = _mm512_add_ps(sum1, p1);
        _mm512_storeu_si512(pr + t, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* P.V for 16 rows over keys [0, kfill), normalized by 1 / l[r], into dst[r] for r < nr.
 * Per group of 64 head-dim columns (32 for the last of a D not a multiple of 64): tiles
 * 0-3 the outputs of 16 columns each; 4: 32 keys' probabilities of the 16 rows (the bf16
 * front of each sbuf row); 5, 6: 16 key pairs x 16 columns of the V tile, read with its
 * D-pair row stride. */
static void amx_values(const uint32_t* ktiles, int D, int64_t kfill, const float* sbuf, int64_t kpad,
                       const float* l, int nr, uint16_t* const* dst) {
    const int64_t tile_words = (int64_t)KT * (D / 2);
    float o[AMX_ROWS * 64] __attribute__((aligned(64)));
    for (int d0 = 0; d0 < D; d0 += 64) {
        const int wide = D - d0 >= 64;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t t0 = 0; t0 < kfill; t0 += AMX_K) {
            const uint32_t* vb = ktiles + (t0 / KT) * 2 * tile_words + tile_words + (t0 % KT) / 2 * D + d0;
            _tile_loadd(4, (const uint16_t*)sbuf + t0, kpad * 4);
            _tile_loadd(5, vb, D * 4);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, vb + 16, D * 4);
            _tile_dpbf16ps(1, 4, 6);
            if (wide) {
                _tile_loadd(5, vb + 32, D * 4);
                _tile_dpbf16ps(2, 4, 5);
                _tile_loadd(6, vb + 48, D * 4);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
        _tile_stored(0, o, 64 * 4);
        _tile_stored(1, o + 16, 64 * 4);
        _tile_stored(2, o + 32, 64 * 4);
        _tile_stored(3, o + 48, 64 * 4);
        for (int r = 0; r < nr; r++) {
            const __m512 inv = _mm512_set1_ps(1.f / l[r]);
            for (int c = 0; c < (wide ? 4 : 2); c++)
                store_bf16x16(dst[r] + d0 + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(o + r * 64 + 16 * c), inv), 0xFFFF);
        }
    }
}

/* attend_item on the tiles: the item's rows (in position order) a block of 16 at a time,
 * each against every key up to its last row's position; the last block's missing rows
 * are zero queries whose outputs are dropped. */
static void amx_attend_item(const uint32_t* qrows, const int64_t* pos, int nrows, const uint32_t* ktiles, int D,
                            float scale, uint16_t* const* dst, float* sbuf, int64_t kpad) {
    if (!amx_permitted()) {
        attend_item(qrows, pos, nrows, ktiles, D, scale, dst, sbuf, kpad);
        return;
    }
    const int half = D / 2;
    uint32_t qpad[AMX_ROWS * MAX_D / 2] __attribute__((aligned(64)));
    float l[AMX_ROWS];
    amx_configure();
    for (int r0 = 0; r0 < nrows; r0 += AMX_ROWS) {
        const int nr = nrows - r0 < AMX_ROWS ? nrows - r0 : AMX_ROWS;
        const uint32_t* q = qrows + (int64_t)r0 * half;
        if (nr < AMX_ROWS) {
            memset(qpad, 0, sizeof(uint32_t) * AMX_ROWS * half);
            memcpy(qpad, q, sizeof(uint32_t) * nr * half);
            q = qpad;
        }
        const int64_t kend = pos[r0 + nr - 1] + 1, kfill = (kend + AMX_K - 1) / AMX_K * AMX_K;
        amx_scores(q, D, ktiles, kend, sbuf, kpad);
        for (int r = 0; r < nr; r++) l[r] = amx_softmax_row(sbuf + r * kpad, pos[r0 + r] + 1, kfill, scale);
        amx_values(ktiles, D, kfill, sbuf, kpad, l, nr, dst + r0);
    }
    _tile_release();
}

#endif
