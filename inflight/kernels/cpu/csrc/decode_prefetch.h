/* Reading ahead in bf16 paged decode (decode_core.h): a sequence's K and V blocks warmed
 * before its passes, or another sequence's lines prefetched a few at a time from inside the
 * current one's passes, and the size of the parts a long sequence is cut into. */
#ifndef INFLIGHT_DECODE_PREFETCH_H
#define INFLIGHT_DECODE_PREFETCH_H
#include <stdint.h>

#include "bf16_simd.h"

#if defined(INFLIGHT_ISA_AVX512_BF16)
/* K and V bytes of a sequence warm_blocks reads ahead at most (their sum): more than L2, as
 * the lines L2 evicts stay in L3; past about twice L2 reading ahead no longer paid */
#define WARM_MAX_BYTES (2048 * 1024)
/* K and V bytes of a part of a long sequence in decode at most: a thread holds its part and
 * the next one it prefetches in L2 at once */
#define LONG_PART_BYTES (512 * 1024)

/* The keys of such a part (bf16 K and V rows of tok_stride values): whole blocks, one at least */
static inline int64_t long_part_keys(int64_t tok_stride, int block_size) {
    const int64_t keys = LONG_PART_BYTES / (tok_stride * 4) / block_size * block_size;
    return keys > block_size ? keys : block_size;
}

/* The K and V of a sequence's nblk blocks (blk elements each) read once, in order, a line at
 * a time with the next block's lines prefetched, before the passes: the whole rows of every
 * kv head then come from the caches. The passes alone read one head's part of each scattered
 * row at a time, which the memory serves more slowly. */
static inline void warm_blocks(const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* bt, int64_t nblk,
                               int64_t blk) {
    __m512i acc = _mm512_setzero_si512();
    for (int64_t b = 0; b < nblk; b++) {
        const char* k = (const char*)(k_cache + bt[b] * blk), * v = (const char*)(v_cache + bt[b] * blk);
        const char* kn = b + 1 < nblk ? (const char*)(k_cache + bt[b + 1] * blk) : NULL;
        const char* vn = b + 1 < nblk ? (const char*)(v_cache + bt[b + 1] * blk) : NULL;
        for (int64_t off = 0; off < blk * 2; off += 64) {
            if (kn) {
                _mm_prefetch(kn + off, _MM_HINT_T0);
                _mm_prefetch(vn + off, _MM_HINT_T0);
            }
            acc = _mm512_or_si512(acc, _mm512_loadu_si512(k + off));
            acc = _mm512_or_si512(acc, _mm512_loadu_si512(v + off));
        }
    }
    volatile int32_t sink = _mm_cvtsi128_si32(_mm512_castsi512_si128(acc));  /* keeps the loads: they are the point */
    (void)sink;
}

/* The lines of another sequence's K and V blocks (the next one this thread takes), handed
 * out a few at a time from inside the current sequence's score and exp passes: its reads from DRAM
 * then overlap the current one's arithmetic instead of waiting in warm_blocks after it. */
struct pf_cursor {
    const char *k, *v;
    const int64_t* bt;
    int64_t nblk, blk_bytes, b, off;
};

static inline struct pf_cursor pf_cursor_of(const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* bt,
                                            int64_t len, int block_size, int64_t tok_stride) {
    const struct pf_cursor c = {(const char*)k_cache, (const char*)v_cache, bt, (len + block_size - 1) / block_size,
                                block_size * tok_stride * 2, 0, 0};
    return c;
}

/* the cursor's next n lines of K and of V, into L2 */
static inline void pf_advance(struct pf_cursor* c, int n) {
    for (; n > 0 && c->b < c->nblk; n--) {
        const int64_t at = c->bt[c->b] * c->blk_bytes + c->off;
        _mm_prefetch(c->k + at, _MM_HINT_T1);
        _mm_prefetch(c->v + at, _MM_HINT_T1);
        c->off += 64;
        if (c->off == c->blk_bytes) {
            c->off = 0;
            c->b++;
        }
    }
}

#endif
#endif
