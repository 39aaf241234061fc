/*
 * The running argmax that the fp32 and bf16 GEMMs' argmax epilogues share: each thread's
 * group of panels keeps one struct best per row over its columns, and the groups are
 * reduced in column order at the end. Included by gemm_f32.c and gemm_bf16.c.
 */
#ifndef INFLIGHT_ARGMAX_BEST_H
#define INFLIGHT_ARGMAX_BEST_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* a row's running argmax over the outputs seen so far; allow: the row's grammar
 * bitmask (bit c % 32 of word c / 32 set: column c may win), NULL = every column */
struct best {
    float val;
    int64_t idx;
    const int32_t* allow;
};

/* v takes the place of the running best cur: larger, or the first NaN (torch.argmax ranks NaN
 * above every number, so the first NaN wins and nothing after it does) */
static inline int best_beats(float v, float cur) { return v > cur || (v != v && cur == cur); }

static inline int allowed(const int32_t* allow, int64_t c) {
    return !allow || (((uint32_t)allow[c >> 5] >> (c & 31)) & 1u);
}

/* groups x M fresh running argmaxes (group g's for row m at g * M + m), each row with its
 * mask row (mask_rows[m] < 0, or no bitmask: every column); NULL when out of memory */
static struct best* best_alloc(int64_t M, int groups, const int32_t* bitmask, int64_t words,
                               const int64_t* mask_rows) {
    struct best* all = (struct best*)malloc(sizeof(struct best) * (size_t)M * (size_t)groups);
    if (!all) return NULL;
    for (int64_t i = 0; i < M * groups; i++) {
        const int64_t r = bitmask ? mask_rows[i % M] : -1;
        all[i] = (struct best){-INFINITY, -1, r >= 0 ? bitmask + r * words : NULL};
    }
    return all;
}

/* tokens[m] = row m's argmax over the first `groups` groups, then frees all. The groups
 * hold increasing column ranges: a later one wins only when strictly greater (or the first
 * NaN). A row with no winner (nothing allowed, or every allowed output -inf) gets 0. */
static void best_reduce(struct best* all, int64_t M, int groups, int64_t* tokens) {
    for (int64_t m = 0; m < M; m++) {
        struct best b = all[m];
        for (int g = 1; g < groups; g++)
            if (best_beats(all[(int64_t)g * M + m].val, b.val)) b = all[(int64_t)g * M + m];
        tokens[m] = b.idx < 0 ? 0 : b.idx;
    }
    free(all);
}

#endif
