/*
 * Paged bf16 prefill at the avx512_bf16 level (paged_prefill.c): phase 1 repacks K and V
 * into pair-interleaved tiles, phase 2 attends a register block of rows at a time on
 * the bf16 dot-product instruction. Included by paged_prefill.c only, after its
 * constants (KT, KV, MAX_ROWS, MAX_D, RB_MAX) and short_chunk.
 */
#ifndef INFLIGHT_PREFILL_BF16_DP_H
#define INFLIGHT_PREFILL_BF16_DP_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_simd.h"
#include "decode_core.h"

/* the rows' attention in prefill_item, and the score rows of scratch each thread keeps
 * for it: prefill_bf16_amx.h sets both to its own before including this header */
#ifndef PF_ATTEND
#define PF_ATTEND attend_item
#define PF_SBUF_ROWS RB_MAX
#endif

/* Phase 1: one kv head's tile of KT keys into pair-interleaved K ([D / 2][KT] bf16 pairs:
 * 16 x 16 transposes) and V ([KT / 2][D] pairs of two keys' values); keys past the end
 * are zero (a zero V row keeps 0 * garbage from making NaNs). */
static void repack_tile(const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* bt, int64_t len,
                        int64_t t0, int kh, int D, int block_size, int64_t tok_stride,
                        uint32_t* kp, uint32_t* vp) {
    const int half = D / 2;
    int64_t off[KT];  /* each key's row in k_cache and v_cache; -1: past the end */
    for (int j = 0; j < KT; j++) {
        const int64_t t = t0 + j;
        off[j] = t < len ? (bt[t / block_size] * block_size + t % block_size) * tok_stride + (int64_t)kh * D : -1;
    }
    for (int j0 = 0; j0 < KT; j0 += 16)
        for (int d0 = 0; d0 < half; d0 += 16) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = off[j0 + j] >= 0 ? _mm512_loadu_si512(k_cache + off[j0 + j] + 2 * d0) : _mm512_setzero_si512();
            transpose16_epi32(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(kp + (int64_t)(d0 + i) * KT + j0, r[i]);
        }
    for (int j = 0; j < KT; j += 2)
        for (int d0 = 0; d0 < D; d0 += 32) {
            const __m512i a = off[j] >= 0 ? _mm512_loadu_si512(v_cache + off[j] + d0) : _mm512_setzero_si512();
            const __m512i b = off[j + 1] >= 0 ? _mm512_loadu_si512(v_cache + off[j + 1] + d0) : _mm512_setzero_si512();
            __m512i lo, hi;
            pair_rows_epi16(a, b, &lo, &hi);
            _mm512_storeu_si512(vp + (int64_t)(j / 2) * D + d0, lo);
            _mm512_storeu_si512(vp + (int64_t)(j / 2) * D + d0 + 16, hi);
        }
}

/* Request r's repacked tiles for kv head kh: workspace is [request][kv head][tile][K, V]. */
static inline uint32_t* head_tiles(uint32_t* ws, const int64_t* tile_base, int r, int kh, int num_kv_heads,
                                   int64_t tile_words) {
    const int64_t ntiles = tile_base[r + 1] - tile_base[r];
    return ws + (tile_base[r] * num_kv_heads + (int64_t)kh * ntiles) * 2 * tile_words;
}

/* Phase 2, one register block: rows [0, nr) (nr <= RB) of (token, head) pairs
 * against every key up to the last row's position, in three passes as the decode
 * kernel does: scores into the row's stretch of sbuf (kpad floats a row), one max
 * and one exp pass per row (bf16 probabilities written over the front of the same
 * row), then P.V with the RB x NF output accumulators in registers and no online
 * rescaling. pos[r] is row r's position (it sees keys 0..pos[r]); rows come in
 * position order. Writes the normalized rows to dst[r]. */
