/* The AVX-512-BF16 core of paged decode attention, shared by the decode kernel and
 * the prefill kernel (which sends it chunks of a few query tokens: speculative
 * decoding's draft rows). K and V are read in place from the block pool.
 *
 * Layouts: q rows q_stride elements apart, heads of head_dim inside a row; out rows
 * out_stride apart; caches [num_blocks, block_size, num_kv_heads, head_dim].
 */
#ifndef INFLIGHT_DECODE_CORE_H
#define INFLIGHT_DECODE_CORE_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"

#define DECODE_MAX_D 256
/* query rows (tokens x query heads of one kv head) one pass keeps state for */
#define DECODE_MAX_ROWS 32

#if defined(INFLIGHT_ISA_AVX512_BF16)
#include "decode_prefetch.h"

#define CHUNK 16
/* K and V rows are prefetched this many tokens ahead: blocks lie at random places
 * in the pool, where the hardware prefetcher loses the stream (faster on contexts
 * in DRAM; nearer gained nothing, farther gained less) */
#define AHEAD 32

/* Sixteen dot-product accumulators -> one vector of their sums, lane j = sum(a[j]):
 * a transpose-and-add tree, 45 ops instead of 16 horizontal reductions. */
static inline __m512 reduce16(__m512 a[16]) {
    __m512 b[8], c[4], e[2];
    for (int p = 0; p < 8; p++)
        b[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]), _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]));
    for (int p = 0; p < 4; p++) {
        const __m512d x = _mm512_castps_pd(b[2 * p]), y = _mm512_castps_pd(b[2 * p + 1]);
        c[p] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int p = 0; p < 2; p++)
        e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Q.K of one query head against CHUNK cached rows, unscaled: lane j = q . k[rows[j]].
 * K rows are read in place; the sixteen dot products are summed by reduce16. */
static inline __attribute__((always_inline)) __m512 qk_chunk(const int nv, const __m512bh* qv,
                                                           const uint16_t* kbase, const int64_t* rows) {
    __m512 a[CHUNK];
    for (int j = 0; j < CHUNK; j++) {
        a[j] = _mm512_setzero_ps();
        for (int i = 0; i < nv; i++)
            a[j] = _mm512_dpbf16_ps(a[j], qv[i], (__m512bh)_mm512_loadu_si512(kbase + rows[j] + 32 * i));
    }
    return reduce16(a);
}

#define PV_REGS 16  /* accumulators a P.V group keeps in registers */

/* out[g] = sum_t p[g][t] v[t] for GB query heads sharing one kv head, over token
 * pairs: the bf16 dot-product instruction multiplies a pair of probabilities by
 * a pair of V rows interleaved (unpacklo/hi), accumulating in float32. */
static inline __attribute__((always_inline)) void pv_group(const int nv, const int GB, const uint16_t* vbase,
                                                         const int64_t* rows, int64_t len,
                                                         const uint16_t* const* p, __m512* out) {
    /* NOTE: a local array of constant size, copied out at the end: accumulating
     * through the caller's pointer kept them in memory for four heads (GCC 12) */
    __m512 acc[PV_REGS];
    for (int x = 0; x < GB * 2 * nv; x++) acc[x] = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 2) {
        const int pair = t + 1 < len;
        if (t + AHEAD + 1 < len)
            for (int i = 0; i < nv; i++) {
                _mm_prefetch((const char*)(vbase + rows[t + AHEAD] + 32 * i), _MM_HINT_T0);
                _mm_prefetch((const char*)(vbase + rows[t + AHEAD + 1] + 32 * i), _MM_HINT_T0);
            }
        __m512i lo[DECODE_MAX_D / 32], hi[DECODE_MAX_D / 32];
        for (int i = 0; i < nv; i++) {
            const __m512i x = _mm512_loadu_si512(vbase + rows[t] + 32 * i);
            const __m512i y = pair ? _mm512_loadu_si512(vbase + rows[t + 1] + 32 * i) : _mm512_setzero_si512();
            lo[i] = _mm512_unpacklo_epi16(x, y);
            hi[i] = _mm512_unpackhi_epi16(x, y);
        }
        for (int g = 0; g < GB; g++) {
            /* p rows are padded with zeros, so the pair load never mixes in garbage */
            int32_t pair_p;
            memcpy(&pair_p, p[g] + t, sizeof pair_p);
            const __m512bh pb = (__m512bh)_mm512_set1_epi32(pair_p);
            for (int i = 0; i < nv; i++) {
                acc[(g * nv + i) * 2] = _mm512_dpbf16_ps(acc[(g * nv + i) * 2], pb, (__m512bh)lo[i]);
                acc[(g * nv + i) * 2 + 1] = _mm512_dpbf16_ps(acc[(g * nv + i) * 2 + 1], pb, (__m512bh)hi[i]);
            }
        }
    }
    for (int x = 0; x < GB * 2 * nv; x++) out[x] = acc[x];
}

