/* Paged prefill attention, and a sliding window in decode and prefill. */
#include "check.h"

void check_paged_prefill(void) {
    if (!present((const void*)paged_prefill_f32, "paged_prefill_f32")) return;
    struct pcase {
        int num_reqs, nh, nkv, hd, block_size;
        int64_t q_len[4], ctx[4];  /* ctx: cached tokens before the chunk */
        float q_amp;
    };
    const struct pcase cases[] = {
        {3, 4, 4, 64, 16, {5, 70, 1}, {0, 30, 100}, 1.f},             /* MHA: a fresh prompt, chunks after a cache */
        {2, 8, 2, 128, 16, {40, 17}, {0, 64}, 2.f},                   /* GQA, G = 4: 16 tokens per work item */
        {4, 12, 4, 64, 32, {9, 1, 33, 100}, {50, 7, 0, 20}, 4.f},    /* G = 3 */
        {1, 16, 2, 80, 16, {20}, {45}, 1.f},                          /* G = 8, head_dim 80 */
        {2, 2, 1, 256, 8, {12, 3}, {150, 0}, 8.f},                    /* head_dim 256 */
        {2, 6, 6, 32, 16, {130, 2}, {0, 300}, 1.f},                   /* > AF_MAX_ROWS tokens in one request */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct pcase k = cases[c];
        int64_t q_start[4], q_len[4], seq_len[4], tokens = 0;
        for (int r = 0; r < k.num_reqs; r++) {
            q_start[r] = tokens;
            q_len[r] = k.q_len[r];
            seq_len[r] = k.ctx[r] + k.q_len[r];
            tokens += q_len[r];
        }
        struct pool p = make_pool(k.num_reqs, seq_len, k.block_size, k.nkv, k.hd);
        const int G = k.nh / k.nkv;
        const int64_t row = (int64_t)k.nh * k.hd, q_stride = row + 2 * (int64_t)k.nkv * k.hd;
        float* q = frand(tokens * q_stride, k.q_amp);
        float* out = malloc(sizeof(float) * (size_t)(tokens * row));
        double* want = malloc(sizeof(double) * (size_t)(tokens * row));
        const float scale = 1.f / sqrtf((float)k.hd);
        for (int r = 0; r < k.num_reqs; r++)
            for (int64_t i = 0; i < q_len[r]; i++)
                for (int h = 0; h < k.nh; h++)  /* token i sits at ctx + i and sees keys [0, ctx + i] */
                    ref_attend(&p, r, h / G, q + (q_start[r] + i) * q_stride + (int64_t)h * k.hd, k.ctx[r] + i + 1,
                               scale, want + (q_start[r] + i) * row + (int64_t)h * k.hd);
        char name[160];
        snprintf(name, sizeof name, "paged_prefill_f32 reqs=%d heads=%d/%d d=%d bs=%d tokens=%lld", k.num_reqs, k.nh,
                 k.nkv, k.hd, k.block_size, (long long)tokens);
        if (paged_prefill_f32_supported && !paged_prefill_f32_supported(k.hd, G)) {
            result(0, name, "paged_prefill_f32_supported(%d, %d) = 0", k.hd, G);
        } else {
            const int rc = paged_prefill_f32(q, q_stride, p.k, p.v, p.bt, p.bt_stride, q_start, q_len, seq_len, out,
                                             k.num_reqs, k.nh, k.nkv, k.hd, k.block_size, scale, NULL);
            double wa = 0;
            const double e = rc == 0 ? err_ratio(out, want, tokens * row, 2e-6, 2e-5, &wa) : INFINITY;
            result(rc == 0 && e <= 1, name, "rc %d, max abs err %.3g (atol 2e-6 + rtol 2e-5)", rc, wa);
        }
        free(q);
        free(out);
        free(want);
        free_pool(&p);
    }
    if (paged_prefill_f32_supported)
        result(!paged_prefill_f32_supported(300, 1) && paged_prefill_f32_supported(128, 8),
               "paged_prefill_f32_supported", "head_dim 300 refused, 128 x G 8 taken");
}

