/*
 * Paged prefill attention for the CPU (bf16, AVX-512-BF16): the queries of prompt
 * chunks attend causally over everything their request has cached, the chunk
 * itself included (its K/V are written to the pool first).
 *
 * Per (request, kv head, tile of query tokens) the G query heads of that kv head are
 * folded into the rows; per register block of rows, the scores of every visible key
 * go to a per-thread buffer, then one max and one exp pass per row, then P.V (no
 * online rescaling: 1.1-1.2x faster than flash-style tiles, whose per-tile
 * reductions and branches cost as much as the products on short prompts). Both
 * products run on the bf16 dot-product instruction with float32 accumulation, so
 * K and V are first repacked (phase 1) into the pair-interleaved ("VNNI") layout
 * it reads: K tile [D/2][KT] and V tile [KT/2][D] of bf16 pairs.
 * Probabilities are rounded to bf16 before P.V, as GPU flash attention does.
 *
 * Layouts: q [num_tokens, num_heads, D] with rows q_stride elements apart (a view into
 * the fused qkv output), out the same but contiguous; caches [num_blocks, block_size,
 * num_kv_heads, D]; per request r: block table row r, rows q_start[r] ..
 * q_start[r] + q_len[r] of q, and seq_len[r] tokens of context after this step.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_simd.h"
#include "decode_core.h"
#include "attn_f32.h"

/* keys per tile: with RB = 4 rows, 16 Q.K accumulators in flight (5-10% faster than 32) */
#define KT 64
#define KV (KT / 16) /* score vectors per tile and row */
#define MAX_ROWS 192 /* query rows (tokens x heads of a kv head) per work item */
#define MAX_D 256
#define RB_MAX 4     /* rows per register block, at most (attend_item) */

int paged_prefill_supported(int head_dim) {
#if defined(INFLIGHT_ISA_AVX512_BF16)
    return head_dim % 32 == 0 && head_dim <= MAX_D;
#else
    return head_dim > 0 && head_dim <= AF_MAX_D;  /* the portable path (prefill_bf16_widened) */
#endif
}

/* A chunk of at most this many query tokens goes through decode_core.h instead */
#define SHORT_Q 8

static inline int short_chunk(int64_t q_len, int G) { return q_len <= SHORT_Q && q_len * G <= DECODE_MAX_ROWS; }

/* Bytes of workspace the repacked K/V of these requests need (short chunks repack nothing;
 * without the bf16 dot product: every request's K/V widened to fp32, pf_widened_floats). */
static inline int64_t pf_widened_floats(int64_t seq_len, int num_kv_heads, int head_dim) {
    return (seq_len + KT - 1) / KT * KT * num_kv_heads * 2 * (int64_t)head_dim;
}

int64_t paged_prefill_workspace(const int64_t* seq_len, const int64_t* q_len, int num_reqs, int num_heads,
                                int num_kv_heads, int head_dim) {
#if !defined(INFLIGHT_ISA_AVX512_BF16)
    int64_t floats = 0;
    for (int r = 0; r < num_reqs; r++) floats += pf_widened_floats(seq_len[r], num_kv_heads, head_dim);
    (void)q_len, (void)num_heads;
    return floats * (int64_t)sizeof(float);
#endif
    int64_t tiles = 0;
    for (int r = 0; r < num_reqs; r++)
        if (!short_chunk(q_len[r], num_heads / num_kv_heads)) tiles += (seq_len[r] + KT - 1) / KT;
    return tiles * num_kv_heads * 2 * (int64_t)KT * head_dim * 2;
}

#if defined(INFLIGHT_ISA_AVX512_BF16)
/* Phase 1: one kv head's tile of KT keys into pair-interleaved K and V; keys past
 * the end are zero (a zero V row keeps 0 * garbage from making NaNs). */
