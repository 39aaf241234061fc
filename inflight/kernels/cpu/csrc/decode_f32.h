/* float32 paged decode on every ISA level (paged_decode_f32 and its variants, paged_decode.c):
 * attn_f32.h's tiles with one query token per work item.
 *
 * With enough sequences to keep the threads busy, a work item is a whole sequence: every kv
 * head in one pass over its keys, so each pool row is read whole and once. With few, whole
 * sequences would leave threads idle, so each sequence's keys are cut into parts of whole
 * rows (flash-decoding's split over the context): every thread still streams whole rows,
 * and the parts' softmax states merge after (a sliding window only narrows the keys cut).
 * Where parts do not apply (requests grouped by a shared prefix, heads too wide for one
 * item) an item is one (sequence, kv head) instead, which reads a third of each row
 * (af_attend_from's NOTE).
 * Without a window, requests that share cached prefix blocks first score them together
 * (shared_prefix.h); their own items then read only the keys after the prefix.
 */
#ifndef INFLIGHT_DECODE_F32_H
#define INFLIGHT_DECODE_F32_H
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_f32.h"
#include "shared_prefix.h"

#define DK_ITEMS_PER_THREAD 4    /* work items per thread, at least, for the dynamic schedule to balance */
#define DK_MIN_PART (2 * AF_KT)  /* keys of a part, at least: its start and merge are per-part costs */

struct dk_part {
    int s;
    int64_t lo, hi;  /* keys [lo, hi) of sequence s */
    int slot;        /* its state's index; -1: the sequence's only part, written to out */
};

struct dk_parts {
    int n, n_states;
    struct dk_part* item;  /* [n], each sequence's parts in key order, sequence by sequence */
    int* first;            /* [num_seqs + 1] a sequence's first part */
};

/* The first key sequence s's query sees: window > 0 sees keys (pos - window, pos] of its pos */
static inline int64_t dk_first_key(const int64_t* seq_lens, int s, int64_t window) {
    return window > 0 && seq_lens[s] > window ? seq_lens[s] - window : 0;
}

/* Parts of about equal keys, DK_ITEMS_PER_THREAD * n_threads of them over the step, each
 * starting at a multiple of align keys past the window's first key */
static struct dk_parts dk_make(const int64_t* seq_lens, int num_seqs, int n_threads, int64_t window, int align) {
    const int target = DK_ITEMS_PER_THREAD * n_threads;
    int64_t total = 0;
    for (int s = 0; s < num_seqs; s++) total += seq_lens[s] > 0 ? seq_lens[s] - dk_first_key(seq_lens, s, window) : 0;
    int64_t chunk = (total + target - 1) / target;
    chunk = ((chunk > DK_MIN_PART ? chunk : DK_MIN_PART) + align - 1) / align * align;
    /* NOTE: sum(ceil(len / chunk)) <= total / chunk + num_seqs <= target + num_seqs */
    struct dk_parts p = {0, 0, malloc(sizeof(struct dk_part) * (size_t)(target + num_seqs)),
                         malloc(sizeof(int) * (size_t)(num_seqs + 1))};
    for (int s = 0; s < num_seqs; s++) {
        const int64_t k0 = dk_first_key(seq_lens, s, window), len = seq_lens[s] - k0;
        const int64_t n = len > 0 ? (len + chunk - 1) / chunk : 0;
        p.first[s] = p.n;
        for (int64_t i = 0; i < n; i++)
            p.item[p.n++] = (struct dk_part){s, k0 + i * chunk, k0 + ((i + 1) * chunk < len ? (i + 1) * chunk : len),
                                             n > 1 ? p.n_states++ : -1};
    }
    p.first[num_seqs] = p.n;
    return p;
}

