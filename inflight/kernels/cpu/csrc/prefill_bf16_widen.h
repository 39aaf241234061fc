/*
 * Paged bf16 prefill at every level without the bf16 dot product (paged_prefill.c),
 * through attn_f32.h in fp32. Included by paged_prefill.c only, after its constants
 * and pf_widened_floats.
 */
#ifndef INFLIGHT_PREFILL_BF16_WIDEN_H
#define INFLIGHT_PREFILL_BF16_WIDEN_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_f32.h"
#include "bf16_simd.h"

/* Phase 1: keys [t0, t0 + KT) (those below len) of kv head kh widened into kw and vw,
 * [lp][D] each. */
static void widen_tile(const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* bt, int64_t len, int64_t t0,
                       int kh, int D, int block_size, int64_t tok_stride, float* kw, float* vw) {
    for (int64_t t = t0; t < t0 + KT && t < len; t++) {
        const int64_t row = (bt[t / block_size] * block_size + t % block_size) * tok_stride + (int64_t)kh * D;
        for (int d = 0; d < D; d++) {
            kw[t * D + d] = bf16_to_f32(k_cache[row + d]);
            vw[t * D + d] = bf16_to_f32(v_cache[row + d]);
        }
    }
}

/* Phase 2's q rows: ntok tokens (rows stride apart) x the G heads of kv head kh into
 * buf [ntok][G][D] */
static void widen_heads(const uint16_t* rows, int64_t stride, int ntok, int G, int kh, int D, float* buf) {
    for (int i = 0; i < ntok; i++)
        for (int g = 0; g < G; g++) {
            const uint16_t* src = rows + i * stride + (int64_t)(kh * G + g) * D;
            float* dst = buf + ((int64_t)i * G + g) * D;
            for (int d = 0; d < D; d++) dst[d] = bf16_to_f32(src[d]);
        }
}

/* and its output back: buf [ntok][G][D] rounded into those heads of rows stride apart */
static void round_heads(const float* buf, int ntok, int G, int kh, int D, uint16_t* rows, int64_t stride) {
    for (int i = 0; i < ntok; i++)
        for (int g = 0; g < G; g++) {
            uint16_t* dst = rows + i * stride + (int64_t)(kh * G + g) * D;
            const float* src = buf + ((int64_t)i * G + g) * D;
            for (int d = 0; d < D; d++) dst[d] = f32_to_bf16(src[d]);
        }
}

/* Every level without the bf16 dot product: attn_f32.h's flash-attention loop in fp32.
 * Phase 1 widens each request's K and V (per kv head, [seq_len rounded to KT][D] each,
 * pf_widened_floats) into the workspace; phase 2 runs af_attend over runs of query
 * tokens x the G heads of a kv head, with the q rows widened into, and the output
 * rounded to bf16 from, per-thread buffers. The widened K/V of a (request, kv head)
 * is one block of a pool whose block table is {0}. Probabilities stay fp32 (the
 * avx512_bf16 path rounds them to bf16 before P.V). K/V tokens are tok_stride elements apart
 * in the cache; causal 0: every query token sees every key of its request. */
static int prefill_bf16_widened(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache,
                                const uint16_t* v_cache, const int64_t* block_tables, int64_t bt_stride,
                                const int64_t* q_start, const int64_t* q_len, const int64_t* seq_len, uint16_t* out,
                                int num_reqs, int num_heads, int num_kv_heads, int D, int block_size,
                                int64_t tok_stride, float scale, int causal, float* ws) {
    const int G = num_heads / num_kv_heads;
    if (G * num_kv_heads != num_heads || G > AF_MAX_ROWS || !paged_prefill_supported(D)) return -1;
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
                const int64_t lp = (seq_len[r] + KT - 1) / KT * KT;
                float* kw = ws + base[r] + (int64_t)kh * 2 * lp * D;
                widen_tile(k_cache, v_cache, block_tables + (int64_t)r * bt_stride, seq_len[r], it1[2 * w + 1] * KT,
                           kh, D, block_size, tok_stride, kw, kw + lp * D);
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
                widen_heads(q + (q_start[r] + i0) * q_stride, q_stride, ntok, G, kh, D, qbuf);
                /* kv head 0 of a one-head pool: q and out rows are [G][D], the pool [lp][D]. Not
                 * causal: each token alone, placed at the last position, so it sees every key. */
                if (causal)
                    af_attend(qbuf, (int64_t)G * D, obuf, (int64_t)G * D, ntok, seq_len[r] - q_len[r] + i0, G, 0, 1,
                              D, kw, kw + lp * D, zero_table, (int)lp, D, scale, 0, scratch, 0);
                else
                    for (int i = 0; i < ntok; i++)
                        af_attend(qbuf + (int64_t)i * G * D, (int64_t)G * D, obuf + (int64_t)i * G * D,
                                  (int64_t)G * D, 1, seq_len[r] - 1, G, 0, 1, D, kw, kw + lp * D, zero_table, (int)lp,
                                  D, scale, 0, scratch, 0);
                round_heads(obuf, ntok, G, kh, D, out + (q_start[r] + i0) * num_heads * D, (int64_t)num_heads * D);
            }
        free(scratch);
        free(qbuf);
    }
    free(items);
    free(base);
    return 0;
}

#endif