static void repack_tile(const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* bt, int64_t len,
                        int64_t t0, int kh, int D, int block_size, int64_t tok_stride,
                        uint32_t* kp, uint32_t* vp) {
    const int half = D / 2;
    memset(kp, 0, sizeof(uint32_t) * half * KT);
    memset(vp, 0, sizeof(uint32_t) * (KT / 2) * D);
    for (int j = 0; j < KT && t0 + j < len; j++) {
        const int64_t t = t0 + j;
        const int64_t row = (bt[t / block_size] * block_size + t % block_size) * tok_stride + (int64_t)kh * D;
        const uint32_t* kr = (const uint32_t*)(k_cache + row);
        for (int dp = 0; dp < half; dp++) kp[dp * KT + j] = kr[dp];
        const uint16_t* vr = v_cache + row;
        uint16_t* vdst = (uint16_t*)(vp + (j / 2) * D) + (j & 1);
        for (int d = 0; d < D; d++) vdst[2 * d] = vr[d];
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
        const __m512 mm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax[r]));
        float* sr = sbuf + r * kpad;
        uint16_t* pr = (uint16_t*)sr;  /* written behind the read position */
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < kround; t += 16) {
            const __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(sr + t), mm));  /* masked keys: 0 */
            sum = _mm512_add_ps(sum, p);
            store_bf16x16(pr + t, p, 0xFFFF);
        }
        l[r] = _mm512_reduce_add_ps(sum);
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
 * position first_pos) x the G heads of kv head kh; scratch: qrows, pos, dst. */
static void prefill_item(const uint16_t* q, int64_t q_stride, uint16_t* out, int64_t q_start, int64_t first_pos,
                         int64_t i0, int64_t i1, int kh, int G, int num_heads, int D, const uint32_t* tiles, float scale,
                         uint32_t* qrows, int64_t* pos, uint16_t** dst, float* sbuf, int64_t kpad) {
    int nrows = 0;
    for (int64_t i = i0; i < i1; i++)
        for (int g = 0; g < G; g++, nrows++) {
            const int64_t head = ((int64_t)kh * G + g) * D;
            memcpy(qrows + (int64_t)nrows * (D / 2), q + (q_start + i) * q_stride + head, sizeof(uint16_t) * D);
            pos[nrows] = first_pos + i;
            dst[nrows] = out + (q_start + i) * num_heads * D + head;
        }
    attend_item(qrows, pos, nrows, tiles, D, scale, dst, sbuf, kpad);
}
#else
/* Every level without the bf16 dot product: attn_f32.h's flash-attention loop in fp32.
 * Phase 1 widens each request's K and V (per kv head, [seq_len rounded to KT][D] each,
 * pf_widened_floats) into the workspace; phase 2 runs af_attend over runs of query
 * tokens x the G heads of a kv head, with the q rows widened into, and the output
 * rounded to bf16 from, per-thread buffers. The widened K/V of a (request, kv head)
 * is one block of a pool whose block table is {0}. Probabilities stay fp32 (the
 * avx512_bf16 path rounds them to bf16 before P.V). */
