/*
 * Paged bf16 prefill at the amx_bf16 level (paged_prefill.c): the avx512_bf16 level's
 * kernel (prefill_bf16_dp.h: the repack, the work lists, short chunks) with the rows'
 * attention on Intel AMX tiles. Per block of 16 rows (token, head pairs of one kv head):
 * Q.K^T on the tiles into the rows' stretch of the thread's score rows, the max and exp
 * passes in AVX-512 (bf16 probabilities over the front of each row), then P.V on the
 * tiles. The tile work of the next and the last block runs interleaved with a block's
 * softmax (struct amx_pump), so both kinds of unit are busy at once.
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
#define PF_SBUF_ROWS (3 * AMX_ROWS)  /* a block in the softmax, the next one's scores, the last one's P.V */
#include "prefill_bf16_dp.h"

_Static_assert(KT == 64, "amx_scores_step runs four 16-key C tiles per key tile");

/* lanes [0, n) of a 16-lane vector, none for n <= 0 */
static inline __mmask16 lanes_below(int64_t n) { return n <= 0 ? 0 : tail_mask(n); }

/* The tile work of a block, run a step (four tile products) at a time: the scores of the
 * next block, then the P.V of the last one, while the AVX-512 units do this block's
 * softmax, so the tiles and the vector units work at once.
 * Scores (raw: unscaled, unmasked), a step per 32 head-dim values of a 64-key tile: tiles
 * 0-3 the scores of the tile's four groups of 16 keys; 4: 32 head-dim values of the 16
 * query rows; 5, 6: 16 head-dim pairs x 16 keys of the K tile, read with its KT-pair row
 * stride. The repacked K tile [D/2][KT] pairs is K^T with head-dim pairs as rows.
 * P.V, a step per 32 keys of a group of 64 head-dim columns (32 for the last of a D not a
 * multiple of 64): tiles 0-3 the outputs of 16 columns each; 4: 32 keys' probabilities of
 * the 16 rows (the bf16 front of each row); 5, 6: 16 key pairs x 16 columns of the V tile
 * [KT/2][D] pairs, read with its D-pair row stride; outputs normalized by 1 / l[r]. */
struct amx_pump {
    const uint32_t* ktiles;
    int D, phase;          /* phase 0: scores, 1: values, 2: done */
    int every, countdown;  /* a step per `every` softmax steps */
    int64_t kpad;
    const uint32_t* q;     /* scores: q rows into s_buf up to s_end */
    float* s_buf;
    int64_t s_end, s_t0;
    int s_dp;
    const float* v_buf;    /* values: v_buf's probabilities over v_kfill keys, into v_dst */
    const float* v_l;
    uint16_t* const* v_dst;
    int64_t v_kfill, v_t0;
    int v_nr, v_d0;
    float o[AMX_ROWS * 64] __attribute__((aligned(64)));
};

static void amx_scores_step(struct amx_pump* p) {
    const int half = p->D / 2;
    if (p->s_dp == 0) amx_zero_c();
    const uint32_t* kb = p->ktiles + (p->s_t0 / KT) * 2 * (int64_t)KT * half + (int64_t)p->s_dp * KT;
    _tile_loadd(4, p->q + p->s_dp, half * 4);
    _tile_loadd(5, kb, KT * 4);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, kb + 16, KT * 4);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, kb + 32, KT * 4);
    _tile_dpbf16ps(2, 4, 5);
    _tile_loadd(6, kb + 48, KT * 4);
    _tile_dpbf16ps(3, 4, 6);
    if ((p->s_dp += AMX_K / 2) < half) return;
    float* sb = p->s_buf + p->s_t0;
    _tile_stored(0, sb, p->kpad * 4);
    _tile_stored(1, sb + 16, p->kpad * 4);
    _tile_stored(2, sb + 32, p->kpad * 4);
    _tile_stored(3, sb + 48, p->kpad * 4);
    p->s_dp = 0;
    if ((p->s_t0 += KT) >= p->s_end) p->phase = p->v_buf ? 1 : 2;
}

