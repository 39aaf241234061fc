/* How float32 paged attention (attn_f32.h) reaches a tile's keys: each key's K and V rows
 * either pointed at in the pool and prefetched (af_tile_rows) or copied into per-thread tile
 * buffers a block's run at a time (af_tile_copy), from a float32, a bfloat16 or an fp8 pool. Blocks
 * lie at random places in the pool, where the hardware prefetcher loses the stream: both ways
 * prefetch the next block themselves.
 */
#ifndef INFLIGHT_ATTN_F32_TILES_H
#define INFLIGHT_ATTN_F32_TILES_H
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"
#include "kv_fp8.h"
#include "vec.h"

/* What a pool holds (the kernels' `kv` argument): float32, bfloat16, or fp8 rows (kv_fp8.h) */
enum af_kv { AF_KV_F32 = 0, AF_KV_BF16 = 1, AF_KV_FP8 = 2 };

/* a kv head's row in the pool, in the pool's elements (bytes for fp8) */
static inline int af_row(int D, int kv) { return kv == AF_KV_FP8 ? FP8_ROW(D) : D; }

/* The cache rows of keys [t0, t0 + nk) of the kv heads an item reads (the pool's K and V
 * rows for the first start at kbase / vbase; span: floats of the heads together),
 * prefetched: blocks lie at random places in the pool, where the hardware prefetcher
 * loses the stream. */
static inline void af_tile_rows(const float* kbase, const float* vbase, const int64_t* bt, int block_size,
                                int64_t tok_stride, int span, int64_t t0, int nk, const float** kp, const float** vp) {
    for (int64_t b = t0 / block_size, i = t0 % block_size, j = 0; j < nk; b++, i = 0)  /* no division per key */
        for (int64_t off = (bt[b] * block_size + i) * tok_stride; i < block_size && j < nk; i++, j++) {
            kp[j] = kbase + off;
            vp[j] = vbase + off;
            for (int d = 0; d < span; d += 64 / (int)sizeof(float)) {
                __builtin_prefetch(kp[j] + d);
                __builtin_prefetch(vp[j] + d);
            }
            off += tok_stride;
        }
}

#define AF_COPY_SPAN 256  /* floats of a key's rows an item copies into its tile buffers, at most */

/* n floats of K and of V copied a cache line at a time, that line of the next block's K and
 * V (pk / pv, may be NULL) prefetched as it goes: the loads of two blocks stay in flight,
 * where the hardware prefetcher stops at the end of each scattered block. NAME copies from
 * a pool of T, each value widened to float32 (exactly) by LOAD (VL of them) or ONE. */
#define AF_DEFINE_COPY_LINES(NAME, T, LOAD, ONE)                                                            \
static inline void NAME(float* dk, const T* sk, float* dv, const T* sv, int64_t n, const T* pk, const T* pv) { \
    const int line = 64 / (int)sizeof(T);                                                                   \
    int64_t i = 0;                                                                                          \
    for (; i + line <= n; i += line) {                                                                      \
        if (pk) {                                                                                           \
            __builtin_prefetch(pk + i);                                                                     \
            __builtin_prefetch(pv + i);                                                                     \
        }                                                                                                   \
        for (int j = 0; j < line; j += VL) {                                                                \
            vf_store(dk + i + j, LOAD(sk + i + j));                                                         \
            vf_store(dv + i + j, LOAD(sv + i + j));                                                         \
        }                                                                                                   \
    }                                                                                                       \
    for (; i < n; i++) {                                                                                    \
        dk[i] = ONE(sk[i]);                                                                                 \
        dv[i] = ONE(sv[i]);                                                                                 \
    }                                                                                                       \
}

#define AF_SAME(x) (x)
AF_DEFINE_COPY_LINES(af_copy_lines, float, vf_load, AF_SAME)
/* from a bfloat16 pool: half the bytes from DRAM for the same tile */
AF_DEFINE_COPY_LINES(af_copy_lines_bf16, uint16_t, vf_load_bf16, bf16_to_f32)
#undef AF_SAME

/* Element off of a pool of kind kv. NOTE: every pool travels as const float*; only this and
 * the copies read it as what it holds. */
