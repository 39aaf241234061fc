/* Wide work items of float32 paged attention (included by attn_f32.h): runs of many
 * query rows, such as prefill chunks. af_tile takes a row at a time and reloads every
 * key from L1 for each row it scores; here the item's rows are the vector lanes, and a
 * tile is two small matrix products in register blocks (as gemm_f32.c's microkernel):
 *   S^T[j][r]  = sum_d K[j][d] Q^T[d][r]    Q^T: the item's scaled queries, transposed once
 *   O^T[d][r] += sum_j V[j][d] P^T[j][r]
 * The online softmax runs across lanes too, a running max and sum per lane (row), and the
 * causal and window masks compare each key's index with a per-lane limit.
 * Every sum stays inside one row, so a row's result does not depend on the other rows of
 * its item; it differs from af_tile's in the order of the d sum (last bits only).
 *
 * An item may take several kv heads (nkh, their rows together at most AF_COPY_SPAN floats):
 * each tile then copies whole runs of the pool's rows, one contiguous memcpy a block, and
 * every head's products read its part of the copy. Copying one head's part of each row
 * instead (a short strided copy a key, waiting on L3) took nearly half as long as the
 * products themselves.
 *
 * Scratch (af_scratch_floats): Q^T, O^T [nkh][D][AW_LD], S^T [AF_KT][AW_LD], then the
 * per-lane max and sum of each head, the per-lane position, the tile pointers and the tile
 * buffers as af_attend has them.
 *
 * A decode step whose requests share a cached prefix (the same first blocks) scores it in
 * wide items too (aw_shared_prefix: the requests' heads as lanes), cascade attention: the
 * prefix's keys are read once for up to AF_MAX_ROWS rows instead of once per request,
 * and each request's own keys then merge in through af_attend's `prior`.
 */
#ifndef INFLIGHT_ATTN_F32_WIDE_H
#define INFLIGHT_ATTN_F32_WIDE_H

#if VL == 16
#define AW_MR 12  /* register block: AW_MR rows of the left operand x AW_NV vectors of lanes */
#define AW_NV 2
#elif VEC_REGS >= 32
#define AW_MR 6
#define AW_NV 4
#else
#define AW_MR 6
#define AW_NV 2
#endif
#define AW_RB (AW_NV * VL)  /* lanes per register block; divides AF_MAX_ROWS */
#define AW_LD AF_MAX_ROWS   /* lanes per row of Q^T, O^T and S^T */
#define AW_MIN_ROWS 32      /* items with fewer rows go through af_tile */
#define AW_MAX_HEADS 8      /* kv heads per wide item, at most */
#define AW_UNROLL _Pragma("GCC unroll 16")

_Static_assert(AW_MR * AW_NV + AW_NV + 1 <= VEC_REGS, "the register block does not fit the vector registers");
_Static_assert(AW_LD % AW_RB == 0, "lane blocks must tile the rows");

/* c[i][0 .. AW_RB) (+)= sum_k a[i * as + k * ks] * b[k][0 .. AW_RB) for the R rows i; rows of
 * b and c AW_LD apart. With R a constant every accumulator index is one, so they stay in registers. */
static inline __attribute__((always_inline)) void aw_micro(const int R, const int load, const float* a, int64_t as,
                                                           int64_t ks, const float* b, int64_t n, float* c) {
    vf acc[AW_MR][AW_NV];
    AW_UNROLL for (int r = 0; r < R; r++)
        AW_UNROLL for (int i = 0; i < AW_NV; i++) acc[r][i] = load ? AF_LD(c + r * AW_LD + i * VL) : vf_zero();
    _Pragma("GCC unroll 2")
    for (int64_t k = 0; k < n; k++) {
        vf w[AW_NV];
        AW_UNROLL for (int i = 0; i < AW_NV; i++) w[i] = AF_LD(b + k * AW_LD + i * VL);
        AW_UNROLL for (int r = 0; r < R; r++) {
            const vf av = vf_set1(a[r * as + k * ks]);
            AW_UNROLL for (int i = 0; i < AW_NV; i++) acc[r][i] = vf_fma(av, w[i], acc[r][i]);
        }
    }
    AW_UNROLL for (int r = 0; r < R; r++)
        AW_UNROLL for (int i = 0; i < AW_NV; i++) AF_ST(c + r * AW_LD + i * VL, acc[r][i]);
}