/* Each sequence in parts of about equal keys, at most max_keys (a multiple of align) each */
static struct dk_parts dk_split(const int64_t* seq_lens, int num_seqs, int64_t max_keys, int align) {
    int64_t total = 0;
    for (int s = 0; s < num_seqs; s++) total += seq_lens[s] > 0 ? (seq_lens[s] + max_keys - 1) / max_keys : 0;
    struct dk_parts p = {0, 0, malloc(sizeof(struct dk_part) * (size_t)(total > 0 ? total : 1)),
                         malloc(sizeof(int) * (size_t)(num_seqs + 1))};
    for (int s = 0; s < num_seqs; s++) {
        const int64_t len = seq_lens[s] > 0 ? seq_lens[s] : 0, want = (len + max_keys - 1) / max_keys;
        const int64_t chunk = want ? ((len + want - 1) / want + align - 1) / align * align : 1;
        const int64_t n = (len + chunk - 1) / chunk;  /* <= want: chunk <= max_keys, as max_keys % align == 0 */
        p.first[s] = p.n;
        for (int64_t i = 0; i < n; i++)
            p.item[p.n++] = (struct dk_part){s, i * chunk, (i + 1) * chunk < len ? (i + 1) * chunk : len,
                                             n > 1 ? p.n_states++ : -1};
    }
    p.first[num_seqs] = p.n;
    return p;
}

/* n parts' states of one sequence (num_heads rows of D + 2 floats each) merged into its output
 * row, out or (a bf16 model) out16: each head's outputs rescaled to the parts' common max, over
 * their rescaled sums */
static void dk_merge(const float* states, int n, int num_heads, int D, float* out, uint16_t* out16) {
    const int64_t srow = (int64_t)num_heads * (D + 2);
    float acc[AF_MAX_D];
    for (int h = 0; h < num_heads; h++) {
        const float* st = states + (int64_t)h * (D + 2);
        float mx = -INFINITY, sum = 0.f;
        for (int i = 0; i < n; i++) mx = fmaxf(mx, st[i * srow + D]);
        memset(acc, 0, sizeof(float) * (size_t)D);
        for (int i = 0; i < n; i++) {
            const float* ps = st + i * srow, a = expf(ps[D] - mx);
            sum += ps[D + 1] * a;
            for (int d = 0; d < D; d++) acc[d] += ps[d] * a;
        }
        const float inv = 1.f / sum;
        for (int d = 0; d < D; d++) {
            if (out16) out16[(int64_t)h * D + d] = f32_to_bf16(acc[d] * inv);
            else out[(int64_t)h * D + d] = acc[d] * inv;
        }
    }
}

/* Inside a parallel region, after every part's state is written: each sequence of several
 * parts merged into its output row (out or out16, rows `row` elements apart) */
static void dk_merge_parts(const struct dk_parts* p, const float* states, int num_seqs, int num_heads, int D,
                           float* out, uint16_t* out16) {
    const int64_t srow = (int64_t)num_heads * (D + 2), row = (int64_t)num_heads * D;
    _Pragma("omp for schedule(dynamic, 1)")
    for (int s = 0; s < num_seqs; s++)
        if (p->first[s + 1] - p->first[s] > 1)
            dk_merge(states + p->item[p->first[s]].slot * srow, p->first[s + 1] - p->first[s], num_heads, D,
                     out16 ? NULL : out + s * row, out16 ? out16 + s * row : NULL);
}

static void dk_free(struct dk_parts* p) {
    free(p->item);
    free(p->first);
}

/* Few sequences and no shared-prefix groups: items are parts of whole rows. A part is a plain
 * causal run of keys [lo, hi) (its query placed at hi - 1): the window only moved lo. */
static void decode_f32_parts(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                             const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, float* out,
                             int num_seqs, int num_heads, int num_kv_heads, int D, int block_size, float scale,
                             int64_t window, int kv) {
    const int G = num_heads / num_kv_heads;
    const int64_t tok_stride = (int64_t)num_kv_heads * af_row(D, kv), row = (int64_t)num_heads * D;
    const int64_t srow = (int64_t)num_heads * (D + 2);
    struct dk_parts p = dk_make(seq_lens, num_seqs, omp_get_max_threads(), window, AF_KT);
    float* states = p.n_states ? malloc(sizeof(float) * (size_t)(p.n_states * srow)) : NULL;
    _Pragma("omp parallel")
    {
        float* scratch = (float*)malloc(sizeof(float) * (size_t)af_scratch_floats());
        _Pragma("omp for schedule(dynamic, 1)")
        for (int i = 0; i < p.n; i++) {
            const struct dk_part it = p.item[i];
            af_attend_from(q + (int64_t)it.s * q_stride, q_stride, out + (int64_t)it.s * row, row, 1, it.hi - 1, G,
                           0, num_kv_heads, D, k_cache, v_cache, block_tables + (int64_t)it.s * bt_stride,
                           block_size, tok_stride, scale, 0, it.lo, NULL,
                           it.slot >= 0 ? states + it.slot * srow : NULL, scratch, kv);
        }  /* NOTE: the implicit barrier here: every part's state is written before its sequence merges */
        dk_merge_parts(&p, states, num_seqs, num_heads, D, out, NULL);
        free(scratch);
    }
    free(states);
    dk_free(&p);
}