static inline const float* af_at(const float* base, int64_t off, int kv) {
    if (kv == AF_KV_FP8) return (const float*)(const void*)((const uint8_t*)(const void*)base + off);
    return kv == AF_KV_BF16 ? (const float*)(const void*)((const uint16_t*)(const void*)base + off) : base + off;
}

/* the copy of n values from a float32 or bfloat16 pool into float32 */
static inline void af_copy_any(float* dk, const float* sk, float* dv, const float* sv, int64_t n, const float* pk,
                               const float* pv, int kv) {
    if (kv == AF_KV_BF16)
        af_copy_lines_bf16(dk, (const uint16_t*)(const void*)sk, dv, (const uint16_t*)(const void*)sv, n,
                           (const uint16_t*)(const void*)pk, (const uint16_t*)(const void*)pv);
    else
        af_copy_lines(dk, sk, dv, sv, n, pk, pv);
}

/* the copy of `rows` kv-head rows from an fp8 pool (FP8_ROW(D) bytes apart) into float32
 * rows (D apart), the same bytes of the next block (pk / pv, may be NULL) prefetched */
static inline void af_copy_fp8(float* dk, const float* sk, float* dv, const float* sv, int rows, int D,
                               const float* pk, const float* pv) {
    if (pk)
        for (int64_t i = 0; i < (int64_t)rows * FP8_ROW(D); i += 64) {
            __builtin_prefetch((const char*)pk + i);
            __builtin_prefetch((const char*)pv + i);
        }
    fp8_rows_to_f32(dk, (const uint8_t*)(const void*)sk, rows, D);
    fp8_rows_to_f32(dv, (const uint8_t*)(const void*)sv, rows, D);
}

/* The rows of n keys of one block copied (off: the first one's in the pool; next: the same
 * key's in the next block, -1 for none): where the item reads every kv head, the n keys'
 * rows are one run of the pool, one copy; else a copy per key. */
static inline void af_copy_run(float* kb, float* vb, const float* kbase, const float* vbase, int64_t off,
                               int64_t next, int n, int64_t tok_stride, int span, int D, int kv) {
    const int nkh = span / D;
    const int64_t row = (int64_t)nkh * af_row(D, kv);  /* an item's part of a key's pool row */
    const int whole = tok_stride == row;
    for (int x = 0; x < n; x += whole ? n : 1) {
        const int64_t o = off + x * tok_stride, p = next + x * tok_stride;
        const float* sk = af_at(kbase, o, kv), * sv = af_at(vbase, o, kv);
        const float* pk = next >= 0 ? af_at(kbase, p, kv) : NULL, * pv = next >= 0 ? af_at(vbase, p, kv) : NULL;
        if (kv == AF_KV_FP8)
            af_copy_fp8(kb + x * span, sk, vb + x * span, sv, whole ? n * nkh : nkh, D, pk, pv);
        else
            af_copy_any(kb + x * span, sk, vb + x * span, sv, whole ? (int64_t)n * span : span, pk, pv, kv);
    }
}

/* The K and V rows of keys [t0, t0 + nk) copied into kb / vb (span floats a key: the item's
 * span / D kv heads; keys span apart), kp / vp pointing at the copies: a block's rows are one
 * contiguous run of the pool, read at the memory's pace with the next block's lines
 * prefetched (keys up to nkeys have blocks in bt). */
static inline void af_tile_copy(const float* kbase, const float* vbase, const int64_t* bt, int block_size,
                                int64_t tok_stride, int span, int D, int64_t t0, int nk, int64_t nkeys, float* kb,
                                float* vb, const float** kp, const float** vp, int kv) {
    const int64_t nbt = (nkeys + block_size - 1) / block_size;
    for (int64_t b = t0 / block_size, i = t0 % block_size, j = 0; j < nk; b++, i = 0) {
        const int64_t off = (bt[b] * block_size + i) * tok_stride;
        const int n = block_size - i < nk - j ? (int)(block_size - i) : (int)(nk - j);
        const int64_t next = b + 1 < nbt ? bt[b + 1] * block_size * tok_stride : -1;
        af_copy_run(kb + j * span, vb + j * span, kbase, vbase, off, next, n, tok_stride, span, D, kv);
        for (int x = 0; x < n; x++) {
            kp[j + x] = kb + (j + x) * span;
            vp[j + x] = vb + (j + x) * span;
        }
        j += n;
        i += n;
    }
}

#endif