/* c rows [0, rows) over lanes [l0, l1) (multiples of AW_RB): c = (load ? c : 0) + A b, with
 * A[i][k] = a[i * as + k * ks] for k < n */
static void aw_gemm(int rows, int load, const float* a, int64_t as, int64_t ks, const float* b, int64_t n, float* c,
                    int l0, int l1) {
    for (int i = 0; i < rows; i += AW_MR) {
        const int R = rows - i < AW_MR ? rows - i : AW_MR;
        const float* ai = a + (int64_t)i * as;
        for (int l = l0; l < l1; l += AW_RB) {
            float* ci = c + (int64_t)i * AW_LD + l;
#define AW_CASE(r) case r: { if (load) aw_micro(r, 1, ai, as, ks, b + l, n, ci); \
                             else aw_micro(r, 0, ai, as, ks, b + l, n, ci); } break;
            switch (R) {
                AW_CASE(1) AW_CASE(2) AW_CASE(3) AW_CASE(4) AW_CASE(5) AW_CASE(6)
#if AW_MR > 6
                AW_CASE(7) AW_CASE(8) AW_CASE(9) AW_CASE(10) AW_CASE(11) AW_CASE(12)
#endif
            }
#undef AW_CASE
        }
    }
}

/* The online softmax of one tile for the lanes [l0, l1): masks keys a row must not see
 * (key t0 + j is visible to lane r iff pos[r] - window < t0 + j <= pos[r]) when `mask`,
 * turns S^T into P^T, and rescales the running sums and O^T rows (D of them). */
static void aw_softmax(float* st, int nk, float* m, float* l, const float* pos, float* ot, int D, int l0, int l1,
                       int64_t t0, int64_t window, int mask) {
    const vf ninf = vf_set1(-INFINITY), zero = vf_zero();
    for (int c = l0; c < l1; c += VL) {
        const vf last = AF_LD(pos + c) - (float)t0;  /* the last key index of the tile each lane sees */
        const vf first = window > 0 ? last - (float)(window - 1) : vf_set1(-1.f);
        vf vmax[4] = {ninf, ninf, ninf, ninf};  /* four chains: a max's latency, not its rate, bound one */
        for (int j = 0; j < nk; j++) {
            vf s = AF_LD(st + (int64_t)j * AW_LD + c);
            if (mask) {
                const vf jf = vf_set1((float)j);
                s = af_select((jf <= last) & (jf >= first), s, ninf);
                AF_ST(st + (int64_t)j * AW_LD + c, s);
            }
            vmax[j % 4] = vf_max(vmax[j % 4], s);
        }
        const vf mold = AF_LD(m + c), mnew = vf_max(mold, vf_max(vf_max(vmax[0], vmax[1]), vf_max(vmax[2], vmax[3])));
        const vf msafe = af_select(mnew > ninf, mnew, zero);  /* a lane that has seen no key yet */
        const vf alpha = vf_exp_where(mold > ninf, mold - msafe);
        vf sum = zero;
        for (int j = 0; j < nk; j++) {
            const vf s = AF_LD(st + (int64_t)j * AW_LD + c);
            const vf p = mask ? vf_exp_where(s > ninf, s - msafe) : vf_exp(s - msafe);
            AF_ST(st + (int64_t)j * AW_LD + c, p);
            sum += p;
        }
        AF_ST(l + c, AF_LD(l + c) * alpha + sum);
        AF_ST(m + c, mnew);
        /* NOTE: where no lane's max moved, alpha is e^0 = 1 exactly (or 0 on a lane that has seen
         * no key, whose O^T is still 0): the rescale would change nothing */
        if (!vf_all_eq(mnew, mold))
            for (int d = 0; d < D; d++) AF_ST(ot + (int64_t)d * AW_LD + c, AF_LD(ot + (int64_t)d * AW_LD + c) * alpha);
    }
}