/* unpacklo/hi interleave within 128-bit lanes: lane 4k+r of the lo accumulator of
 * dims 32i.. holds dim 32i+8k+r, of the hi one dim 32i+8k+4+r; two lane permutes
 * put the dims back in order. The head's output over its sum l goes to op as bf16, or
 * with part (decode_scratch) unnormalized in float32, then the row's max mx and l. */
static inline void store_head(const __m512* acc, int nv, float mx, float l, uint16_t* op, float* part) {
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    const __m512 vinv = _mm512_set1_ps(1.f / l);
    for (int i = 0; i < nv; i++) {
        const __m512 a = _mm512_permutex2var_ps(acc[2 * i], first, acc[2 * i + 1]);
        const __m512 b = _mm512_permutex2var_ps(acc[2 * i], second, acc[2 * i + 1]);
        if (part) {
            _mm512_storeu_ps(part + 32 * i, a);
            _mm512_storeu_ps(part + 32 * i + 16, b);
        } else {
            store_bf16x16(op + 32 * i, _mm512_mul_ps(a, vinv), 0xFFFF);
            store_bf16x16(op + 32 * i + 16, _mm512_mul_ps(b, vinv), 0xFFFF);
        }
    }
    if (part) {
        part[32 * nv] = mx;
        part[32 * nv + 1] = l;
    }
}

/* A thread's scratch for decode_seq_avx512: sbuf, G * ql rows of the padded length; rows,
 * that many cache offsets; next, the sequence to prefetch during the score and exp passes (used
 * when has_next); prefetched: this sequence's blocks were asked for while the previous
 * one ran, so it skips warm_blocks. part: the keys are a part of the row's, so each query
 * head's unnormalized output, max and sum go to part + token * part_row + head * (head_dim + 2)
 * in float32 instead of out (decode_f32.h's state layout, merged by dk_merge). all_keys: every
 * query token sees all len keys (the rows are other requests' tokens over their shared prefix),
 * not the causal run within the chunk. */
struct decode_scratch {
    float* sbuf;
    int64_t* rows;
    struct pf_cursor next;
    int has_next, prefetched;
    float* part;
    int64_t part_row;
    int all_keys;
};

/* A score row sc (keys [0, lr) visible, scaled, max mxv) to probabilities as bf16 (rounded,
 * as flash attention does), written over the front of the same row and zero up to the padded
 * length lp; returns their sum. next (NULL: none) gets per_chunk lines prefetched a step. */