static int prefill_bf16_widened(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache,
                                const uint16_t* v_cache, const int64_t* block_tables, int64_t bt_stride,
                                const int64_t* q_start, const int64_t* q_len, const int64_t* seq_len, uint16_t* out,
                                int num_reqs, int num_heads, int num_kv_heads, int D, int block_size, float scale,
                                float* ws) {
    const int G = num_heads / num_kv_heads;
    if (G * num_kv_heads != num_heads || G > AF_MAX_ROWS || !paged_prefill_supported(D)) return -1;
    const int64_t tok_stride = (int64_t)num_kv_heads * D;
    const int tq = AF_MAX_ROWS / G;  /* query tokens per work item */
    int64_t* base = (int64_t*)malloc(sizeof(int64_t) * (size_t)(num_reqs + 1));  /* floats before request r */
    int64_t n1 = 0, n2 = 0;
    base[0] = 0;
    for (int r = 0; r < num_reqs; r++) {
        base[r + 1] = base[r] + pf_widened_floats(seq_len[r], num_kv_heads, D);
        n1 += (seq_len[r] + KT - 1) / KT;
        n2 += (q_len[r] + tq - 1) / tq;
    }
    int64_t* items = (int64_t*)malloc(sizeof(int64_t) * 2 * (size_t)(n1 + n2 + 1));
    int64_t* it1 = items;
    int64_t* it2 = items + 2 * n1;
    for (int r = 0, k1 = 0, k2 = 0; r < num_reqs; r++) {
        for (int64_t t = 0; t < (seq_len[r] + KT - 1) / KT; t++, k1++) { it1[2 * k1] = r; it1[2 * k1 + 1] = t; }
        /* latest runs first: they see the most keys, so the ragged end balances */
        for (int64_t t = (q_len[r] + tq - 1) / tq - 1; t >= 0; t--, k2++) { it2[2 * k2] = r; it2[2 * k2 + 1] = t; }
    }
    const int64_t zero_table[1] = {0};
    #pragma omp parallel
    {
        #pragma omp for collapse(2) schedule(static)
        for (int64_t w = 0; w < n1; w++)
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const int r = (int)it1[2 * w];
                const int64_t lp = (seq_len[r] + KT - 1) / KT * KT, t0 = it1[2 * w + 1] * KT;
                const int64_t* bt = block_tables + (int64_t)r * bt_stride;
                float* kw = ws + base[r] + (int64_t)kh * 2 * lp * D;
                float* vw = kw + lp * D;
                for (int64_t t = t0; t < t0 + KT && t < seq_len[r]; t++) {
                    const int64_t row = (bt[t / block_size] * block_size + t % block_size) * tok_stride + (int64_t)kh * D;
                    for (int d = 0; d < D; d++) {
                        kw[t * D + d] = bf16_to_f32(k_cache[row + d]);
                        vw[t * D + d] = bf16_to_f32(v_cache[row + d]);
                    }
                }
            }
        float* scratch = (float*)malloc(sizeof(float) * (size_t)af_scratch_floats());
        float* qbuf = (float*)malloc(sizeof(float) * 2 * (size_t)AF_MAX_ROWS * D);  /* [tq][G][D], then out */
        float* obuf = qbuf + (int64_t)AF_MAX_ROWS * D;
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t w = 0; w < n2; w++)
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const int r = (int)it2[2 * w];
                const int64_t i0 = it2[2 * w + 1] * tq;
                const int ntok = (int)(i0 + tq < q_len[r] ? tq : q_len[r] - i0);
                const int64_t lp = (seq_len[r] + KT - 1) / KT * KT;
                const float* kw = ws + base[r] + (int64_t)kh * 2 * lp * D;
                for (int i = 0; i < ntok; i++)
                    for (int g = 0; g < G; g++) {
                        const uint16_t* src = q + (q_start[r] + i0 + i) * q_stride + (int64_t)(kh * G + g) * D;
                        float* dst = qbuf + ((int64_t)i * G + g) * D;
                        for (int d = 0; d < D; d++) dst[d] = bf16_to_f32(src[d]);
                    }
                /* kv head 0 of a one-head pool: q and out rows are [G][D], the pool [lp][D] */
                af_attend(qbuf, (int64_t)G * D, obuf, (int64_t)G * D, ntok, seq_len[r] - q_len[r] + i0, G, 0, 1, D,
                          kw, kw + lp * D, zero_table, (int)lp, D, scale, 0, scratch);
                for (int i = 0; i < ntok; i++)
                    for (int g = 0; g < G; g++) {
                        uint16_t* dst = out + (q_start[r] + i0 + i) * num_heads * D + (int64_t)(kh * G + g) * D;
                        const float* src = obuf + ((int64_t)i * G + g) * D;
                        for (int d = 0; d < D; d++) dst[d] = f32_to_bf16(src[d]);
                    }
            }
        free(scratch);
        free(qbuf);
    }
    free(items);
    free(base);
    return 0;
}
#endif

