/*
 * Paged prefill attention for the CPU (bf16, AVX-512-BF16): the queries of prompt
 * chunks attend causally over everything their request has cached, the chunk
 * itself included (its K/V are written to the pool first).
 *
 * Per (request, kv head, tile of query tokens) the G query heads of that kv head are
 * folded into the rows; per register block of rows, the scores of every visible key
 * go to a per-thread buffer, then one max and one exp pass per row, then P.V (no
 * online rescaling: faster than flash-style tiles, whose per-tile
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
#include "decode_bf16_fp8.h"

/* keys per tile: with RB = 4 rows, 16 Q.K accumulators in flight (faster than 32 keys) */
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

/* Bytes of workspace the repacked K/V of these requests need (short causal chunks repack
 * nothing; without the bf16 dot product: every request's K/V widened to fp32, pf_widened_floats). */
static inline int64_t pf_widened_floats(int64_t seq_len, int num_kv_heads, int head_dim) {
    return (seq_len + KT - 1) / KT * KT * num_kv_heads * 2 * (int64_t)head_dim;
}

static int64_t prefill_workspace(const int64_t* seq_len, const int64_t* q_len, int num_reqs, int num_heads,
                                 int num_kv_heads, int head_dim, int causal) {
#if !defined(INFLIGHT_ISA_AVX512_BF16)
    int64_t floats = 0;
    for (int r = 0; r < num_reqs; r++) floats += pf_widened_floats(seq_len[r], num_kv_heads, head_dim);
    (void)q_len, (void)num_heads, (void)causal;
    return floats * (int64_t)sizeof(float);
#endif
    int64_t tiles = 0;
    for (int r = 0; r < num_reqs; r++)
        if (!causal || !short_chunk(q_len[r], num_heads / num_kv_heads)) tiles += (seq_len[r] + KT - 1) / KT;
    return tiles * num_kv_heads * 2 * (int64_t)KT * head_dim * 2;
}

int64_t paged_prefill_workspace(const int64_t* seq_len, const int64_t* q_len, int num_reqs, int num_heads,
                                int num_kv_heads, int head_dim) {
    return prefill_workspace(seq_len, q_len, num_reqs, num_heads, num_kv_heads, head_dim, 1);
}

#if defined(INFLIGHT_ISA_AMX_BF16)
#include "prefill_bf16_amx.h"
#elif defined(INFLIGHT_ISA_AVX512_BF16)
#include "prefill_bf16_dp.h"
#else
#include "prefill_bf16_widen.h"
#endif

/* Either level's prefill; causal 0: every row sees its request's every key (an encoder's). */
static int prefill_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                        const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,
                        const int64_t* seq_len, uint16_t* out, int num_reqs, int num_heads, int num_kv_heads,
                        int head_dim, int block_size, int64_t tok_stride, float scale, int causal, void* workspace) {
#if defined(INFLIGHT_ISA_AMX_BF16)
    amx_permitted();  /* asked here, before the threads start */
#endif
#if defined(INFLIGHT_ISA_AVX512_BF16)
    return prefill_bf16_dp(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,
                           num_reqs, num_heads, num_kv_heads, head_dim, block_size, tok_stride, scale, causal,
                           (uint32_t*)workspace);
#else
    return prefill_bf16_widened(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len,
                                out, num_reqs, num_heads, num_kv_heads, head_dim, block_size, tok_stride, scale,
                                causal, (float*)workspace);
#endif
}

int paged_prefill_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,
                       const int64_t* seq_len, uint16_t* out, int num_reqs, int num_heads, int num_kv_heads,
                       int head_dim, int block_size, float scale, void* workspace) {
    return prefill_bf16(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,
                        num_reqs, num_heads, num_kv_heads, head_dim, block_size, (int64_t)num_kv_heads * head_dim,
                        scale, 1, workspace);
}

/* An encoder's attention (it keeps no KV): the rows q_start[r] .. q_start[r] + q_len[r] of
 * request r attend over each other, every row over every one of them (no causal mask). k and v
 * hold the same rows, kv_stride elements apart ([num_tokens, num_kv_heads, D] with rows
 * kv_stride apart: views into the fused qkv output); q and out as for paged_prefill_bf16. The
 * rows are a pool of one-token blocks whose block tables count up from q_start[r]. Workspace:
 * encoder_attention_workspace bytes. Returns 0, or -1 for a shape it does not take. */
int64_t encoder_attention_workspace(const int64_t* q_len, int num_reqs, int num_heads, int num_kv_heads,
                                    int head_dim) {
    return prefill_workspace(q_len, q_len, num_reqs, num_heads, num_kv_heads, head_dim, 0);
}