static inline float probs_row(float* sc, int64_t lr, int64_t lp, float mxv, struct pf_cursor* next, int per_chunk) {
    const __m512 log2e = _mm512_set1_ps(LOG2E_F);  /* e^(s - m) = 2^(s log2 e - m log2 e) */
    const __m512 mx = _mm512_set1_ps(mxv * LOG2E_F);
    __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;  /* two: one chains each step on an add */
    uint16_t* pb = (uint16_t*)sc;
    for (int64_t t0 = 0; t0 < lp; t0 += 32) {
        if (next) pf_advance(next, per_chunk);
        const __mmask16 m0 = t0 < lr ? tail_mask(lr - t0) : 0, m1 = t0 + 16 < lr ? tail_mask(lr - t0 - 16) : 0;
        const __m512 p0 = _mm512_maskz_mov_ps(
            m0, exp2_for_bf16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m0, sc + t0), log2e, mx)));
        const __m512 p1 = _mm512_maskz_mov_ps(
            m1, exp2_for_bf16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m1, sc + t0 + 16), log2e, mx)));
        sum0 = _mm512_add_ps(sum0, p0);
        sum1 = _mm512_add_ps(sum1, p1);
        store_bf16x16(pb + t0, p0, 0xFFFF);
        store_bf16x16(pb + t0 + 16, p1, 0xFFFF);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* The block by block cache offsets of a sequence's len keys (rows[t]: key t's row in the
 * pool), zero from len up to the padded length lp */
static inline void key_rows(int64_t* rows, const int64_t* bt, int64_t len, int64_t lp, int block_size,
                            int64_t tok_stride) {
    for (int64_t b = 0, t = 0; t < len; b++)  /* block by block: no division per token */
        for (int64_t j = 0, r = bt[b] * block_size * tok_stride; j < block_size && t < len; j++, t++)
            rows[t] = r + j * tok_stride;
    for (int64_t t = len; t < lp; t++) rows[t] = 0;
}

/* One request, kv heads [kh0, kh1), in three passes per kv head over its query rows
 * (ql query tokens x the G query heads of the kv head; token i sees the first
 * len - (ql - 1 - i) cached tokens: causal within the chunk): the scores into a
 * per-thread buffer, then exp (one max per row, no online rescaling) to bf16
 * probabilities, then P.V. Each kv head's K and V rows are distinct cache lines, so
 * the passes read each cached byte once from DRAM. Needs G * ql <= DECODE_MAX_ROWS. */
