/* float32 paged attention written once against vec.h (every ISA level), shared by
 * paged_decode_f32 (paged_decode.c) and paged_prefill_f32 (paged_prefill.c).
 *
 * One work item is a run of query tokens of one request and the G query heads of one
 * kv head: its rows (token-major, row = token * G + head) go flash-attention style
 * over tiles of AF_KT keys. Each tile's K and V rows are first copied, one memcpy per run
 * of a block, into per-thread buffers (plain copies stream the scattered blocks at the
 * memory's pace, with no compute between the loads); items whose heads span more than
 * AF_COPY_SPAN floats read the rows in place and prefetch them a tile ahead instead (both
 * ways in attn_f32_tiles.h):
 *   S = Q K^T     per row and VL keys: VL dot products, summed lane-wise by a
 *                 transpose-and-add tree (af_reduce_each), so no key tile is transposed;
 *   online softmax per row (running max and sum; the output rescaled when the max grows);
 *   O += P V      register blocks of up to 4 rows x AF_DV vectors.
 * Token i of the run sits at position ctx + i and sees keys [0, ctx + i] (causal over
 * the cache and the chunk's own earlier tokens), or with a sliding window W > 0 only
 * keys (ctx + i - W, ctx + i]: tiles start at the first token's first key, so keys
 * before it are never read (their blocks may be back in the pool). Decode is the run
 * of one token.
 *
 * Layouts: q rows q_stride floats apart (a view into the fused qkv output), heads of D
 * inside a row; out rows out_stride apart; caches [num_blocks, block_size, num_kv_heads, D].
 */
#ifndef INFLIGHT_ATTN_F32_H
#define INFLIGHT_ATTN_F32_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_simd.h"
#include "vec.h"

#define AF_KT 64         /* keys per tile */
#define AF_MAX_ROWS 64   /* query rows (tokens x heads of one kv head) per work item */
#define AF_MAX_D 256
#define AF_DV (VEC_REGS >= 32 ? 4 : 2) /* vectors of D per P.V register block */
#define AF_PAD(D) (((D) + VL - 1) / VL * VL)

#include "attn_f32_products.h"
#include "attn_f32_tiles.h"

#include "attn_f32_wide.h"  /* wide items (aw_attend): needs af_tile_copy */

/* Floats of per-thread scratch af_attend needs (aw_attend's layout takes no more) */
static inline int64_t af_scratch_floats(void) {
    return (int64_t)AF_MAX_ROWS * (2 * AF_PAD(AF_MAX_D) + AF_KT + 2) + 4 * AF_KT * (int64_t)(sizeof(void*) / sizeof(float) + 1)
        + 2 * AW_MAX_HEADS * AW_LD + 4 * AF_KT * AF_COPY_SPAN + 16;
}

/* aw_attend's scratch (AF_COPY_SPAN >= nkh * D floats of heads), less the tile buffers both
 * have, fits in af_attend's */
_Static_assert(AF_COPY_SPAN <= AF_MAX_D, "a wide item's heads must fit AF_MAX_D floats");
_Static_assert(2 * AF_MAX_D * AW_LD + AF_KT * AW_LD + (2 * AW_MAX_HEADS + 1) * AW_LD
               + 2 * AF_KT * (sizeof(void*) / sizeof(float))
               <= AF_MAX_ROWS * (2 * AF_PAD(AF_MAX_D) + AF_KT + 2) + 4 * AF_KT * (sizeof(void*) / sizeof(float) + 1)
               + 2 * AW_MAX_HEADS * AW_LD,
               "aw_attend's scratch layout does not fit af_scratch_floats");

/* Rows [r0, r1) of one kv head against one tile of nk keys starting at t0: scores, the
 * online softmax update and O += P V. qb/ob/sb/m/l: that head's query, output, score,
 * max and sum rows; ko: the head's offset inside the tile's K and V rows. */
