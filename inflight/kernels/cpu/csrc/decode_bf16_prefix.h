/* bf16 paged decode of requests that share cached prefix blocks (paged_decode.c, both bf16
 * levels): cascade attention. shared_prefix.h groups the requests whose block tables start
 * with the same blocks (prefix caching hands them the same block ids); the prefix keys of a
 * group are then scored for several of its requests in one pass, their queries as the pass's
 * rows (each seeing every prefix key), as a small GEMM (decode_prefix_pass.h: on AMX tiles at
 * the amx_bf16 level, else with vdpbf16ps). Each request's own keys after the
 * prefix run as a part of its context, and the two softmax states merge into its output
 * (dk_merge). Requests in no group run whole.
 * NOTE: a prefix stays in L2 and L3 while the step's requests read it, so what a pass saves
 * is arithmetic (a GEMM instead of a row at a time), not memory traffic.
 */
#ifndef INFLIGHT_DECODE_BF16_PREFIX_H
#define INFLIGHT_DECODE_BF16_PREFIX_H
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode_core.h"
#include "decode_f32.h"
#include "shared_prefix.h"

#if defined(INFLIGHT_ISA_AVX512_BF16)
#include "decode_prefix_pass.h"
#if defined(INFLIGHT_ISA_AMX_BF16)
#define DP_MIN_ROWS 16           /* query rows a group fills, at least: one A tile */
#else
#define DP_MIN_ROWS AW_MIN_ROWS  /* a small group saves less than its merge costs */
#endif

/* the step's groups (shared_prefix.h's plan with this level's thresholds; no chunks where
 * none qualifies) */
static struct sp_plan dp_plan(const int64_t* bt, int64_t bt_stride, const int64_t* seq_lens, int num_seqs, int G,
                              int block_size) {
    struct sp_plan plan = {0};
    if (sp_may_group(bt, bt_stride, seq_lens, num_seqs, G, DP_MIN_ROWS))
        plan = sp_make(bt, bt_stride, seq_lens, num_seqs, G, block_size, DP_MIN_ROWS, AF_MAX_ROWS);
    return plan;
}

/* how many passes a chunk of n requests takes: at most `most` requests each, and a multiple of
 * the threads where that leaves each pass `least` requests (passes go to the threads whole,
 * and each repacks its prefix: an odd pass out would keep the other threads waiting) */
static int dp_cuts(int n, int most, int threads, int least) {
    const int k = (n + most - 1) / most, even = (k + threads - 1) / threads * threads;
    return n / even >= least ? even : k;
}

/* the plan's chunks cut into passes of near-equal size, each at most `most` requests
 * (*n_pass of them; NULL: out of memory) */
static struct sp_chunk* dp_passes(const struct sp_plan* plan, int most, int least, int* n_pass) {
    const int threads = omp_get_max_threads();
    int n = 0;
    for (int c = 0; c < plan->n_chunks; c++) n += dp_cuts(plan->chunks[c].n, most, threads, least);
    struct sp_chunk* pass = malloc(sizeof *pass * (size_t)n);
    if (!pass) return NULL;
    for (int c = 0, i = 0; c < plan->n_chunks; c++) {
        const struct sp_chunk ch = plan->chunks[c];
        const int k = dp_cuts(ch.n, most, threads, least);
        for (int j = 0, start = ch.start; j < k; j++) {
            const int size = ch.n / k + (j < ch.n % k);
            pass[i++] = (struct sp_chunk){start, size, ch.prefix};
            start += size;
        }
    }
    *n_pass = n;
    return pass;
}

/* One pass over a prefix of len keys: nq requests' query rows (q, q_stride apart) into their
 * states (part, part_row apart): decode_prefix_pass.h's GEMM (pbuf: its buffer of at least
 * pa_floats(len, head_dim) floats), or where that could not be had (pbuf NULL) decode_core.h's
 * passes of at most DECODE_MAX_ROWS rows (with ws.part set they never write out). */
static void dp_prefix_pass(const uint16_t* q, int64_t q_stride, int nq, const uint16_t* k_cache,
                           const uint16_t* v_cache, const int64_t* bt, int64_t len, int G, int num_kv_heads,
                           int head_dim, int block_size, float scale, float* part, int64_t part_row, float* pbuf,
                           uint16_t* out, const struct decode_scratch* ws) {
    const int64_t tok_stride = (int64_t)num_kv_heads * head_dim;
    if (pbuf) {
        prefix_pass(q, q_stride, nq, k_cache, v_cache, bt, len, G, num_kv_heads, head_dim, block_size, tok_stride,
                    scale, part, part_row, pbuf, ws->rows);
        return;
    }
    const int most = DECODE_MAX_ROWS / G;
    struct decode_scratch w = *ws;  /* the thread's buffers, with this pass's outputs */
    w.part_row = part_row, w.all_keys = 1;
    for (int j = 0; j < nq; j += most) {
        w.part = part + j * part_row;
        decode_seq_avx512(q + j * q_stride, q_stride, nq - j < most ? nq - j : most, k_cache, v_cache, bt, len,
                          out, q_stride, G, 0, num_kv_heads, head_dim, block_size, tok_stride, scale, &w);
    }
}