static void amx_values_step(struct amx_pump* p) {
    const int D = p->D, d0 = p->v_d0, wide = D - d0 >= 64;
    if (p->v_t0 == 0) amx_zero_c();
    const int64_t t0 = p->v_t0, tile_words = (int64_t)KT * (D / 2);
    const uint32_t* vb = p->ktiles + (t0 / KT) * 2 * tile_words + tile_words + (t0 % KT) / 2 * D + d0;
    _tile_loadd(4, (const uint16_t*)p->v_buf + t0, p->kpad * 4);
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
    if ((p->v_t0 += AMX_K) < p->v_kfill) return;
    _tile_stored(0, p->o, 64 * 4);
    _tile_stored(1, p->o + 16, 64 * 4);
    _tile_stored(2, p->o + 32, 64 * 4);
    _tile_stored(3, p->o + 48, 64 * 4);
    for (int r = 0; r < p->v_nr; r++) {
        const __m512 inv = _mm512_set1_ps(1.f / p->v_l[r]);
        for (int c = 0; c < (wide ? 4 : 2); c++)
            store_bf16x16(p->v_dst[r] + d0 + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(p->o + r * 64 + 16 * c), inv),
                          0xFFFF);
    }
    p->v_t0 = 0;
    if ((p->v_d0 += 64) >= D) p->phase = 2;
}

/* the steps of a freshly loaded pump's work */
static int64_t amx_pump_steps(const struct amx_pump* p) {
    const int64_t s = p->q ? (p->s_end + KT - 1) / KT * (p->D / AMX_K) : 0;
    return s + (p->v_buf ? p->v_kfill / AMX_K * ((p->D + 63) / 64) : 0);
}

/* Loads the pump with the scores of q's 16 rows over keys [0, s_end) into s_buf (q NULL:
 * none) and the P.V of v_buf's nr rows over keys [0, v_kfill) into v_dst (v_buf NULL: none),
 * its steps spread evenly over the `iters` softmax steps it is to run beside (0: none). */
static void amx_pump_load(struct amx_pump* p, const uint32_t* q, float* s_buf, int64_t s_end, const float* v_buf,
                          const float* v_l, int nr, uint16_t* const* v_dst, int64_t v_kfill, int64_t iters) {
    p->q = q, p->s_buf = s_buf, p->s_end = s_end, p->s_t0 = 0, p->s_dp = 0;
    p->v_buf = v_buf, p->v_l = v_l, p->v_nr = nr, p->v_dst = v_dst, p->v_kfill = v_kfill, p->v_t0 = 0, p->v_d0 = 0;
    p->phase = q ? 0 : v_buf ? 1 : 2;
    const int64_t steps = amx_pump_steps(p);
    p->every = p->countdown = steps > 0 && iters > steps ? (int)(iters / steps) : 1;
}

/* one step of the pump's work, if any is left */
static inline void amx_pump_step(struct amx_pump* p) {
    if (p->phase == 0) amx_scores_step(p);
    else if (p->phase == 1) amx_values_step(p);
}

static void amx_pump_run(struct amx_pump* p) {
    while (p->phase < 2) amx_pump_step(p);
}

/* One row's raw scores sr to bf16 probabilities written over the front of the row: keys
 * [0, lim) visible, keys [lim, kfill) zero (kfill a multiple of 32, its scores finite or
 * NaN). Returns the row's sum; the pump takes a step every pump->every steps of 32
 * keys. NOTE: four max and two sum accumulators: one would chain every step on the
 * latency of the last max or add. */