static inline void af_tile(const float* qb, float* ob, float* sb, float* m, float* l, int r0, int r1, int G,
                           int D, int64_t ctx, int64_t window, int64_t t0, int nk, const float* const* kp,
                           const float* const* vp, int64_t ko) {
    const int Dp = AF_PAD(D), nkp = AF_PAD(nk);
    for (int r = r0; r < r1; r++) {
        const int64_t pos = ctx + r / G;
        const int nr = pos - t0 + 1 < nk ? (int)(pos - t0 + 1) : nk;  /* keys of the tile row r sees */
        const int jlo = window > 0 && pos - window + 1 > t0 ? (int)(pos - window + 1 - t0) : 0;  /* ... from */
        const float* qr = qb + (int64_t)r * Dp;
        float* s = sb + (int64_t)r * AF_KT;
        const int js = jlo / VL * VL;  /* whole vectors before the window are skipped */
        for (int j0 = 0; j0 < js; j0 += VL) AF_ST(s + j0, vf_zero());
        vf vmax = vf_set1(-INFINITY);
        for (int j0 = js; j0 < nr; j0 += VL) {
            const vf sc = af_keep_range(af_qk(qr, kp + j0, ko, D), jlo - j0, nr - j0, -INFINITY);
            AF_ST(s + j0, sc);
            vmax = vf_max(vmax, sc);
        }
        const float mnew = fmaxf(m[r], vf_reduce_max(vmax));
        const float alpha = expf(m[r] - mnew);  /* 0 on the first tile (m = -inf) */
        const vf vm = vf_set1(mnew);
        vf sum = vf_zero();
        int j0 = js;
        for (; j0 < nr; j0 += VL) {
            const vf x = AF_LD(s + j0) - vm;  /* -inf outside [jlo, nr) */
            const vf pr = jlo <= j0 && nr >= j0 + VL ? vf_exp(x) : vf_exp_where(af_range_mask(jlo - j0, nr - j0), x);
            AF_ST(s + j0, pr);
            sum += pr;
        }
        for (; j0 < nkp; j0 += VL) AF_ST(s + j0, vf_zero());  /* keys past this row's position */
        l[r] = l[r] * alpha + vf_reduce_add(sum);
        m[r] = mnew;
        if (alpha != 1.f) {
            float* o = ob + (int64_t)r * Dp;
            const vf va = vf_set1(alpha);
            for (int d = 0; d < Dp; d += VL) AF_ST(o + d, AF_LD(o + d) * va);
        }
    }
    af_pv_rows(ob, sb, r0, r1, Dp, D, vp, ko, nk);
}

/* An item's rows (head h's row r: token r / G of q, query head (kh0 + h) * G + r % G) at the
 * start: scaled queries zero-padded to Dp in qb, zero outputs in ob, running max -inf, sum 0. */
static inline void af_start_rows(const float* q, int64_t q_stride, int R, int G, int kh0, int nkh, int D, float scale,
                                 float* qb, float* ob, float* m, float* l) {
    const int Dp = AF_PAD(D);
    for (int h = 0; h < nkh; h++)
        for (int r = 0; r < R; r++) {
            const int hr = h * R + r;
            const float* qr = q + (int64_t)(r / G) * q_stride + (int64_t)((kh0 + h) * G + r % G) * D;
            for (int d = 0; d < D; d++) qb[(int64_t)hr * Dp + d] = qr[d] * scale;
            for (int d = D; d < Dp; d++) qb[(int64_t)hr * Dp + d] = 0.f;
            memset(ob + (int64_t)hr * Dp, 0, sizeof(float) * Dp);
            m[hr] = -INFINITY;
            l[hr] = 0.f;
        }
}

/* An item's rows at the end: each unnormalized output over its sum into out, or with a prior
 * (the shared prefix's part of the same row) the two parts merged at their common max. With
 * part (decode: one token), the item saw a part of the row's keys: each head's unnormalized
 * output, max and sum go to part + head * (D + 2) instead, for dk_merge (decode_f32.h). */
