/* Which requests of a float32 decode step share a cached prefix, for cascade attention
 * (aw_shared_prefix in attn_f32_wide.h): requests whose block tables start with the same
 * blocks (prefix caching hands them the same block ids) are grouped, and each group's
 * common blocks become wide items with the requests' heads as lanes.
 *
 * A group needs enough requests that an item has min_rows rows (the float32 wide items'
 * AW_MIN_ROWS; the bf16 kernel passes its own), and at least a tile
 * of common keys; it leaves every request at least one key of its own (the new token's),
 * so each request's own item always has a key to merge. Groups larger than an item are
 * split into near-equal chunks of at most max_rows / G requests.
 */
#ifndef INFLIGHT_SHARED_PREFIX_H
#define INFLIGHT_SHARED_PREFIX_H
#include <stdint.h>
#include <stdlib.h>

struct sp_chunk {
    int start, n;        /* requests order[start .. start + n) */
    int64_t prefix;      /* keys [0, prefix) they share */
};

struct sp_plan {
    int n_chunks;
    int* order;          /* [num_seqs] grouped requests, chunk by chunk */
    int* slot;           /* [num_seqs] a request's index in order; -1: not grouped */
    int64_t* k0;         /* [num_seqs] the first key of the request's own item */
    struct sp_chunk* chunks;
};

struct sp_key {
    int64_t first;       /* the first block id */
    int s;
};

static int sp_cmp(const void* a, const void* b) {
    const struct sp_key* x = a, * y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->s - y->s;
}

/* The blocks requests order[a .. b) have in common at the start of their tables, at most
 * `limit` */
static int64_t sp_common_blocks(const int64_t* bt, int64_t bt_stride, const int* order, int a, int b, int64_t limit) {
    const int64_t* first = bt + (int64_t)order[a] * bt_stride;
    for (int i = a + 1; i < b && limit > 0; i++) {
        const int64_t* row = bt + (int64_t)order[i] * bt_stride;
        int64_t j = 0;
        while (j < limit && row[j] == first[j]) j++;
        limit = j;
    }
    return limit;
}

#define SP_BUCKETS 256

/* requests a group needs: min_rows query rows, and two at least (one alone shares nothing) */
static inline int sp_min_requests(int min_rows, int G) {
    const int n = (min_rows + G - 1) / G;
    return n > 2 ? n : 2;
}

/* Whether sp_make can find a group at all: some first block held by enough requests. Requests
 * with the same first block land in one bucket of their ids, so a step whose buckets all hold
 * fewer than a group's least requests (most steps without prefix caching hits) skips the sort. */
static int sp_may_group(const int64_t* bt, int64_t bt_stride, const int64_t* seq_lens, int num_seqs, int G,
                        int min_rows) {
    const int min_n = sp_min_requests(min_rows, G);
    int count[SP_BUCKETS] = {0};
    for (int s = 0; s < num_seqs; s++)
        if (seq_lens[s] > AF_KT && ++count[(uint64_t)bt[(int64_t)s * bt_stride] % SP_BUCKETS] >= min_n) return 1;
    return 0;
}

/* The plan for one step (sp_free releases it); no chunks where no group qualifies. */
static struct sp_plan sp_make(const int64_t* bt, int64_t bt_stride, const int64_t* seq_lens, int num_seqs, int G,
                              int block_size, int min_rows, int max_rows) {
    struct sp_plan p = {0, malloc(sizeof(int) * (size_t)num_seqs), malloc(sizeof(int) * (size_t)num_seqs),
                        calloc((size_t)num_seqs, sizeof(int64_t)), malloc(sizeof(struct sp_chunk) * (size_t)num_seqs)};
    struct sp_key* keys = malloc(sizeof(struct sp_key) * (size_t)num_seqs);
    int nk = 0;
    for (int s = 0; s < num_seqs; s++) {
        p.slot[s] = -1;
        if (seq_lens[s] > AF_KT) keys[nk++] = (struct sp_key){bt[(int64_t)s * bt_stride], s};
    }
    qsort(keys, (size_t)nk, sizeof keys[0], sp_cmp);
    const int min_n = sp_min_requests(min_rows, G), max_n = max_rows / G;
    int used = 0;
    for (int a = 0, b; a < nk; a = b) {
        for (b = a + 1; b < nk && keys[b].first == keys[a].first; b++) {}
        if (b - a < min_n || max_n < min_n) continue;
        int64_t limit = INT64_MAX;  /* whole blocks before each request's last key */
        for (int i = a; i < b; i++) {
            p.order[used + i - a] = keys[i].s;
            const int64_t own = (seq_lens[keys[i].s] - 1) / block_size;
            limit = own < limit ? own : limit;
        }
        const int64_t prefix = sp_common_blocks(bt, bt_stride, p.order, used, used + b - a, limit) * block_size;
        if (prefix < AF_KT) continue;
        const int n = b - a, nch = (n + max_n - 1) / max_n;
        for (int c = 0, start = used; c < nch; c++) {
            const int size = n / nch + (c < n % nch);
            p.chunks[p.n_chunks++] = (struct sp_chunk){start, size, prefix};
            start += size;
        }
        for (int i = used; i < used + n; i++) {
            p.slot[p.order[i]] = i;
            p.k0[p.order[i]] = prefix;
        }
        used += n;
    }
    free(keys);
    return p;
}

static void sp_free(struct sp_plan* p) {
    free(p->order);
    free(p->slot);
    free(p->k0);
    free(p->chunks);
}

#endif