static inline __attribute__((always_inline)) void decode_seq_nv(
        const int nv, const uint16_t* q, int64_t q_stride, int ql, const uint16_t* k_cache, const uint16_t* v_cache,
        const int64_t* bt, int64_t len, uint16_t* out, int64_t out_stride, int G, int kh0, int kh1, int block_size,
        int64_t tok_stride, float scale, struct decode_scratch* ws) {
    const int head_dim = 32 * nv, nr = G * ql;
    float* sbuf = ws->sbuf;
    int64_t* rows = ws->rows;
    struct pf_cursor* next = ws->has_next ? &ws->next : NULL;
    const int64_t lp = (len + 31) & ~(int64_t)31;  /* padded score row */
    key_rows(rows, bt, len, lp, block_size, tok_stride);
    if (!ws->prefetched && kh0 == 0 && (int64_t)kh1 * head_dim == tok_stride
        && len * tok_stride * 4 <= WARM_MAX_BYTES)
        warm_blocks(k_cache, v_cache, bt, (len + block_size - 1) / block_size, block_size * tok_stride);
    const __m512 vscale = _mm512_set1_ps(scale);
    /* lines of next to prefetch per chunk of the score and exp passes, so that they are all
     * asked for by the end of the last one */
    const int64_t chunks = (kh1 - kh0) * (int64_t)nr * ((len + CHUNK - 1) / CHUNK + (len + 31) / 32);
    const int per_chunk = next && chunks ? (int)((next->nblk * next->blk_bytes / 64 + chunks - 1) / chunks) : 0;
    for (int kh = kh0; kh < kh1; kh++) {
        const uint16_t* kbase = k_cache + (int64_t)kh * head_dim;
        const uint16_t* vbase = v_cache + (int64_t)kh * head_dim;
        float l[DECODE_MAX_ROWS], mxs[DECODE_MAX_ROWS];
        for (int r = 0; r < nr; r++) {
            const int i = r / G, g = r % G;
            const int64_t lr = ws->all_keys ? len : len - (ql - 1 - i);  /* keys this row sees */
            const uint16_t* qp = q + i * q_stride + (int64_t)(kh * G + g) * head_dim;
            __m512bh qv[DECODE_MAX_D / 32];
            for (int v = 0; v < nv; v++) qv[v] = (__m512bh)_mm512_loadu_si512(qp + 32 * v);
            float* sc = sbuf + (int64_t)r * lp;
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (int64_t t0 = 0; t0 < lr; t0 += CHUNK) {
                if (r == 0)  /* the first row's pass reads K from DRAM; later ones hit L2 */
                    for (int64_t t = t0 + AHEAD; t < t0 + AHEAD + CHUNK && t < len; t++)
                        for (int v = 0; v < nv; v++) _mm_prefetch((const char*)(kbase + rows[t] + 32 * v), _MM_HINT_T0);
                if (per_chunk) pf_advance(next, per_chunk);
                const __mmask16 m = tail_mask(lr - t0);
                const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), m,
                                                    _mm512_mul_ps(qk_chunk(nv, qv, kbase, rows + t0), vscale));
                vmax = _mm512_max_ps(vmax, s);
                _mm512_storeu_ps(sc + t0, s);
            }
            mxs[r] = _mm512_reduce_max_ps(vmax);
            l[r] = probs_row(sc, lr, lp, mxs[r], per_chunk ? next : NULL, per_chunk);
        }
        const int gb = PV_REGS / (2 * nv) > 0 ? PV_REGS / (2 * nv) : 1;
        for (int r0 = 0; r0 < nr; r0 += gb) {
            const uint16_t* p[DECODE_MAX_ROWS];
            const int n = nr - r0 < gb ? nr - r0 : gb;
            for (int r = 0; r < n; r++) p[r] = (const uint16_t*)(sbuf + (int64_t)(r0 + r) * lp);
            __m512 acc[PV_REGS];
            /* constant group sizes keep the accumulators in registers */
            if (n == 4) pv_group(nv, 4, vbase, rows, len, p, acc);
            else if (n == 3) pv_group(nv, 3, vbase, rows, len, p, acc);
            else if (n == 2) pv_group(nv, 2, vbase, rows, len, p, acc);
            else for (int r = 0; r < n; r++) pv_group(nv, 1, vbase, rows, len, p + r, acc + r * 2 * nv);
            for (int r = 0; r < n; r++) {
                const int i = (r0 + r) / G, g = (r0 + r) % G;
                store_head(acc + r * 2 * nv, nv, mxs[r0 + r], l[r0 + r],
                           out + i * out_stride + (int64_t)(kh * G + g) * head_dim,
                           ws->part ? ws->part + i * ws->part_row + (int64_t)(kh * G + g) * (head_dim + 2) : NULL);
            }
        }
    }
}

/* decode_seq_nv with head_dim as a constant where it is common, so the compiler
 * unrolls and keeps accumulators in registers. */
static void decode_seq_avx512(const uint16_t* q, int64_t q_stride, int ql, const uint16_t* k_cache,
                              const uint16_t* v_cache, const int64_t* bt, int64_t len, uint16_t* out,
                              int64_t out_stride, int G, int kh0, int kh1, int head_dim, int block_size,
                              int64_t tok_stride, float scale, struct decode_scratch* ws) {
    const int nv = head_dim / 32;
#define DECODE_SEQ(NV) decode_seq_nv(NV, q, q_stride, ql, k_cache, v_cache, bt, len, out, out_stride, G, kh0, kh1, \
                                     block_size, tok_stride, scale, ws)
    if (nv == 2) DECODE_SEQ(2);
    else if (nv == 4) DECODE_SEQ(4);
    else DECODE_SEQ(nv);
#undef DECODE_SEQ
}
#endif
#endif