int paged_prefill_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,
                       const int64_t* seq_len, uint16_t* out, int num_reqs, int num_heads, int num_kv_heads,
                       int head_dim, int block_size, float scale, void* workspace) {
#if defined(INFLIGHT_ISA_AVX512_BF16)
    if (!paged_prefill_supported(head_dim)) return -1;
    const int D = head_dim, G = num_heads / num_kv_heads, half = D / 2;
    const int64_t tok_stride = (int64_t)num_kv_heads * D, tile_words = (int64_t)KT * half;
    const int tq = MAX_ROWS / G > 0 ? MAX_ROWS / G : 1;  /* query tokens per work item */
    if (G > MAX_ROWS) return -1;
    /* Work lists: phase 1 over (request, kv head, key tile), phase 2 over (request, kv head, query tile).
     * NOTE: a short chunk (speculative decoding's draft rows) skips phase 1: repacking its
     * whole context costs more than a decode-style pass over the cache in place. */
    int64_t n1 = 0, n2 = 0, short_lp = 0;
    int short_rows = 0;
    int64_t* tile_base = (int64_t*)malloc(sizeof(int64_t) * (num_reqs + 1));
    tile_base[0] = 0;
    for (int r = 0; r < num_reqs; r++) {
        const int is_short = short_chunk(q_len[r], G);
        tile_base[r + 1] = tile_base[r] + (is_short ? 0 : (seq_len[r] + KT - 1) / KT);
        n2 += (q_len[r] + tq - 1) / tq;
        if (is_short) {
            short_lp = seq_len[r] > short_lp ? seq_len[r] : short_lp;
            short_rows = q_len[r] * G > short_rows ? (int)q_len[r] * G : short_rows;
        }
    }
    short_lp = (short_lp + 31) & ~(int64_t)31;
    n1 = tile_base[num_reqs];
    int64_t kpad = 0;  /* score row length: the longest context, in whole key tiles */
    for (int r = 0; r < num_reqs; r++) kpad = seq_len[r] > kpad ? seq_len[r] : kpad;
    kpad = (kpad + KT - 1) / KT * KT;
    int64_t* items = (int64_t*)malloc(sizeof(int64_t) * 2 * (n1 + n2 + 1));
    int64_t* it1 = items;
    int64_t* it2 = items + 2 * n1;
    for (int r = 0, k1 = 0, k2 = 0; r < num_reqs; r++) {
        for (int64_t t = 0; t < tile_base[r + 1] - tile_base[r]; t++, k1++) { it1[2 * k1] = r; it1[2 * k1 + 1] = t; }
        for (int64_t t = 0; t < (q_len[r] + tq - 1) / tq; t++, k2++) { it2[2 * k2] = r; it2[2 * k2 + 1] = t; }
    }
    uint32_t* ws = (uint32_t*)workspace;
    #pragma omp parallel
    {
        #pragma omp for collapse(2) schedule(static)
        for (int64_t w = 0; w < n1; w++)
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const int r = (int)it1[2 * w];
                uint32_t* kp = head_tiles(ws, tile_base, r, kh, num_kv_heads, tile_words) + it1[2 * w + 1] * 2 * tile_words;
                repack_tile(k_cache, v_cache, block_tables + (int64_t)r * bt_stride, seq_len[r], it1[2 * w + 1] * KT,
                            kh, D, block_size, tok_stride, kp, kp + tile_words);
            }
        uint32_t* qrows = (uint32_t*)malloc(sizeof(uint32_t) * MAX_ROWS * half);
        int64_t* pos = (int64_t*)malloc(sizeof(int64_t) * MAX_ROWS);
        uint16_t** dst = (uint16_t**)malloc(sizeof(uint16_t*) * MAX_ROWS);
        float* sbuf = (float*)malloc(sizeof(float) * RB_MAX * kpad);
        float* short_sbuf = short_rows ? (float*)malloc(sizeof(float) * (size_t)short_rows * short_lp) : NULL;
        int64_t* short_offsets = short_rows ? (int64_t*)malloc(sizeof(int64_t) * short_lp) : NULL;
        #pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t w = 0; w < n2; w++)
            for (int kh = 0; kh < num_kv_heads; kh++) {
                const int r = (int)it2[2 * w];
                if (short_chunk(q_len[r], G)) {
                    decode_seq_avx512(q + q_start[r] * q_stride, q_stride, (int)q_len[r], k_cache, v_cache,
                                      block_tables + (int64_t)r * bt_stride, seq_len[r],
                                      out + q_start[r] * num_heads * D, (int64_t)num_heads * D, G, kh, kh + 1, D,
                                      block_size, tok_stride, scale, short_sbuf, short_offsets);
                    continue;
                }
                const int64_t i0 = it2[2 * w + 1] * tq;
                const int64_t i1 = i0 + tq < q_len[r] ? i0 + tq : q_len[r];
                prefill_item(q, q_stride, out, q_start[r], seq_len[r] - q_len[r], i0, i1, kh, G, num_heads, D,
                             head_tiles(ws, tile_base, r, kh, num_kv_heads, tile_words), scale, qrows, pos, dst,
                             sbuf, kpad);
            }
        free(qrows);
        free(pos);
        free(dst);
        free(sbuf);
        free(short_sbuf);
        free(short_offsets);
    }
    free(items);
    free(tile_base);
    return 0;
