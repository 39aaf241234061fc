/*
 * Paged decode attention for the CPU: one query token per sequence, reading K/V from
 * the block pool. float32 on every level is decode_f32.h's; bf16 at the avx512_bf16
 * level is decode_core.h's, over whole sequences, or with few sequences over parts of
 * their keys merged after (as decode_f32.h does), and requests that share cached prefix
 * blocks over the prefix together (decode_bf16_prefix.h). The portable bf16 path here
 * (DEFINE_DECODE) is parallel over (sequence, kv head) with OpenMP: scores go to a
 * per-thread buffer, then softmax, then the weighted sum of V.
 *
 * Layouts: q [num_seqs, num_heads, head_dim] with rows q_stride elements apart (a view
 * into the fused qkv output), out the same but contiguous; caches [num_blocks, block_size,
 * num_kv_heads, head_dim]; block_tables [num_seqs, bt_stride] int64; seq_lens int64.
 * Build: gcc -O3 -march=native -fopenmp -shared -fPIC.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_simd.h"
#include "decode_core.h"
#include "attn_f32.h"
#include "decode_f32.h"
#include "decode_bf16_prefix.h"
#include "decode_bf16_fp8.h"
#include "kv_write.h"  /* write_kv_rows and its forms: the library's K/V write entry points */

#define MAX_G 16
#define MAX_D 256

/* T: element type of q/out/caches; LOAD converts one element to float. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE)                                                  \
void NAME(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int64_t* block_tables,       \
          int64_t bt_stride, const int64_t* seq_lens, T* out, int num_seqs, int num_heads,   \
          int num_kv_heads, int head_dim, int block_size, float scale, int max_len) {        \
    const int G = num_heads / num_kv_heads;                                                  \
    const int64_t tok_stride = (int64_t)num_kv_heads * head_dim;                             \
    _Pragma("omp parallel")                                                                  \
    {                                                                                        \
        float* scores = (float*)malloc(sizeof(float) * (size_t)G * (size_t)(max_len + 1));   \
        float qf[MAX_G][MAX_D];                                                              \
        float acc[MAX_G][MAX_D];                                                             \
        float kv[MAX_D];                                                                     \
        _Pragma("omp for collapse(2) schedule(dynamic, 1)")                                  \
        for (int s = 0; s < num_seqs; s++) {                                                 \
            for (int kh = 0; kh < num_kv_heads; kh++) {                                      \
                const int64_t len = seq_lens[s];                                             \
                const int64_t* bt = block_tables + (int64_t)s * bt_stride;                   \
                for (int g = 0; g < G; g++) {                                                \
                    const T* qp = q + (int64_t)s * q_stride + (int64_t)(kh * G + g) * head_dim; \
                    for (int d = 0; d < head_dim; d++) qf[g][d] = LOAD(qp[d]) * scale;       \
                    memset(acc[g], 0, sizeof(float) * head_dim);                             \
                }                                                                            \
                float mx[MAX_G];                                                             \
                for (int g = 0; g < G; g++) mx[g] = -INFINITY;                               \
                for (int64_t t = 0; t < len; t++) {                                          \
                    const T* kp = k_cache + (bt[t / block_size] * block_size + t % block_size) \
                                  * tok_stride + (int64_t)kh * head_dim;                     \
                    for (int d = 0; d < head_dim; d++) kv[d] = LOAD(kp[d]);                  \
                    for (int g = 0; g < G; g++) {                                            \
                        float dot = 0.f;                                                     \
                        for (int d = 0; d < head_dim; d++) dot += qf[g][d] * kv[d];          \
                        scores[g * (max_len + 1) + t] = dot;                                 \
                        if (dot > mx[g]) mx[g] = dot;                                        \
                    }                                                                        \
                }                                                                            \
                float sum[MAX_G];                                                            \
                for (int g = 0; g < G; g++) {                                                \
                    float* sc = scores + g * (max_len + 1);                                  \
                    float acc_sum = 0.f;                                                     \
                    for (int64_t t = 0; t < len; t++) {                                      \
                        sc[t] = expf(sc[t] - mx[g]);                                         \
                        acc_sum += sc[t];                                                    \
                    }                                                                        \
                    sum[g] = acc_sum;                                                        \
                }                                                                            \
                for (int64_t t = 0; t < len; t++) {                                          \
                    const T* vp = v_cache + (bt[t / block_size] * block_size + t % block_size) \
                                  * tok_stride + (int64_t)kh * head_dim;                     \
                    for (int d = 0; d < head_dim; d++) kv[d] = LOAD(vp[d]);                  \
                    for (int g = 0; g < G; g++) {                                            \
                        const float p = scores[g * (max_len + 1) + t];                       \
                        for (int d = 0; d < head_dim; d++) acc[g][d] += p * kv[d];           \
                    }                                                                        \
                }                                                                            \
                for (int g = 0; g < G; g++) {                                                \
                    T* op = out + ((int64_t)s * num_heads + kh * G + g) * head_dim;          \
                    const float inv = 1.f / sum[g];                                          \
                    for (int d = 0; d < head_dim; d++) op[d] = STORE(acc[g][d] * inv);       \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        free(scores);                                                                        \
    }                                                                                        \
}

/* paged_decode_f32 (same arguments as paged_decode_bf16) and its sliding-window form SW
 * (a trailing window: the token at position p reads only keys (p - window, p]; block table
 * entries before them are never read), over pools of KV (enum af_kv): the _kvbf16 and
 * _kvfp8 forms widen the pools' values as they copy them into the tiles */