static inline void af_finish_rows(float* out, int64_t out_stride, int R, int G, int kh0, int nkh, int D,
                                  const float* ob, const float* m, const float* l, const float* prior, float* part) {
    const int Dp = AF_PAD(D);
    for (int h = 0; h < nkh; h++)
        for (int r = 0; r < R; r++) {
            const int hr = h * R + r;
            float* dst = out + (int64_t)(r / G) * out_stride + (int64_t)((kh0 + h) * G + r % G) * D;
            const float* o = ob + (int64_t)hr * Dp;
            if (part) {
                float* ps = part + (int64_t)((kh0 + h) * G + r % G) * (D + 2);
                memcpy(ps, o, sizeof(float) * (size_t)D);
                ps[D] = m[hr];
                ps[D + 1] = l[hr];
                continue;
            }
            if (prior) {  /* the two parts' softmax sums, rescaled to their common max */
                const float* pr = prior + (int64_t)((kh0 + h) * G + r % G) * (D + 2);
                const float mx = fmaxf(pr[D], m[hr]), a1 = expf(pr[D] - mx), a2 = expf(m[hr] - mx);
                const float inv = 1.f / (pr[D + 1] * a1 + l[hr] * a2);
                for (int d = 0; d < D; d++) dst[d] = (pr[d] * a1 + o[d] * a2) * inv;
                continue;
            }
            const vf inv = vf_set1(1.f / l[hr]);
            for (int d = 0; d < D; d += VL) vf_store_n(dst + d, AF_LD(o + d) * inv, D - d);
        }
}

/* One work item: ntok tokens of one request from q / out (the run's first token), the
 * query heads of kv heads [kh0, kh0 + nkh) (nkh * ntok * G <= AF_MAX_ROWS; or a wide item:
 * ntok * G in [AW_MIN_ROWS, AF_MAX_ROWS] and aw_heads_fit(nkh, D)); token i at
 * position ctx + i. bt: the request's block table row; window: the sliding window (0:
 * none); scratch: af_scratch_floats() floats. With prior (decode, ntok 1, no window),
 * keys [0, k0) were scored elsewhere (aw_shared_prefix): this item reads keys from k0 on
 * and merges its rows with prior's (head h's unnormalized output, max and sum at
 * prior + h * (D + 2)); else k0 is 0. kv: what the pools hold (enum af_kv); other than
 * float32, the item's heads must fit the tile buffers (nkh * D <= AF_COPY_SPAN). part: see
 * af_finish_rows (decode without prior; ctx + 1 is then the part's end, k0 its start).
 * NOTE: several kv heads per item read each key's rows of those heads together, one
 * contiguous run of the pool row: per-head items read a third of every row and the
 * hardware prefetcher fetches the rest anyway, so a decode from DRAM pays for it twice. */
