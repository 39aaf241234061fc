/* bf16 attention over fp8 pools (kv_fp8.h) at the AVX-512-BF16 levels, through the bf16
 * kernels over dequantized copies (code * scale rounded to bf16, as kv_quant.dequantize_fp8
 * gives a bf16 model). A decode step of many sequences: each sequence's K and V rows, every kv
 * head, into per-thread bf16 buffers laid out as a one-block pool, then decode_core.h's kernel
 * over them while they stay in L2 (the pool's bytes come from DRAM once, about half a bf16
 * pool's). A decode step whose requests share prefix blocks, and a prefill step: the step's
 * distinct blocks into a bf16 pool with the tables renumbered (fp8_blocks_to_bf16), so the
 * cascade groups and the prefill kernel see the same sharing as over the fp8 pools.
 */
#ifndef INFLIGHT_DECODE_BF16_FP8_H
#define INFLIGHT_DECODE_BF16_FP8_H
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "decode_core.h"
#include "decode_f32.h"
#include "kv_fp8.h"

#if defined(INFLIGHT_ISA_AVX512_BF16)
/* one fp8 row of D values (D a multiple of 32) as bf16, each code * scale rounded */
static inline void fp8_row_to_bf16(uint16_t* dst, const uint8_t* src, int D) {
    const __m512 s = _mm512_set1_ps(fp8_row_scale(src, D) * 256.f);  /* the loads give codes times 2^-8 */
    for (int d = 0; d < D; d += 16)
        store_bf16x16(dst + d, _mm512_mul_ps((__m512)vf_load_fp8_scaled(src + d), s), 0xFFFF);
}

/* A sequence's len rows of every kv head (the pool's block table bt) into dst [len][nkv][D],
 * each row's line of the block AHEAD blocks on prefetched as it goes: the blocks lie at random
 * places, where the hardware prefetcher loses the stream */
#define FP8_AHEAD 2
static void fp8_seq_to_bf16(uint16_t* dst, const uint8_t* pool, const int64_t* bt, int64_t len, int block_size,
                            int nkv, int D) {
    const int64_t row = FP8_ROW(D), blk = (int64_t)block_size * nkv * row;
    const int64_t nblk = (len + block_size - 1) / block_size;
    for (int64_t b = 0; b < FP8_AHEAD - 1 && b < nblk; b++)  /* the first blocks' lines, asked for at once */
        for (int64_t off = 0; off < blk; off += 64) _mm_prefetch((const char*)(pool + bt[b] * blk + off), _MM_HINT_T0);
    for (int64_t b = 0, t = 0; b < nblk; b++) {
        const uint8_t* src = pool + bt[b] * blk;
        const uint8_t* ahead = b + FP8_AHEAD - 1 < nblk ? pool + bt[b + FP8_AHEAD - 1] * blk : NULL;
        const int64_t rows = (len - t < block_size ? len - t : block_size) * nkv;
        for (int64_t r = 0; r < rows; r++, dst += D) {
            if (ahead) _mm_prefetch((const char*)(ahead + r * row), _MM_HINT_T0);
            fp8_row_to_bf16(dst, src + r * row, D);
        }
        t += block_size;
    }
}

static int cmp_i64(const void* a, const void* b) {
    const int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
    return (x > y) - (x < y);
}

/* The distinct blocks that the n table rows (bt_stride apart) hold for their lens[r] keys,
 * dequantized once each into bf16 pools (*kb, *vb: [blocks][block_size][nkv][D], one
 * allocation at *kb to free) with tables (n rows, *widest apart, malloc'd) renumbered into
 * them: requests that share prefix blocks still share them, so a kernel's shared-prefix
 * groups form as over the fp8 pools. Returns the tables. */