#define DEFINE_DECODE_F32(NAME, SW, KV)                                                                          \
void NAME(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,                         \
          const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, float* out, int num_seqs,     \
          int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int max_len) {             \
    (void)max_len;                                                                                              \
    decode_f32(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs, num_heads,      \
               num_kv_heads, head_dim, block_size, scale, 0, KV);                                               \
}                                                                                                               \
void SW(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,                           \
        const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, float* out, int num_seqs,       \
        int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int max_len, int window) {   \
    (void)max_len;                                                                                              \
    decode_f32(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs, num_heads,      \
               num_kv_heads, head_dim, block_size, scale, window, KV);                                          \
}
DEFINE_DECODE_F32(paged_decode_f32, paged_decode_f32_sw, AF_KV_F32)
DEFINE_DECODE_F32(paged_decode_f32_kvbf16, paged_decode_f32_sw_kvbf16, AF_KV_BF16)
DEFINE_DECODE_F32(paged_decode_f32_kvfp8, paged_decode_f32_sw_kvfp8, AF_KV_FP8)

void paged_decode_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                       int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                       int max_len);

/* paged_decode_bf16's arguments over fp8 pools: at the AVX-512-BF16 levels the bf16 kernel over
 * dequantized copies; else the float32 kernel between a widening of the queries and a rounding
 * of the outputs (rows of num_heads x head_dim either way) */
void paged_decode_bf16_kvfp8(const uint16_t* q, int64_t q_stride, const void* k_cache, const void* v_cache,
                             const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                             int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                             int max_len) {
    (void)max_len;
#if defined(INFLIGHT_ISA_AVX512_BF16)
    const int G = num_heads / num_kv_heads;
    if (head_dim % 32 == 0 && G <= MAX_G && head_dim <= MAX_D) {
        struct sp_plan plan = dp_plan(block_tables, bt_stride, seq_lens, num_seqs, G, block_size);
        const int groups = plan.n_chunks > 0;
        sp_free(&plan);
        if (groups) {  /* shared prefixes: the step's distinct blocks as a bf16 pool, for the cascade */
            uint16_t* kb, * vb;
            int64_t widest;
            int64_t* tables = fp8_blocks_to_bf16(k_cache, v_cache, block_tables, bt_stride, seq_lens, num_seqs,
                                                 block_size, num_kv_heads, head_dim, &kb, &vb, &widest);
            paged_decode_bf16(q, q_stride, kb, vb, tables, widest, seq_lens, out, num_seqs, num_heads, num_kv_heads,
                              head_dim, block_size, scale, max_len);
            free(kb);
            free(tables);
            return;
        }
        /* many sequences: whole ones (the long ones in parts) on the bf16 kernel (decode_bf16_fp8.h);
         * few go below, in parts */
        if (num_seqs >= DK_ITEMS_PER_THREAD * omp_get_max_threads()
            && decode_bf16_fp8(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs,
                               num_heads, num_kv_heads, head_dim, block_size, scale) == 0)
            return;
    }
#endif
    const int64_t row = (int64_t)num_heads * head_dim;
    float* qf = malloc(sizeof(float) * (size_t)(2 * num_seqs * row));
    float* of = qf + num_seqs * row;
    bf16_rows_to_f32(qf, q, q_stride, num_seqs, row);
    decode_f32(qf, row, k_cache, v_cache, block_tables, bt_stride, seq_lens, of, num_seqs, num_heads, num_kv_heads,
               head_dim, block_size, scale, 0, AF_KV_FP8);
    f32_rows_to_bf16(out, of, num_seqs * row);
    free(qf);
}

#if defined(INFLIGHT_ISA_AVX512_BF16)
/* Sequences in parts (decode_f32.h), each a run of the sequence's blocks from a block
 * boundary, their states merged after. round_robin: parts go to the threads in turn, and
 * each thread prefetches its next part while it computes this one (the parts are then
 * small enough that two fit L2); else to whichever thread is free. */