static inline __attribute__((always_inline)) void attend_block(
        const int NF, const int RB, const uint32_t* qrows, const int64_t* pos, int nr,
        const uint32_t* ktiles, float scale, uint16_t* const* dst, float* sbuf, int64_t kpad) {
    const int half = NF * 8;                        /* D / 2 */
    const int64_t tile_words = (int64_t)KT * half;  /* == (KT / 2) * D */
    const int64_t kend = pos[nr - 1] + 1, kround = (kend + KT - 1) / KT * KT;
    const __m512 ninf = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
    /* NOTE: arrays of constant size: sized by RB or NF (VLAs) they lived on the stack,
     * and the P.V accumulators went through memory on every product (GCC 12; 1.4x) */
    __m512 vmax[RB_MAX];
    for (int r = 0; r < RB; r++) vmax[r] = ninf;
    for (int64_t t0 = 0; t0 < kend; t0 += KT) {
        const uint32_t* kp = ktiles + (t0 / KT) * 2 * tile_words;
        __m512 s[RB_MAX][KV];
        for (int r = 0; r < RB; r++)
            for (int c = 0; c < KV; c++) s[r][c] = _mm512_setzero_ps();
        for (int dp = 0; dp < half; dp++) {
            __m512bh k[KV];
            for (int c = 0; c < KV; c++) k[c] = (__m512bh)_mm512_loadu_si512(kp + dp * KT + 16 * c);
            for (int r = 0; r < RB; r++) {
                const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qrows[(int64_t)(r < nr ? r : 0) * half + dp]);
                for (int c = 0; c < KV; c++) s[r][c] = _mm512_dpbf16_ps(s[r][c], qb, k[c]);
            }
        }
        for (int r = 0; r < RB; r++) {
            if (r >= nr) break;
            const int64_t lim = pos[r] - t0 + 1;  /* keys t0 .. pos visible */
            for (int c = 0; c < KV; c++) {
                const int64_t lc = lim - 16 * c;
                const __mmask16 m = lc >= 16 ? 0xFFFF : (lc <= 0 ? 0 : (__mmask16)((1u << lc) - 1));
                const __m512 a = _mm512_mask_mul_ps(ninf, m, s[r][c], sc);
                vmax[r] = _mm512_max_ps(vmax[r], a);
                _mm512_storeu_ps(sbuf + r * kpad + t0 + 16 * c, a);
            }
        }
    }
    float l[RB_MAX];
    for (int r = 0; r < nr; r++) {
        const __m512 log2e = _mm512_set1_ps(LOG2E_F);  /* e^(a - m) = 2^(a log2 e - m log2 e) */
        const __m512 mm = _mm512_mul_ps(_mm512_set1_ps(_mm512_reduce_max_ps(vmax[r])), log2e);
        float* sr = sbuf + r * kpad;
        uint16_t* pr = (uint16_t*)sr;  /* written behind the read position */
        __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;  /* two: one chains each step on an add */
        for (int64_t t = 0; t < kround; t += 32) {  /* masked keys (-inf): 0 */
            const __m512 p0 = exp2_for_bf16(_mm512_fmsub_ps(_mm512_loadu_ps(sr + t), log2e, mm));
            const __m512 p1 = exp2_for_bf16(_mm512_fmsub_ps(_mm512_loadu_ps(sr + t + 16), log2e, mm));
            sum0 = _mm512_add_ps(sum0, p0);
            sum1 = _mm512_add_ps(sum1, p1);
            store_bf16x16(pr + t, p0, 0xFFFF);
            store_bf16x16(pr + t + 16, p1, 0xFFFF);
        }
        l[r] = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
    }
    __m512 acc[RB_MAX][MAX_D / 16];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NF; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < kend; t0 += KT) {
        const uint32_t* vp = ktiles + (t0 / KT) * 2 * tile_words + tile_words;
        for (int jp = 0; jp < KT / 2; jp++) {
            __m512bh v[MAX_D / 16];
            for (int i = 0; i < NF; i++) v[i] = (__m512bh)_mm512_loadu_si512(vp + jp * 2 * half + 16 * i);
            for (int r = 0; r < RB; r++) {
                const uint32_t* pr = (const uint32_t*)(sbuf + (r < nr ? r : 0) * kpad);
                const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pr[t0 / 2 + jp]);
                for (int i = 0; i < NF; i++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], p, v[i]);
            }
        }
    }
    for (int r = 0; r < nr; r++) {
        const __m512 inv = _mm512_set1_ps(1.f / l[r]);
        for (int i = 0; i < NF; i++)
            store_bf16x16(dst[r] + 16 * i, _mm512_mul_ps(acc[r][i], inv), 0xFFFF);
    }
}

/* Phase 2 over an item's rows, a register block at a time; head dims with a
 * specialized block keep its accumulators in registers. */