/* Whether a wide item can take nkh kv heads of D together */
static inline int aw_heads_fit(int nkh, int D) { return nkh >= 1 && nkh <= AW_MAX_HEADS && nkh * D <= AF_COPY_SPAN; }

/* A wide item's scratch: Q^T and O^T [nkh][D][AW_LD], S^T [AF_KT][AW_LD], the running max
 * and sum [nkh][AW_LD], the position per lane, then the tile pointers and buffers (from
 * `tiles` on). Head h's Q^T is qt + h * D * AW_LD, its max m + h * AW_LD (O^T, l alike). */
struct aw_bufs {
    float* qt, * ot, * st, * m, * l, * pos;
    void* tiles;
};

static inline struct aw_bufs aw_layout(float* scratch, int nkh, int D) {
    const int64_t span = (int64_t)nkh * D;
    struct aw_bufs b;
    b.qt = scratch;
    b.ot = b.qt + span * AW_LD;
    b.st = b.ot + span * AW_LD;
    b.m = b.st + (int64_t)AF_KT * AW_LD;
    b.l = b.m + (int64_t)nkh * AW_LD;
    b.pos = b.l + (int64_t)nkh * AW_LD;
    b.tiles = b.pos + AW_LD;
    return b;
}

/* The tiles of keys [lo, nkeys) for the item's R rows (its lanes) of nkh kv heads (the first
 * one's rows at kbase / vbase): token i of the item at position ctx + i, rows r / G = i;
 * scratch as aw_layout lays it out, started by aw_start. */
static void aw_keys(float* scratch, int nkh, int R, int G, int D, int ntok, int64_t ctx, int64_t lo, int64_t nkeys,
                    int64_t window, const float* kbase, const float* vbase, const int64_t* bt, int block_size,
                    int64_t tok_stride, int kv) {
    const struct aw_bufs b = aw_layout(scratch, nkh, D);
    float* st = b.st, * pos = b.pos;
    const int span = nkh * D;
    const float** kp = (const float**)b.tiles;  /* set by af_tile_copy, unused here */
    const float** vp = kp + AF_KT;
    float* kb[2], * vb[2];  /* the tile buffers, 64-byte aligned: keys span floats apart */
    kb[0] = (float*)(((uintptr_t)(vp + AF_KT) + 63) & ~(uintptr_t)63);
    vb[0] = kb[0] + AF_KT * AF_COPY_SPAN;
    kb[1] = vb[0] + AF_KT * AF_COPY_SPAN;
    vb[1] = kb[1] + AF_KT * AF_COPY_SPAN;
    af_tile_copy(kbase, vbase, bt, block_size, tok_stride, span, D, lo, nkeys - lo < AF_KT ? (int)(nkeys - lo) : AF_KT,
                 nkeys, kb[0], vb[0], kp, vp, kv);
    for (int64_t t0 = lo, cur = 0; t0 < nkeys; t0 += AF_KT, cur ^= 1) {
        const int nk = nkeys - t0 < AF_KT ? (int)(nkeys - t0) : AF_KT;
        if (t0 + AF_KT < nkeys)  /* the next tile, copied before this one is computed */
            af_tile_copy(kbase, vbase, bt, block_size, tok_stride, span, D, t0 + AF_KT,
                         nkeys - t0 - AF_KT < AF_KT ? (int)(nkeys - t0 - AF_KT) : AF_KT, nkeys, kb[cur ^ 1],
                         vb[cur ^ 1], kp, vp, kv);
        /* rows before r0 see none of this tile, nor (with a window) rows from r1 on */
        const int r0 = t0 > ctx ? (int)(t0 - ctx) * G : 0;
        const int64_t ntok_seen = window > 0 ? t0 + nk + window - 1 - ctx : ntok;
        const int r1 = ntok_seen < ntok ? (int)ntok_seen * G : R;
        const int l0 = r0 / AW_RB * AW_RB, l1 = (r1 + AW_RB - 1) / AW_RB * AW_RB;
        const int mask = t0 + nk - 1 > ctx || window > 0;  /* some lane must not see some key */
        for (int h = 0; h < nkh; h++) {
            float* ot = b.ot + (int64_t)h * D * AW_LD;
            aw_gemm(nk, 0, kb[cur] + h * D, span, 1, b.qt + (int64_t)h * D * AW_LD, D, st, l0, l1);
            aw_softmax(st, nk, b.m + h * AW_LD, b.l + h * AW_LD, pos, ot, D, l0, l1, t0, window, mask);
            aw_gemm(D, 1, vb[cur] + h * D, 1, span, st, nk, ot, l0, l1);
        }
    }
}