int encoder_attention_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k, const uint16_t* v,
                           int64_t kv_stride, const int64_t* q_start, const int64_t* q_len, uint16_t* out,
                           int num_reqs, int num_heads, int num_kv_heads, int head_dim, float scale,
                           void* workspace) {
    if (num_reqs <= 0) return 0;
    int64_t longest = 1;
    for (int r = 0; r < num_reqs; r++) longest = q_len[r] > longest ? q_len[r] : longest;
    int64_t* tables = (int64_t*)malloc(sizeof(int64_t) * (size_t)num_reqs * (size_t)longest);
    if (tables == NULL) return -1;
    for (int r = 0; r < num_reqs; r++)
        for (int64_t t = 0; t < q_len[r]; t++) tables[r * longest + t] = q_start[r] + t;
    const int rc = prefill_bf16(q, q_stride, k, v, tables, longest, q_start, q_len, q_len, out, num_reqs, num_heads,
                                num_kv_heads, head_dim, 1, kv_stride, scale, 0, workspace);
    free(tables);
    return rc;
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
                       int head_dim, int block_size, float scale, int64_t window, int kv) {
    const int D = head_dim, G = num_heads / num_kv_heads;
    if (!paged_prefill_f32_supported(D, G) || G * num_kv_heads != num_heads || window < 0) return -1;
    const int64_t tok_stride = (int64_t)num_kv_heads * af_row(D, kv);
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
                      block_tables + (int64_t)r * bt_stride, block_size, tok_stride, scale, window, scratch, kv);
        }
        free(scratch);
    }
    free(items);
    return 0;
}

/* paged_prefill_f32 and its sliding-window form SW (the token at position p reads only keys
 * (p - window, p]; block table entries before them are never read), over pools of KV (enum
 * af_kv): the _kvbf16 and _kvfp8 forms widen the pools' values as they copy them */
#define DEFINE_PREFILL_F32(NAME, SW, KV)                                                                         \
int NAME(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,                          \
         const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,           \
         const int64_t* seq_len, float* out, int num_reqs, int num_heads, int num_kv_heads, int head_dim,        \
         int block_size, float scale, void* workspace) {                                                        \
    (void)workspace;                                                                                            \
    return prefill_f32(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,    \
                       num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale, 0, KV);                  \
}                                                                                                               \
int SW(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,                            \
       const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start, const int64_t* q_len,             \
       const int64_t* seq_len, float* out, int num_reqs, int num_heads, int num_kv_heads, int head_dim,          \
       int block_size, float scale, void* workspace, int window) {                                              \
    (void)workspace;                                                                                            \
    return prefill_f32(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,    \
                       num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale, window, KV);             \
}
DEFINE_PREFILL_F32(paged_prefill_f32, paged_prefill_f32_sw, AF_KV_F32)
DEFINE_PREFILL_F32(paged_prefill_f32_kvbf16, paged_prefill_f32_sw_kvbf16, AF_KV_BF16)
DEFINE_PREFILL_F32(paged_prefill_f32_kvfp8, paged_prefill_f32_sw_kvfp8, AF_KV_FP8)

#if defined(INFLIGHT_ISA_AVX512_BF16)
/* prefill_bf16 over fp8 pools: the requests' blocks dequantized into bf16 ones (decode_bf16_fp8.h) */
static int prefill_bf16_fp8(const uint16_t* q, int64_t q_stride, const uint8_t* k_cache, const uint8_t* v_cache,
                            const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start,
                            const int64_t* q_len, const int64_t* seq_len, uint16_t* out, int num_reqs,
                            int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                            void* workspace) {
    uint16_t* kb, * vb;
    int64_t widest;
    int64_t* tables = fp8_blocks_to_bf16(k_cache, v_cache, block_tables, bt_stride, seq_len, num_reqs, block_size,
                                         num_kv_heads, head_dim, &kb, &vb, &widest);
    const int rc = prefill_bf16(q, q_stride, kb, vb, tables, widest, q_start, q_len, seq_len, out, num_reqs, num_heads,
                                num_kv_heads, head_dim, block_size, (int64_t)num_kv_heads * head_dim, scale, 1,
                                workspace);
    free(kb);
    free(tables);
    return rc;
}
#endif

/* paged_prefill_bf16's arguments over fp8 pools: at the AVX-512-BF16 levels the bf16 kernel over
 * dequantized copies of the requests' blocks (workspace: paged_prefill_workspace's); else the
 * float32 kernel between a widening of the requests' query rows and a rounding of their output
 * rows (no other row of out is written; the workspace is not used) */
int paged_prefill_bf16_kvfp8(const uint16_t* q, int64_t q_stride, const void* k_cache, const void* v_cache,
                             const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start,
                             const int64_t* q_len, const int64_t* seq_len, uint16_t* out, int num_reqs,
                             int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                             void* workspace) {
#if defined(INFLIGHT_ISA_AVX512_BF16)
    if (paged_prefill_supported(head_dim))
        return prefill_bf16_fp8(q, q_stride, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, out,
                                num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale, workspace);
#endif
    (void)workspace;
    const int64_t row = (int64_t)num_heads * head_dim;
    int64_t rows = 0;  /* q_start counts from the step's first row */
    for (int r = 0; r < num_reqs; r++) rows = q_start[r] + q_len[r] > rows ? q_start[r] + q_len[r] : rows;
    float* qf = malloc(sizeof(float) * (size_t)(2 * rows * row + 1));
    float* of = qf + rows * row;
    for (int r = 0; r < num_reqs; r++)
        bf16_rows_to_f32(qf + q_start[r] * row, q + q_start[r] * q_stride, q_stride, q_len[r], row);
    const int rc = prefill_f32(qf, row, k_cache, v_cache, block_tables, bt_stride, q_start, q_len, seq_len, of,
                               num_reqs, num_heads, num_kv_heads, head_dim, block_size, scale, 0, AF_KV_FP8);
    for (int r = 0; r < num_reqs; r++)
        f32_rows_to_bf16(out + q_start[r] * row, of + q_start[r] * row, q_len[r] * row);
    free(qf);
    return rc;
}
