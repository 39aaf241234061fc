/* How float32 paged attention (attn_f32.h) reaches a tile's keys: each key's K and V rows
 * either pointed at in the pool and prefetched (af_tile_rows) or copied into per-thread tile
 * buffers a block's run at a time (af_tile_copy), from a float32 or a bfloat16 pool. Blocks
 * lie at random places in the pool, where the hardware prefetcher loses the stream: both ways
 * prefetch the next block themselves.
 */
#ifndef INFLIGHT_ATTN_F32_TILES_H
#define INFLIGHT_ATTN_F32_TILES_H
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"
#include "vec.h"

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

/* Element off of a pool that holds float32 (kv16 0) or bfloat16 (kv16 1) values. NOTE: a
 * bf16 pool travels as const float* like the float32 one; only this and the copies read it. */
static inline const float* af_at(const float* base, int64_t off, int kv16) {
    return kv16 ? (const float*)(const void*)((const uint16_t*)(const void*)base + off) : base + off;
}

/* the copy of n values from a pool of either kind into float32 */
static inline void af_copy_any(float* dk, const float* sk, float* dv, const float* sv, int64_t n, const float* pk,
                               const float* pv, int kv16) {
    if (kv16)
        af_copy_lines_bf16(dk, (const uint16_t*)(const void*)sk, dv, (const uint16_t*)(const void*)sv, n,
                           (const uint16_t*)(const void*)pk, (const uint16_t*)(const void*)pv);
    else
        af_copy_lines(dk, sk, dv, sv, n, pk, pv);
}

/* The K and V rows of keys [t0, t0 + nk) copied into kb / vb (span floats a key, keys
 * span apart), kp / vp pointing at the copies: a block's rows are one contiguous run of
 * the pool, read at the memory's pace with the next block's lines prefetched (keys up to
 * nkeys have blocks in bt). */
static inline void af_tile_copy(const float* kbase, const float* vbase, const int64_t* bt, int block_size,
                                int64_t tok_stride, int span, int64_t t0, int nk, int64_t nkeys, float* kb, float* vb,
                                const float** kp, const float** vp, int kv16) {
    const int64_t nbt = (nkeys + block_size - 1) / block_size;
    for (int64_t b = t0 / block_size, i = t0 % block_size, j = 0; j < nk; b++, i = 0) {
        const int64_t off = (bt[b] * block_size + i) * tok_stride;
        const int n = block_size - i < nk - j ? (int)(block_size - i) : (int)(nk - j);
        const int64_t next = b + 1 < nbt ? bt[b + 1] * block_size * tok_stride : -1;
        if (tok_stride == span) {  /* the rows of the run are contiguous: one copy each */
            af_copy_any(kb + j * span, af_at(kbase, off, kv16), vb + j * span, af_at(vbase, off, kv16),
                        (int64_t)n * span, next >= 0 ? af_at(kbase, next, kv16) : NULL,
                        next >= 0 ? af_at(vbase, next, kv16) : NULL, kv16);
        } else {  /* a row's span at a time, the same part of the next block's row prefetched */
            for (int x = 0; x < n; x++)
                af_copy_any(kb + (j + x) * span, af_at(kbase, off + x * tok_stride, kv16), vb + (j + x) * span,
                            af_at(vbase, off + x * tok_stride, kv16), span,
                            next >= 0 ? af_at(kbase, next + (int64_t)x * tok_stride, kv16) : NULL,
                            next >= 0 ? af_at(vbase, next + (int64_t)x * tok_stride, kv16) : NULL, kv16);
        }
        for (int x = 0; x < n; x++) {
            kp[j + x] = kb + (j + x) * span;
            vp[j + x] = vb + (j + x) * span;
        }
        j += n;
        i += n;
    }
}

#endif