/* Lanes [0, lanes) of a fresh item of kv heads [kh0, kh0 + nkh): running max -inf, sum 0,
 * O^T 0, positions ctx + r / G; head h's R rows' queries (token r / G at q + (r / G) *
 * q_stride, head (kh0 + h) * G + r % G) scaled and transposed into its Q^T, zeros past R. */
static void aw_start(float* scratch, const float* q, int64_t q_stride, int R, int G, int kh0, int nkh, int D,
                     int64_t ctx, float scale) {
    const int lanes = (R + AW_RB - 1) / AW_RB * AW_RB;
    const struct aw_bufs b = aw_layout(scratch, nkh, D);
    for (int r = 0; r < lanes; r++) b.pos[r] = (float)(ctx + r / G);
    for (int h = 0; h < nkh; h++) {
        float* qt = b.qt + (int64_t)h * D * AW_LD, * ot = b.ot + (int64_t)h * D * AW_LD;
        for (int r = 0; r < lanes; r++) {
            b.m[h * AW_LD + r] = -INFINITY;
            b.l[h * AW_LD + r] = 0.f;
        }
        for (int d = 0; d < D; d++) {
            memset(ot + (int64_t)d * AW_LD, 0, sizeof(float) * (size_t)lanes);
            for (int r = R; r < lanes; r++) qt[(int64_t)d * AW_LD + r] = 0.f;
        }
        for (int r0 = 0; r0 < R; r0 += VL) {  /* VL rows at a time, VL x VL blocks transposed in registers */
            const float* qr[VL];
            const int nr = R - r0 < VL ? R - r0 : VL;
            for (int i = 0; i < nr; i++)
                qr[i] = q + (int64_t)((r0 + i) / G) * q_stride + (int64_t)((kh0 + h) * G + (r0 + i) % G) * D;
            int d0 = 0;
            for (; d0 + VL <= D; d0 += VL) {
                vf a[VL];
                for (int i = 0; i < VL; i++) a[i] = i < nr ? AF_LD(qr[i] + d0) * vf_set1(scale) : vf_zero();
                af_transpose(a);
                for (int i = 0; i < VL; i++) AF_ST(qt + (int64_t)(d0 + i) * AW_LD + r0, a[i]);
            }
            for (int d = d0; d < D; d++)
                for (int i = 0; i < nr; i++) qt[(int64_t)d * AW_LD + r0 + i] = qr[i][d] * scale;
        }
    }
}

/* One wide work item: af_attend's arguments for the G query heads of each of kv heads
 * [kh0, kh0 + nkh) (ntok * G >= AW_MIN_ROWS rows a head, at most AF_MAX_ROWS; aw_heads_fit). */