/* Sliding window W: the token at position t sees keys (t - W, t]. The blocks wholly before
 * each request's first window are filled with NaN: a kernel that reads them fails. */
void check_sliding_window(void) {
    if (!present((const void*)paged_prefill_f32_sw, "paged_prefill_f32_sw")
        || !present((const void*)paged_decode_f32_sw, "paged_decode_f32_sw")) return;
    const int nh = 8, nkv = 2, hd = 80, bs = 16, G = nh / nkv, nreq = 4;
    const int64_t ctx[4] = {0, 100, 300, 64}, qn[4] = {90, 40, 1, 3};
    const int windows[3] = {1, 37, 100};
    for (int w = 0; w < 3; w++) {
        const int W = windows[w];
        int64_t q_start[4], seq_len[4], tokens = 0;
        for (int r = 0; r < nreq; r++) {
            q_start[r] = tokens;
            seq_len[r] = ctx[r] + qn[r];
            tokens += qn[r];
        }
        struct pool p = make_pool(nreq, seq_len, bs, nkv, hd);
        for (int r = 0; r < nreq; r++) {
            const int64_t skip = (ctx[r] - W + 1 > 0 ? ctx[r] - W + 1 : 0) / bs;
            for (int64_t b = 0; b < skip; b++) {
                const int64_t off = p.bt[r * p.bt_stride + b] * bs * nkv * hd;
                for (int64_t i = 0; i < (int64_t)bs * nkv * hd; i++) p.k[off + i] = p.v[off + i] = NAN;
            }
        }
        const int64_t row = (int64_t)nh * hd, q_stride = row + 2 * (int64_t)nkv * hd;
        float* q = frand(tokens * q_stride, 2.f);
        float* out = malloc(sizeof(float) * (size_t)(tokens * row));
        double* want = malloc(sizeof(double) * (size_t)(tokens * row));
        const float scale = 1.f / sqrtf((float)hd);
        for (int r = 0; r < nreq; r++)
            for (int64_t i = 0; i < qn[r]; i++)
                for (int h = 0; h < nh; h++) {
                    const int64_t t = ctx[r] + i;
                    ref_attend_from(&p, r, h / G, q + (q_start[r] + i) * q_stride + (int64_t)h * hd,
                                    t - W + 1 > 0 ? t - W + 1 : 0, t + 1, scale,
                                    want + (q_start[r] + i) * row + (int64_t)h * hd);
                }
        char name[96];
        const int rc = paged_prefill_f32_sw(q, q_stride, p.k, p.v, p.bt, p.bt_stride, q_start, qn, seq_len, out, nreq,
                                            nh, nkv, hd, bs, scale, NULL, W);
        double wa = 0;
        double e = rc == 0 ? err_ratio(out, want, tokens * row, 2e-6, 2e-5, &wa) : INFINITY;
        snprintf(name, sizeof name, "paged_prefill_f32_sw window=%d", W);
        result(rc == 0 && e <= 1, name, "rc %d, max abs err %.3g (atol 2e-6 + rtol 2e-5)", rc, wa);
        /* one decode row per request: its last token, over the same pool */
        float* dq = malloc(sizeof(float) * (size_t)(nreq * q_stride));
        double* dwant = malloc(sizeof(double) * (size_t)(nreq * row));
        for (int r = 0; r < nreq; r++) {
            memcpy(dq + r * q_stride, q + (q_start[r] + qn[r] - 1) * q_stride, sizeof(float) * (size_t)q_stride);
            memcpy(dwant + r * row, want + (q_start[r] + qn[r] - 1) * row, sizeof(double) * (size_t)row);
        }
        paged_decode_f32_sw(dq, q_stride, p.k, p.v, p.bt, p.bt_stride, seq_len, out, nreq, nh, nkv, hd, bs, scale,
                            400, W);
        e = err_ratio(out, dwant, nreq * row, 2e-6, 2e-5, &wa);
        snprintf(name, sizeof name, "paged_decode_f32_sw window=%d", W);
        result(e <= 1, name, "max abs err %.3g (atol 2e-6 + rtol 2e-5)", wa);
        free(dq);
        free(dwant);
        free(q);
        free(out);
        free(want);
        free_pool(&p);
    }
}