static void af_attend_from(const float* q, int64_t q_stride, float* out, int64_t out_stride, int ntok, int64_t ctx,
                           int G, int kh0, int nkh, int D, const float* k_cache, const float* v_cache,
                           const int64_t* bt, int block_size, int64_t tok_stride, float scale, int64_t window,
                           int64_t k0, const float* prior, float* part, float* scratch, int kv) {
    if (ntok * G >= AW_MIN_ROWS && !prior && !part && aw_heads_fit(nkh, D)) {
        aw_attend(q, q_stride, out, out_stride, ntok, ctx, G, kh0, nkh, D, k_cache, v_cache, bt, block_size,
                  tok_stride, scale, window, scratch, kv);
        return;
    }
    const int R = ntok * G, Dp = AF_PAD(D);           /* rows per kv head */
    float* qb = scratch;                             /* [nkh][R][Dp] scaled queries, zero padded */
    float* ob = qb + (int64_t)AF_MAX_ROWS * Dp;      /* [nkh][R][Dp] unnormalized outputs */
    float* sb = ob + (int64_t)AF_MAX_ROWS * Dp;      /* [nkh][R][AF_KT] scores, then probabilities */
    float* m = sb + (int64_t)AF_MAX_ROWS * AF_KT;    /* running max per row */
    float* l = m + AF_MAX_ROWS;                      /* running sum per row */
    const float** kq[2], ** vq[2];  /* K and V rows of this tile and the next */
    kq[0] = (const float**)(l + AF_MAX_ROWS);
    vq[0] = kq[0] + AF_KT;
    kq[1] = vq[0] + AF_KT;
    vq[1] = kq[1] + AF_KT;
    const int span = nkh * D, copy = span <= AF_COPY_SPAN;  /* NOTE: always, for a bf16 or fp8 pool */
    float* kb[2], * vb[2];  /* the tile buffers when copying, 64-byte aligned */
    kb[0] = (float*)(((uintptr_t)(vq[1] + AF_KT) + 63) & ~(uintptr_t)63);
    vb[0] = kb[0] + AF_KT * AF_COPY_SPAN;
    kb[1] = vb[0] + AF_KT * AF_COPY_SPAN;
    vb[1] = kb[1] + AF_KT * AF_COPY_SPAN;
    af_start_rows(q, q_stride, R, G, kh0, nkh, D, scale, qb, ob, m, l);
    const int64_t nkeys = ctx + ntok;  /* the keys the last token sees */
    int64_t lo = window > 0 && ctx - window + 1 > 0 ? ctx - window + 1 : 0;  /* the first token's first key */
    lo = k0 > lo ? k0 : lo;
    const float* kbase = af_at(k_cache, (int64_t)kh0 * af_row(D, kv), kv);
    const float* vbase = af_at(v_cache, (int64_t)kh0 * af_row(D, kv), kv);
    if (copy)
        af_tile_copy(kbase, vbase, bt, block_size, tok_stride, span, D, lo,
                     nkeys - lo < AF_KT ? (int)(nkeys - lo) : AF_KT, nkeys, kb[0], vb[0], kq[0], vq[0], kv);
    else
        af_tile_rows(kbase, vbase, bt, block_size, tok_stride, nkh * D, lo,
                     nkeys - lo < AF_KT ? (int)(nkeys - lo) : AF_KT, kq[0], vq[0]);
    for (int64_t t0 = lo, cur = 0; t0 < nkeys; t0 += AF_KT, cur ^= 1) {
        const int nk = nkeys - t0 < AF_KT ? (int)(nkeys - t0) : AF_KT;
        const float** kp = kq[cur];
        const float** vp = vq[cur];
        if (t0 + AF_KT < nkeys && copy)  /* the next tile's rows, copied before this one is computed */
            af_tile_copy(kbase, vbase, bt, block_size, tok_stride, span, D, t0 + AF_KT,
                         nkeys - t0 - AF_KT < AF_KT ? (int)(nkeys - t0 - AF_KT) : AF_KT, nkeys, kb[cur ^ 1],
                         vb[cur ^ 1], kq[cur ^ 1], vq[cur ^ 1], kv);
        else if (t0 + AF_KT < nkeys)  /* the next tile's rows, prefetched while this one runs */
            af_tile_rows(kbase, vbase, bt, block_size, tok_stride, nkh * D, t0 + AF_KT,
                         nkeys - t0 - AF_KT < AF_KT ? (int)(nkeys - t0 - AF_KT) : AF_KT, kq[cur ^ 1], vq[cur ^ 1]);
        for (int j = nk; j < AF_PAD(nk); j++) kp[j] = kp[nk - 1];  /* read real rows; masked below */
        const int r0 = t0 > ctx ? (int)(t0 - ctx) * G : 0;  /* rows before r0 see none of this tile */
        /* rows from r1 on start their window past this tile; the rows between see >= 1 key of it */
        const int64_t ntok_seen = window > 0 ? t0 + nk + window - 1 - ctx : ntok;
        const int r1 = ntok_seen < ntok ? (int)ntok_seen * G : R;
        for (int h = 0; h < nkh; h++)
            af_tile(qb + (int64_t)h * R * Dp, ob + (int64_t)h * R * Dp, sb + (int64_t)h * R * AF_KT, m + h * R,
                    l + h * R, r0, r1, G, D, ctx, window, t0, nk, kp, vp, (int64_t)h * D);
    }
    af_finish_rows(out, out_stride, R, G, kh0, nkh, D, ob, m, l, prior, part);
}

/* af_attend_from over every key (no prior) */
static inline void af_attend(const float* q, int64_t q_stride, float* out, int64_t out_stride, int ntok, int64_t ctx,
                             int G, int kh0, int nkh, int D, const float* k_cache, const float* v_cache,
                             const int64_t* bt, int block_size, int64_t tok_stride, float scale, int64_t window,
                             float* scratch, int kv) {
    af_attend_from(q, q_stride, out, out_stride, ntok, ctx, G, kh0, nkh, D, k_cache, v_cache, bt, block_size,
                   tok_stride, scale, window, 0, NULL, NULL, scratch, kv);
}

#endif