static void aw_attend(const float* q, int64_t q_stride, float* out, int64_t out_stride, int ntok, int64_t ctx, int G,
                      int kh0, int nkh, int D, const float* k_cache, const float* v_cache, const int64_t* bt,
                      int block_size, int64_t tok_stride, float scale, int64_t window, float* scratch, int kv) {
    const int R = ntok * G;
    aw_start(scratch, q, q_stride, R, G, kh0, nkh, D, ctx, scale);
    const int64_t lo = window > 0 && ctx - window + 1 > 0 ? ctx - window + 1 : 0;  /* the first token's first key */
    aw_keys(scratch, nkh, R, G, D, ntok, ctx, lo, ctx + ntok, window, af_at(k_cache, (int64_t)kh0 * af_row(D, kv), kv),
            af_at(v_cache, (int64_t)kh0 * af_row(D, kv), kv), bt, block_size, tok_stride, kv);
    const struct aw_bufs b = aw_layout(scratch, nkh, D);
    for (int h = 0; h < nkh; h++) {
        const float* ot = b.ot + (int64_t)h * D * AW_LD;
        for (int r0 = 0; r0 < R; r0 += VL) {  /* O^T's VL x VL blocks back to rows, in registers */
            float* dst[VL];
            const int nr = R - r0 < VL ? R - r0 : VL;
            for (int i = 0; i < nr; i++)
                dst[i] = out + (int64_t)((r0 + i) / G) * out_stride + (int64_t)((kh0 + h) * G + (r0 + i) % G) * D;
            const vf inv = vf_set1(1.f) / AF_LD(b.l + h * AW_LD + r0);  /* lanes past R: unused */
            int d0 = 0;
            for (; d0 + VL <= D; d0 += VL) {
                vf a[VL];
                for (int i = 0; i < VL; i++) a[i] = AF_LD(ot + (int64_t)(d0 + i) * AW_LD + r0) * inv;
                af_transpose(a);
                for (int i = 0; i < nr; i++) AF_ST(dst[i] + d0, a[i]);
            }
            for (int d = d0; d < D; d++)
                for (int i = 0; i < nr; i++) dst[i][d] = ot[(int64_t)d * AW_LD + r0 + i] * inv[i];
        }
    }
}

/* A shared-prefix item of a decode step: the n requests whose queries are rows of q
 * (q_stride apart) all read the same first `prefix` keys (one block table, bt), so their
 * G heads of kv head kh are the lanes of one wide item over those keys (n * G <= AF_MAX_ROWS).
 * Its unnormalized output, max and sum per row go to state (request i, head h at
 * state + (i * state_stride) + h * (D + 2)), for af_attend to merge into the rest. */
static __attribute__((unused)) void aw_shared_prefix(const float* q, int64_t q_stride, int n, int64_t prefix, int G, int kh, int D,
                             const float* k_cache, const float* v_cache, const int64_t* bt, int block_size,
                             int64_t tok_stride, float scale, float* state, int64_t state_stride, float* scratch,
                             int kv) {
    const int R = n * G;
    /* ctx prefix - 1: the last key is at or before every row's position, so no tile is masked */
    aw_start(scratch, q, q_stride, R, G, kh, 1, D, prefix - 1, scale);
    aw_keys(scratch, 1, R, G, D, n, prefix - 1, 0, prefix, 0, af_at(k_cache, (int64_t)kh * af_row(D, kv), kv),
            af_at(v_cache, (int64_t)kh * af_row(D, kv), kv), bt, block_size, tok_stride, kv);
    const struct aw_bufs b = aw_layout(scratch, 1, D);
    for (int r = 0; r < R; r++) {
        float* dst = state + (int64_t)(r / G) * state_stride + (int64_t)(kh * G + r % G) * (D + 2);
        for (int d = 0; d < D; d++) dst[d] = b.ot[(int64_t)d * AW_LD + r];
        dst[D] = b.m[r];
        dst[D + 1] = b.l[r];
    }
}

#endif