/* The float32 decode of every variant; window > 0: the sliding window (paged_decode_f32_sw). */
static void decode_f32(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, float* out,
                       int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                       int64_t window, int kv) {
    const int G = num_heads / num_kv_heads, D = head_dim;
    const int64_t tok_stride = (int64_t)num_kv_heads * af_row(D, kv);
    /* a bf16 or fp8 pool is always copied (widened), so a whole row must fit the tile buffers */
    const int rows_fit = num_heads <= AF_MAX_ROWS && (kv == AF_KV_F32 || num_kv_heads * D <= AF_COPY_SPAN);
    const int few = num_seqs < DK_ITEMS_PER_THREAD * omp_get_max_threads();
    struct sp_plan plan = {0};
    if (window == 0 && sp_may_group(block_tables, bt_stride, seq_lens, num_seqs, G, AW_MIN_ROWS))
        plan = sp_make(block_tables, bt_stride, seq_lens, num_seqs, G, block_size, AW_MIN_ROWS, AF_MAX_ROWS);
    if (rows_fit && few && plan.n_chunks == 0) {
        sp_free(&plan);
        decode_f32_parts(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs, num_heads,
                         num_kv_heads, D, block_size, scale, window, kv);
        return;
    }
    const int per = rows_fit && !few ? num_kv_heads : 1;  /* kv heads per item */
    const int n_items = num_seqs * (num_kv_heads / per);
    /* the grouped requests' queries, gathered in plan order, and their prefix parts */
    const int64_t row = (int64_t)num_heads * D, srow = (int64_t)num_heads * (D + 2);
    const int grouped = plan.n_chunks ? plan.chunks[plan.n_chunks - 1].start + plan.chunks[plan.n_chunks - 1].n : 0;
    float* qg = grouped ? malloc(sizeof(float) * (size_t)(grouped * row)) : NULL;
    float* state = grouped ? malloc(sizeof(float) * (size_t)(grouped * srow)) : NULL;
    for (int i = 0; i < grouped; i++) memcpy(qg + i * row, q + (int64_t)plan.order[i] * q_stride, sizeof(float) * (size_t)row);
    const int n_shared = plan.n_chunks * num_kv_heads;
    _Pragma("omp parallel")
    {
        float* scratch = (float*)malloc(sizeof(float) * (size_t)af_scratch_floats());
        if (n_shared > 0) {  /* the same on every thread; without groups, no second barrier */
            _Pragma("omp for schedule(dynamic, 1)")
            for (int item = 0; item < n_shared; item++) {
                const struct sp_chunk c = plan.chunks[item / num_kv_heads];
                aw_shared_prefix(qg + c.start * row, row, c.n, c.prefix, G, item % num_kv_heads, D, k_cache,
                                 v_cache, block_tables + (int64_t)plan.order[c.start] * bt_stride, block_size,
                                 tok_stride, scale, state + c.start * srow, srow, scratch, kv);
            }  /* NOTE: the implicit barrier here: every prior is written before an item merges it */
        }
        _Pragma("omp for schedule(dynamic, 1)")
        for (int item = 0; item < n_items; item++) {
            const int s = item / (num_kv_heads / per), kh0 = item % (num_kv_heads / per) * per;
            const int slot = plan.n_chunks ? plan.slot[s] : -1;
            if (seq_lens[s] > 0)
                af_attend_from(q + (int64_t)s * q_stride, q_stride, out + (int64_t)s * row, row, 1, seq_lens[s] - 1,
                               G, kh0, per, D, k_cache, v_cache, block_tables + (int64_t)s * bt_stride, block_size,
                               tok_stride, scale, window, slot >= 0 ? plan.k0[s] : 0,
                               slot >= 0 ? state + slot * srow : NULL, NULL, scratch, kv);
        }
        free(scratch);
    }
    free(qg);
    free(state);
    sp_free(&plan);
}

#endif