/* paged_decode_bf16's arguments and the step's plan (with at least one chunk). Returns 0,
 * or -1 out of memory (nothing written: the caller runs the plain path). */
static int decode_bf16_grouped(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                               const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                               int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                               float scale, const struct sp_plan* plan) {
    const int G = num_heads / num_kv_heads;
    const int64_t tok_stride = (int64_t)num_kv_heads * head_dim, row = (int64_t)num_heads * head_dim;
    const int64_t srow = (int64_t)num_heads * (head_dim + 2);  /* one request's state: each head's D + 2 */
    const int grouped = plan->chunks[plan->n_chunks - 1].start + plan->chunks[plan->n_chunks - 1].n;
    int n_pass = 0;
    struct sp_chunk* pass = dp_passes(plan, PA_MAX_ROWS / G, (16 + G - 1) / G, &n_pass);  /* a row tile, at least */
    uint16_t* qg = malloc(sizeof(uint16_t) * (size_t)(grouped * row));  /* the pass's rows in plan order */
    float* states = malloc(sizeof(float) * (size_t)(grouped * 2 * srow));  /* a request's prefix, then own */
    if (!pass || !qg || !states) {
        free(pass), free(qg), free(states);
        return -1;
    }
    for (int i = 0; i < grouped; i++)
        memcpy(qg + i * row, q + (int64_t)plan->order[i] * q_stride, sizeof(uint16_t) * (size_t)row);
    int64_t longest = 0, widest = 0;  /* the longest sequence, the longest prefix */
    for (int s = 0; s < num_seqs; s++) longest = seq_lens[s] > longest ? seq_lens[s] : longest;
    for (int c = 0; c < plan->n_chunks; c++) widest = plan->chunks[c].prefix > widest ? plan->chunks[c].prefix : widest;
    const int64_t lp = (longest + 31) & ~(int64_t)31;
    _Pragma("omp parallel")
    {
        float* sbuf = (float*)malloc(sizeof(float) * (size_t)(DECODE_MAX_ROWS * lp));
        int64_t* rows = (int64_t*)malloc(sizeof(int64_t) * (size_t)lp);
        struct decode_scratch ws = {sbuf, rows, {0}, 0, 0, NULL};
        float* pbuf = (float*)aligned_alloc(64, sizeof(float) * (size_t)((pa_floats(widest, head_dim) + 15) & ~15));
        _Pragma("omp for schedule(dynamic, 1)")
        for (int i = 0; i < n_pass; i++)
            dp_prefix_pass(qg + pass[i].start * row, row, pass[i].n, k_cache, v_cache,
                           block_tables + (int64_t)plan->order[pass[i].start] * bt_stride, pass[i].prefix, G,
                           num_kv_heads, head_dim, block_size, scale, states + (int64_t)pass[i].start * 2 * srow,
                           2 * srow, pbuf, out, &ws);
        /* NOTE: the implicit barrier here: every prefix state is written before a request merges it */
        free(pbuf);
        _Pragma("omp for schedule(dynamic, 1)")
        for (int s = 0; s < num_seqs; s++) {
            const int slot = plan->slot[s];
            const int64_t k0 = slot >= 0 ? plan->k0[s] : 0;  /* a multiple of block_size */
            ws.part = slot >= 0 ? states + ((int64_t)slot * 2 + 1) * srow : NULL;
            decode_seq_avx512(q + (int64_t)s * q_stride, q_stride, 1, k_cache, v_cache,
                              block_tables + (int64_t)s * bt_stride + k0 / block_size, seq_lens[s] - k0,
                              out + (int64_t)s * row, row, G, 0, num_kv_heads, head_dim, block_size, tok_stride,
                              scale, &ws);
            if (slot >= 0) dk_merge(states + (int64_t)slot * 2 * srow, 2, num_heads, head_dim, NULL, out + s * row);
        }
        free(sbuf);
        free(rows);
    }
    free(pass), free(qg), free(states);
    return 0;
}
#endif

#endif