static void attend_item(const uint32_t* qrows, const int64_t* pos, int nrows, const uint32_t* ktiles, int D,
                        float scale, uint16_t* const* dst, float* sbuf, int64_t kpad) {
    const int half = D / 2;
#define BLOCKS(NF, RB)                                                                                 \
    for (int r0 = 0; r0 < nrows; r0 += RB)                                                           \
        attend_block(NF, RB, qrows + (int64_t)r0 * half, pos + r0, nrows - r0 < RB ? nrows - r0 : RB, \
                     ktiles, scale, dst + r0, sbuf, kpad);
    switch (D) {  /* every multiple of 32 up to MAX_D (paged_prefill_supported) */
    case 32: BLOCKS(2, 4) break;
    case 64: BLOCKS(4, 4) break;
    case 96: BLOCKS(6, 2) break;
    case 128: BLOCKS(8, 2) break;
    case 160: BLOCKS(10, 1) break;
    case 192: BLOCKS(12, 1) break;
    case 224: BLOCKS(14, 1) break;
    default: BLOCKS(16, 1) break;
    }
#undef BLOCKS
}

/* Phase 2 for one work item: query tokens [i0, i1) of a request (starting at
 * position first_pos) x the G heads of kv head kh; scratch: qrows, pos, dst. With
 * seen >= 0 (not causal) every row sees keys 0 .. seen instead of those up to its position. */
static void prefill_item(const uint16_t* q, int64_t q_stride, uint16_t* out, int64_t q_start, int64_t first_pos,
                         int64_t seen, int64_t i0, int64_t i1, int kh, int G, int num_heads, int D,
                         const uint32_t* tiles, float scale, uint32_t* qrows, int64_t* pos, uint16_t** dst,
                         float* sbuf, int64_t kpad) {
    int nrows = 0;
    for (int64_t i = i0; i < i1; i++)
        for (int g = 0; g < G; g++, nrows++) {
            const int64_t head = ((int64_t)kh * G + g) * D;
            memcpy(qrows + (int64_t)nrows * (D / 2), q + (q_start + i) * q_stride + head, sizeof(uint16_t) * D);
            pos[nrows] = seen >= 0 ? seen : first_pos + i;
            dst[nrows] = out + (q_start + i) * num_heads * D + head;
        }
    PF_ATTEND(qrows, pos, nrows, tiles, D, scale, dst, sbuf, kpad);
}

/* One call's work lists. Phase 1 goes over (request, key tile) x kv head, phase 2 over
 * (request, query tile) x kv head; tile_base[r] counts the repacked tiles before request r.
 * NOTE: a short chunk (speculative decoding's draft rows) repacks nothing: repacking its
 * whole context costs more than a decode-style pass over the cache in place. */
struct pf_work {
    int64_t n1, n2, kpad, short_lp;  /* kpad: the score rows' stride (the longest context in whole key
                                      * tiles and 16 floats more: a stride of a multiple of 4 KiB
                                      * would put every row of a tile store in one L1 set) */
    int short_rows, tq;              /* tq: query tokens per phase-2 item */
    int64_t *tile_base, *it1, *it2;  /* it1, it2: (request, tile) pairs */
};

static void pf_plan(struct pf_work* w, const int64_t* q_len, const int64_t* seq_len, int num_reqs, int G,
                    int causal) {
    memset(w, 0, sizeof *w);
    w->tq = MAX_ROWS / G > 0 ? MAX_ROWS / G : 1;
    w->tile_base = (int64_t*)malloc(sizeof(int64_t) * (num_reqs + 1));
    w->tile_base[0] = 0;
    for (int r = 0; r < num_reqs; r++) {
        const int is_short = causal && short_chunk(q_len[r], G);
        w->tile_base[r + 1] = w->tile_base[r] + (is_short ? 0 : (seq_len[r] + KT - 1) / KT);
        w->n2 += (q_len[r] + w->tq - 1) / w->tq;
        if (is_short) {
            w->short_lp = seq_len[r] > w->short_lp ? seq_len[r] : w->short_lp;
            w->short_rows = q_len[r] * G > w->short_rows ? (int)q_len[r] * G : w->short_rows;
        }
        w->kpad = seq_len[r] > w->kpad ? seq_len[r] : w->kpad;
    }
    w->short_lp = (w->short_lp + 31) & ~(int64_t)31;
    w->kpad = (w->kpad + KT - 1) / KT * KT + 16;
    w->n1 = w->tile_base[num_reqs];
    w->it1 = (int64_t*)malloc(sizeof(int64_t) * 2 * (w->n1 + w->n2 + 1));
    w->it2 = w->it1 + 2 * w->n1;
    for (int r = 0, k1 = 0, k2 = 0; r < num_reqs; r++) {
        for (int64_t t = 0; t < w->tile_base[r + 1] - w->tile_base[r]; t++, k1++) {
            w->it1[2 * k1] = r;
            w->it1[2 * k1 + 1] = t;
        }
        for (int64_t t = 0; t < (q_len[r] + w->tq - 1) / w->tq; t++, k2++) {
            w->it2[2 * k2] = r;
            w->it2[2 * k2 + 1] = t;
        }
    }
}