#else
    return prefill_bf16_widened(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len,
                                out, num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                                (float*)workspace);
#endif
}

/* float32 on every ISA level (attn_f32.h): flash-attention tiles over the block pool in
 * place, work items (request, kv head, run of query tokens) over OpenMP, the runs with the
 * most keys first. Same arguments as paged_prefill_bf16; the workspace is not used (may
 * be NULL). Returns 0, or -1 for a shape it does not take (paged_prefill_f32_supported). */
int paged_prefill_f32_supported(int head_dim, int group) {
    return head_dim > 0 && head_dim <= AF_MAX_D && group >= 1 && group <= AF_MAX_ROWS;
}

static int prefill_f32(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,
                       const int64_t* seq_len, float* out, int num_reqs, int num_heads, int num_kv_heads,
                       int head_dim, int block_size, float scale, int64_t window) {
    const int D = head_dim, G = num_heads / num_kv_heads;
    if (!paged_prefill_f32_supported(D, G) || G * num_kv_heads != num_heads || window < 0) return -1;
    const int64_t tok_stride = (int64_t)num_kv_heads * D;
    const int tq = AF_MAX_ROWS / G;  /* query tokens per work item */
    int64_t n = 0;
    for (int r = 0; r < num_reqs; r++) n += (q_len[r] + tq - 1) / tq;
    /* every kv head in one item (wide items then copy whole pool rows) when there are enough
     * runs to keep the threads busy; runs too short to be wide take a head each */
    const int all_heads = n >= 2 * omp_get_max_threads() && aw_heads_fit(num_kv_heads, D);
    int64_t* items = (int64_t*)malloc(sizeof(int64_t) * 4 * (size_t)(n * num_kv_heads + 1));
    int64_t k = 0;
    /* latest runs first: they see the most keys, so the ragged end balances */
    for (int r = 0; r < num_reqs; r++)
        for (int64_t t = (q_len[r] + tq - 1) / tq - 1; t >= 0; t--) {
            const int64_t ntok = q_len[r] - t * tq < tq ? q_len[r] - t * tq : tq;
            const int per = all_heads && ntok * G >= AW_MIN_ROWS ? num_kv_heads : 1;
            for (int kh = 0; kh < num_kv_heads; kh += per, k++) {
                items[4 * k] = r;
                items[4 * k + 1] = t;
                items[4 * k + 2] = kh;
                items[4 * k + 3] = per;
            }
        }
    #pragma omp parallel
    {
        float* scratch = (float*)malloc(sizeof(float) * (size_t)af_scratch_floats());
        #pragma omp for schedule(dynamic, 1)
        for (int64_t w = 0; w < k; w++) {
            const int r = (int)items[4 * w], kh0 = (int)items[4 * w + 2], nkh = (int)items[4 * w + 3];
            const int64_t i0 = items[4 * w + 1] * tq;
            const int64_t i1 = i0 + tq < q_len[r] ? i0 + tq : q_len[r];
            const int64_t row = q_start[r] + i0;
            af_attend(q + row * q_stride, q_stride, out + row * num_heads * D, (int64_t)num_heads * D,
                      (int)(i1 - i0), seq_len[r] - q_len[r] + i0, G, kh0, nkh, D, k_cache, v_cache,
                      block_tables + (int64_t)r * bt_stride, block_size, tok_stride, scale, window, scratch);
        }
        free(scratch);
    }
    free(items);
    return 0;
}

int paged_prefill_f32(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                      const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,
                      const int64_t* seq_len, float* out, int num_reqs, int num_heads, int num_kv_heads,
                      int head_dim, int block_size, float scale, void* workspace) {
    (void)workspace;
    return prefill_f32(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,
                       num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale, 0);
}

/* paged_prefill_f32 with a sliding window: the token at position p reads only keys
 * (p - window, p]; block table entries before them are never read. */
int paged_prefill_f32_sw(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                         const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,
                         const int64_t* seq_len, float* out, int num_reqs, int num_heads, int num_kv_heads,
                         int head_dim, int block_size, float scale, void* workspace, int window) {
    (void)workspace;
    return prefill_f32(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,
                       num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale, window);
}