static float amx_softmax_row(float* sr, int64_t lim, int64_t kfill, float scale, struct amx_pump* pump) {
    const float c = scale * LOG2E_F;  /* e^(s scale - m) = 2^(s c - m log2 e) */
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
        if (--pump->countdown == 0) {
            pump->countdown = pump->every;
            amx_pump_step(pump);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* A block of 16 rows (nr real) of the item: its query rows, its keys, its outputs. */
struct amx_block {
    const uint32_t* q;
    int nr;
    int64_t kfill;  /* keys up to the last row's position, in whole groups of 32 */
};

static struct amx_block amx_block_at(const uint32_t* qrows, const int64_t* pos, int nrows, int r0, int half,
                                     uint32_t* qpad) {
    struct amx_block b = {qrows + (int64_t)r0 * half, nrows - r0 < AMX_ROWS ? nrows - r0 : AMX_ROWS, 0};
    if (b.nr < AMX_ROWS) {  /* the last block's missing rows: zero queries whose outputs are dropped */
        memset(qpad, 0, sizeof(uint32_t) * AMX_ROWS * half);
        memcpy(qpad, b.q, sizeof(uint32_t) * b.nr * half);
        b.q = qpad;
    }
    b.kfill = (pos[r0 + b.nr - 1] + AMX_K) / AMX_K * AMX_K;
    return b;
}

/* attend_item on the tiles: the item's rows (in position order) a block of 16 at a time,
 * each against every key up to its last row's position. Block i's softmax runs with the
 * pump doing block i+1's scores and block i-1's P.V; sbuf holds three blocks' rows. */
static void amx_attend_item(const uint32_t* qrows, const int64_t* pos, int nrows, const uint32_t* ktiles, int D,
                            float scale, uint16_t* const* dst, float* sbuf, int64_t kpad) {
    if (!amx_permitted()) {
        attend_item(qrows, pos, nrows, ktiles, D, scale, dst, sbuf, kpad);
        return;
    }
    if (nrows <= 0) return;
    const int half = D / 2, nb = (nrows + AMX_ROWS - 1) / AMX_ROWS;
    const int64_t bstride = (int64_t)AMX_ROWS * kpad;
    uint32_t qpad[AMX_ROWS * MAX_D / 2] __attribute__((aligned(64)));
    float l[2][AMX_ROWS];
    struct amx_pump pump;
    pump.ktiles = ktiles, pump.D = D, pump.kpad = kpad;
    amx_configure();
    struct amx_block cur = amx_block_at(qrows, pos, nrows, 0, half, qpad), prev = cur;
    amx_pump_load(&pump, cur.q, sbuf, cur.kfill, NULL, NULL, 0, NULL, 0, 0);
    amx_pump_run(&pump);
    for (int i = 0; i < nb; i++) {
        const int more = i + 1 < nb;
        const struct amx_block next = more ? amx_block_at(qrows, pos, nrows, (i + 1) * AMX_ROWS, half, qpad) : cur;
        amx_pump_load(&pump, more ? next.q : NULL, sbuf + (i + 1) % 3 * bstride, next.kfill,
                      i > 0 ? sbuf + (i + 2) % 3 * bstride : NULL, l[(i + 1) % 2], prev.nr,
                      i > 0 ? dst + (int64_t)(i - 1) * AMX_ROWS : NULL, prev.kfill,
                      (int64_t)cur.nr * (cur.kfill / AMX_K));
        float* sb = sbuf + i % 3 * bstride;
        for (int r = 0; r < cur.nr; r++)
            l[i % 2][r] = amx_softmax_row(sb + r * kpad, pos[i * AMX_ROWS + r] + 1, cur.kfill, scale, &pump);
        amx_pump_run(&pump);
        prev = cur;
        cur = next;
    }
    amx_pump_load(&pump, NULL, NULL, 0, sbuf + (nb - 1) % 3 * bstride, l[(nb - 1) % 2], prev.nr,
                  dst + (int64_t)(nb - 1) * AMX_ROWS, prev.kfill, 0);
    amx_pump_run(&pump);
    _tile_release();
}

#endif