/* paged_prefill_bf16 at the avx512_bf16 level: phase 1 repacks every long chunk's context
 * into the workspace, phase 2 attends (short causal chunks through decode_core.h instead).
 * The cache's tokens are tok_stride elements apart; causal 0: every row sees every key. */
static int prefill_bf16_dp(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                           const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start,
                           const int64_t* q_len, const int64_t* seq_len, uint16_t* out, int num_reqs, int num_heads,
                           int num_kv_heads, int D, int block_size, int64_t tok_stride, float scale, int causal,
                           uint32_t* ws) {
    const int G = num_heads / num_kv_heads, half = D / 2;
    if (!paged_prefill_supported(D) || G > MAX_ROWS) return -1;
    const int64_t tile_words = (int64_t)KT * half;
    struct pf_work w;
    pf_plan(&w, q_len, seq_len, num_reqs, G, causal);
    #pragma omp parallel
    {
        #pragma omp for collapse(2) schedule(static)
        for (int64_t i = 0; i < w.n1; i++)
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const int r = (int)w.it1[2 * i];
                uint32_t* kp = head_tiles(ws, w.tile_base, r, kh, num_kv_heads, tile_words)
                               + w.it1[2 * i + 1] * 2 * tile_words;
                repack_tile(k_cache, v_cache, block_tables + (int64_t)r * bt_stride, seq_len[r], w.it1[2 * i + 1] * KT,
                            kh, D, block_size, tok_stride, kp, kp + tile_words);
            }
        uint32_t* qrows = (uint32_t*)malloc(sizeof(uint32_t) * MAX_ROWS * half);
        int64_t* pos = (int64_t*)malloc(sizeof(int64_t) * MAX_ROWS);
        uint16_t** dst = (uint16_t**)malloc(sizeof(uint16_t*) * MAX_ROWS);
        float* sbuf = (float*)malloc(sizeof(float) * PF_SBUF_ROWS * w.kpad);
        float* short_sbuf = w.short_rows ? (float*)malloc(sizeof(float) * (size_t)w.short_rows * w.short_lp) : NULL;
        int64_t* short_offsets = w.short_rows ? (int64_t*)malloc(sizeof(int64_t) * w.short_lp) : NULL;
        struct decode_scratch short_ws = {short_sbuf, short_offsets, {0}, 0, 0, NULL};
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t i = 0; i < w.n2; i++)
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const int r = (int)w.it2[2 * i];
                if (causal && short_chunk(q_len[r], G)) {
                    decode_seq_avx512(q + q_start[r] * q_stride, q_stride, (int)q_len[r], k_cache, v_cache,
                                      block_tables + (int64_t)r * bt_stride, seq_len[r],
                                      out + q_start[r] * num_heads * D, (int64_t)num_heads * D, G, kh, kh + 1, D,
                                      block_size, tok_stride, scale, &short_ws);
                    continue;
                }
                const int64_t i0 = w.it2[2 * i + 1] * w.tq;
                const int64_t i1 = i0 + w.tq < q_len[r] ? i0 + w.tq : q_len[r];
                prefill_item(q, q_stride, out, q_start[r], seq_len[r] - q_len[r], causal ? -1 : seq_len[r] - 1,
                             i0, i1, kh, G, num_heads, D,
                             head_tiles(ws, w.tile_base, r, kh, num_kv_heads, tile_words), scale, qrows, pos, dst,
                             sbuf, w.kpad);
            }
        free(qrows);
        free(pos);
        free(dst);
        free(sbuf);
        free(short_sbuf);
        free(short_offsets);
    }
    free(w.it1);
    free(w.tile_base);
    return 0;
}

#endif