static int64_t* fp8_blocks_to_bf16(const uint8_t* k_cache, const uint8_t* v_cache, const int64_t* bt,
                                   int64_t bt_stride, const int64_t* lens, int n, int block_size, int nkv, int D,
                                   uint16_t** kb, uint16_t** vb, int64_t* widest) {
    int64_t total = 0, w = 1;
    for (int r = 0; r < n; r++) {
        const int64_t nb = lens[r] > 0 ? (lens[r] + block_size - 1) / block_size : 0;
        total += nb;
        w = nb > w ? nb : w;
    }
    int64_t* ids = malloc(sizeof(int64_t) * (size_t)(total + 1));
    for (int r = 0, i = 0; r < n; r++)
        for (int64_t b = 0; b * block_size < lens[r]; b++) ids[i++] = bt[r * bt_stride + b];
    qsort(ids, (size_t)total, sizeof(int64_t), cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < total; i++)
        if (i == 0 || ids[i] != ids[u - 1]) ids[u++] = ids[i];
    int64_t* tables = malloc(sizeof(int64_t) * (size_t)(n * w));
    for (int r = 0; r < n; r++)
        for (int64_t b = 0; b * block_size < lens[r]; b++) {
            const int64_t* at = bsearch(&bt[r * bt_stride + b], ids, (size_t)u, sizeof(int64_t), cmp_i64);
            tables[r * w + b] = at - ids;
        }
    const int64_t rows = (int64_t)block_size * nkv, blk = rows * D;
    *kb = malloc(sizeof(uint16_t) * (size_t)(2 * u * blk + 1));
    *vb = *kb + u * blk;
    uint16_t* k = *kb, * v = *vb;
    #pragma omp parallel for schedule(dynamic, 4)
    for (int64_t i = 0; i < u; i++) {
        const int64_t src = ids[i] * rows * FP8_ROW(D);
        for (int64_t x = 0; x < rows; x++) {
            fp8_row_to_bf16(k + i * blk + x * D, k_cache + src + x * FP8_ROW(D), D);
            fp8_row_to_bf16(v + i * blk + x * D, v_cache + src + x * FP8_ROW(D), D);
        }
    }
    free(ids);
    *widest = w;
    return tables;
}

/* paged_decode_bf16's arguments over fp8 pools, a whole sequence a work item, or a part of a
 * long one (the parts paged_decode_bf16 cuts, so both give the same bits); returns -1 for what
 * it does not take (head_dim not a multiple of 32 up to DECODE_MAX_D, more than DECODE_MAX_ROWS
 * query heads a kv head) */
static int decode_bf16_fp8(const uint16_t* q, int64_t q_stride, const uint8_t* k_cache, const uint8_t* v_cache,
                           const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                           int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale) {
    const int G = num_heads / num_kv_heads, D = head_dim;
    if (D % 32 || D > DECODE_MAX_D || G > DECODE_MAX_ROWS) return -1;
    const int64_t tok = (int64_t)num_kv_heads * D, row = (int64_t)num_heads * D, srow = (int64_t)num_heads * (D + 2);
    struct dk_parts p = dk_split(seq_lens, num_seqs, long_part_keys(tok, block_size), block_size);
    int64_t longest = 0;
    for (int i = 0; i < p.n; i++)
        longest = p.item[i].hi - p.item[i].lo > longest ? p.item[i].hi - p.item[i].lo : longest;
    const int64_t lp = (longest + 31) & ~(int64_t)31;
    float* states = p.n_states ? malloc(sizeof(float) * (size_t)(p.n_states * srow)) : NULL;
    _Pragma("omp parallel")
    {
        float* sbuf = malloc(sizeof(float) * (size_t)(G * lp));
        int64_t* rows = malloc(sizeof(int64_t) * (size_t)lp);
        uint16_t* kb = malloc(sizeof(uint16_t) * (size_t)(2 * lp * tok));
        uint16_t* vb = kb + lp * tok;
        const int64_t one_block = 0;  /* the buffers' block table: block 0 of lp tokens */
        /* prefetched: the buffers are in the caches already, nothing to warm */
        struct decode_scratch ws = {sbuf, rows, {0}, 0, 1, NULL, 0, 0};
        _Pragma("omp for schedule(dynamic, 1)")
        for (int i = 0; i < p.n; i++) {
            const struct dk_part it = p.item[i];
            const int64_t* bt = block_tables + (int64_t)it.s * bt_stride + it.lo / block_size;
            fp8_seq_to_bf16(kb, k_cache, bt, it.hi - it.lo, block_size, num_kv_heads, D);
            fp8_seq_to_bf16(vb, v_cache, bt, it.hi - it.lo, block_size, num_kv_heads, D);
            ws.part = it.slot >= 0 ? states + it.slot * srow : NULL;
            decode_seq_avx512(q + (int64_t)it.s * q_stride, q_stride, 1, kb, vb, &one_block, it.hi - it.lo,
                              out + (int64_t)it.s * row, row, G, 0, num_kv_heads, D, (int)lp, tok, scale, &ws);
        }  /* NOTE: the implicit barrier here: every part's state is written before its sequence merges */
        dk_merge_parts(&p, states, num_seqs, num_heads, D, NULL, out);
        free(sbuf);
        free(rows);
        free(kb);
    }
    free(states);
    dk_free(&p);
    return 0;
}
#endif
#endif