static void decode_bf16_parts(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                              const int64_t* block_tables, int64_t bt_stride, uint16_t* out, int num_seqs,
                              int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                              struct dk_parts* p, int round_robin) {
    const int G = num_heads / num_kv_heads;
    const int64_t tok_stride = (int64_t)num_kv_heads * head_dim, row = (int64_t)num_heads * head_dim;
    const int64_t srow = (int64_t)num_heads * (head_dim + 2);
    int64_t longest = 0;  /* sizes the per-thread buffers */
    for (int i = 0; i < p->n; i++)
        longest = p->item[i].hi - p->item[i].lo > longest ? p->item[i].hi - p->item[i].lo : longest;
    const int64_t lp = (longest + 31) & ~(int64_t)31;
    float* states = p->n_states ? malloc(sizeof(float) * (size_t)(p->n_states * srow)) : NULL;
    _Pragma("omp parallel")
    {
        float* sbuf = (float*)malloc(sizeof(float) * (size_t)G * (size_t)lp);
        int64_t* rows = (int64_t*)malloc(sizeof(int64_t) * (size_t)lp);
        struct decode_scratch ws = {sbuf, rows, {0}, 0, 0, NULL};
        const int nt = omp_get_num_threads();
#define PART_BT(it) (block_tables + (int64_t)(it).s * bt_stride + (it).lo / block_size)
#define DECODE_PART(i)                                                                                    \
    do {                                                                                                  \
        const struct dk_part it = p->item[i];                                                             \
        ws.part = it.slot >= 0 ? states + it.slot * srow : NULL;                                          \
        decode_seq_avx512(q + (int64_t)it.s * q_stride, q_stride, 1, k_cache, v_cache, PART_BT(it),      \
                          it.hi - it.lo, out + (int64_t)it.s * row, row, G, 0, num_kv_heads, head_dim,     \
                          block_size, tok_stride, scale, &ws);                                            \
    } while (0)
        if (round_robin) {
            _Pragma("omp for schedule(static, 1)")
            for (int i = 0; i < p->n; i++) {
                ws.prefetched = ws.has_next;  /* the previous part was this thread's, one round back */
                ws.has_next = i + nt < p->n;
                if (ws.has_next)
                    ws.next = pf_cursor_of(k_cache, v_cache, PART_BT(p->item[i + nt]),
                                           p->item[i + nt].hi - p->item[i + nt].lo, block_size, tok_stride);
                DECODE_PART(i);
            }
        } else {
            _Pragma("omp for schedule(dynamic, 1)")
            for (int i = 0; i < p->n; i++) DECODE_PART(i);
        }
#undef DECODE_PART
#undef PART_BT
        /* NOTE: the omp for's implicit barrier: every part's state is written before its sequence merges */
        dk_merge_parts(p, states, num_seqs, num_heads, head_dim, NULL, out);
        free(sbuf);
        free(rows);
    }
    free(states);
}
#endif

DEFINE_DECODE(paged_decode_bf16_generic, uint16_t, bf16_to_f32, f32_to_bf16)

void paged_decode_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                       int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                       int max_len) {
#if defined(INFLIGHT_ISA_AVX512_BF16)
    if (head_dim % 32 == 0 && num_heads / num_kv_heads <= MAX_G && head_dim <= MAX_D) {
        const int G = num_heads / num_kv_heads;
        const int64_t tok_stride = (int64_t)num_kv_heads * head_dim;
        struct sp_plan plan = dp_plan(block_tables, bt_stride, seq_lens, num_seqs, G, block_size);
        const int done = plan.n_chunks > 0
                         && decode_bf16_grouped(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out,
                                                num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                                                &plan) == 0;
        sp_free(&plan);
        if (done) return;
        /* Few sequences: parts so that a lone long sequence still spreads over the cores, to
         * whichever thread is free. Else whole sequences (contiguous block reads), or parts of
         * the long ones, so small that two fit L2: they go to the threads in turn, each
         * prefetching its next while it computes this one (a larger pair would evict this
         * one's lines before its later passes read them again) */
        const int many = num_seqs >= DK_ITEMS_PER_THREAD * omp_get_max_threads();
        const int64_t part_keys = long_part_keys(tok_stride, block_size);
        struct dk_parts p = many ? dk_split(seq_lens, num_seqs, part_keys, block_size)
                                 : dk_make(seq_lens, num_seqs, omp_get_max_threads(), 0, block_size);
        decode_bf16_parts(q, q_stride, k_cache, v_cache, block_tables, bt_stride, out, num_seqs, num_heads,
                          num_kv_heads, head_dim, block_size, scale, &p, many);
        dk_free(&p);
        return;
    }
#endif
    paged_decode_bf16_generic(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs, num_heads,
                              num_kv_heads, head_dim, block_size, scale, max_len);
}

/* How many groups of requests sharing prefix blocks paged_decode_bf16 would score together
 * in this step (0 where the level has no cascade): for tests and benchmarks. */
int paged_decode_bf16_groups(const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, int num_seqs,
                             int num_heads, int num_kv_heads, int block_size) {
#if defined(INFLIGHT_ISA_AVX512_BF16)
    struct sp_plan plan = dp_plan(block_tables, bt_stride, seq_lens, num_seqs, num_heads / num_kv_heads, block_size);
    const int n = plan.n_chunks;
    sp_free(&plan);
    return n;
#else
    (void)block_tables, (void)bt_stride, (void)seq_lens, (void)num_seqs, (void)num_heads, (void)num_kv_heads;
    (void)block_size;
    return 0;
#endif
}

int paged_decode_limits(int* max_g, int* max_d) {
    *max_g = MAX_G;
    *max_d = MAX_D;
    return 0;
}
