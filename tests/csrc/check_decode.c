/* Paged decode attention: plain, over shared prefix blocks (cascade), and over fp8 pools. */
#include "check.h"

struct attn_case {
    int num_seqs, nh, nkv, hd, block_size, max_len;
    float q_amp;  /* larger: peakier softmax */
};

/* paged_decode_f32 on pool p (one query row per sequence, lens[s] keys each) against
 * ref_attend in double; reports under `name` */
static void decode_against_reference(const struct pool* p, const int64_t* lens, int num_seqs, int nh, float q_amp,
                                     int max_len, const char* name) {
    const int nkv = p->nkv, hd = p->hd;
    const int64_t row = (int64_t)nh * hd, q_stride = row + 2 * (int64_t)nkv * hd;  /* a qkv view */
    float* q = frand(num_seqs * q_stride, q_amp);
    float* out = malloc(sizeof(float) * (size_t)(num_seqs * row));
    double* want = malloc(sizeof(double) * (size_t)(num_seqs * row));
    const float scale = 1.f / sqrtf((float)hd);
    for (int s = 0; s < num_seqs; s++)
        for (int h = 0; h < nh; h++)
            ref_attend(p, s, h / (nh / nkv), q + s * q_stride + (int64_t)h * hd, lens[s], scale,
                       want + s * row + (int64_t)h * hd);
    paged_decode_f32(q, q_stride, p->k, p->v, p->bt, p->bt_stride, lens, out, num_seqs, nh, nkv, hd, p->block_size,
                     scale, max_len);
    double wa;
    const double r = err_ratio(out, want, num_seqs * row, 2e-6, 2e-5, &wa);
    result(r <= 1, name, "max abs err %.3g (atol 2e-6 + rtol 2e-5)", wa);
    free(q);
    free(out);
    free(want);
}

void check_paged_decode(void) {
    if (!present((const void*)paged_decode_f32, "paged_decode_f32")) return;
    const struct attn_case cases[] = {
        {3, 4, 4, 64, 16, 70, 1.f},     /* MHA */
        {5, 8, 2, 128, 16, 300, 2.f},   /* GQA, G = 4 */
        {4, 12, 4, 64, 32, 200, 4.f},   /* G = 3, larger blocks */
        {2, 16, 1, 96, 16, 90, 1.f},    /* G = 16 (MQA), head_dim not a power of two */
        {1, 2, 1, 256, 8, 520, 8.f},    /* head_dim 256, one long sequence */
        {7, 6, 6, 32, 16, 40, 1.f},     /* many short sequences */
        {2, 4, 2, 80, 16, 33, 1.f},     /* head_dim 80: not a multiple of 16 lanes */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct attn_case k = cases[c];
        int64_t* lens = malloc(sizeof(int64_t) * (size_t)k.num_seqs);
        for (int s = 0; s < k.num_seqs; s++) lens[s] = rnd_int(1, k.max_len);
        lens[0] = k.max_len;
        if (k.num_seqs > 1) lens[1] = 1;
        if (k.num_seqs > 2) lens[2] = k.block_size;  /* exactly one full block */
        struct pool p = make_pool(k.num_seqs, lens, k.block_size, k.nkv, k.hd);
        char name[128];
        snprintf(name, sizeof name, "paged_decode_f32 seqs=%d heads=%d/%d d=%d bs=%d max_len=%d", k.num_seqs, k.nh,
                 k.nkv, k.hd, k.block_size, k.max_len);
        decode_against_reference(&p, lens, k.num_seqs, k.nh, k.q_amp, k.max_len, name);
        free(lens);
        free_pool(&p);
    }
}

/* Decode steps whose requests share cached prefix blocks (the same block ids at the start
 * of their tables, as prefix caching hands them out): the kernel then scores the shared
 * keys once for the whole group (cascade attention) and merges each request's own keys. */
void check_paged_decode_shared_prefix(void) {
    if (!present((const void*)paged_decode_f32, "paged_decode_f32")) return;
    struct scase {
        int num_seqs, n_shared, nh, nkv, hd, block_size, shared_blocks, short_member;
    };
    const struct scase cases[] = {
        {26, 24, 9, 3, 64, 16, 6, 1},    /* G = 3: two chunks, two requests outside the group, one member
                                            shorter than the shared blocks (the group shares less) */
        {34, 34, 4, 4, 32, 16, 5, 0},    /* G = 1 (MHA): 32 requests at least */
        {20, 20, 16, 2, 80, 32, 3, 0},   /* G = 8: three chunks of <= 8 requests, (request, kv head) items;
                                            head_dim 80 */
        {10, 10, 9, 3, 64, 16, 5, 0},    /* too few requests for a wide item: no cascade */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct scase k = cases[c];
        const int64_t shared_len = (int64_t)k.shared_blocks * k.block_size;
        int64_t* lens = malloc(sizeof(int64_t) * (size_t)k.num_seqs);
        for (int s = 0; s < k.num_seqs; s++) lens[s] = shared_len + rnd_int(1, 3 * k.block_size);
        lens[1] = shared_len + 1;  /* only the new token past the prefix */
        if (k.short_member) lens[2] = shared_len - k.block_size - 5;
        struct pool p = make_pool(k.num_seqs, lens, k.block_size, k.nkv, k.hd);
        for (int s = 1; s < k.n_shared; s++)  /* the group's first blocks are request 0's */
            for (int64_t b = 0; b < k.shared_blocks && b * k.block_size < lens[s]; b++)
                p.bt[s * p.bt_stride + b] = p.bt[b];
        char name[160];
        snprintf(name, sizeof name, "paged_decode_f32 shared prefix seqs=%d/%d heads=%d/%d d=%d bs=%d blocks=%d%s",
                 k.n_shared, k.num_seqs, k.nh, k.nkv, k.hd, k.block_size, k.shared_blocks,
                 k.short_member ? " (a short member)" : "");
        decode_against_reference(&p, lens, k.num_seqs, k.nh, 2.f, (int)(shared_len + 3 * k.block_size), name);
        free(lens);
        free_pool(&p);
    }
}

/* e4m3 (the fp8 KV pools' codes, kv_fp8.h) decoded by its definition, in double */
static double fp8_value(uint8_t b) {
    const int e = b >> 3 & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return b & 0x80 ? -v : v;
}

#define FP8_ROW(D) ((D) + ((D) & 1) + 2)  /* a (token, kv head) row: codes, then a bf16 scale */

/* The rows of a float32 pool quantized by write_kv_rows_f32_fp8 into *kq / *vq, and the
 * values they hold decoded into q (a pool of the same tables): every value within 2^-4 of
 * its row's largest magnitude (3 mantissa bits) */
static int quantize_pool(const struct pool* p, struct pool* q, uint8_t** kq, uint8_t** vq) {
    const int64_t slots = (int64_t)p->num_blocks * p->block_size, row = (int64_t)p->nkv * p->hd;
    const int64_t qrow = (int64_t)p->nkv * FP8_ROW(p->hd);
    int64_t* ids = malloc(sizeof(int64_t) * (size_t)slots);
    for (int64_t i = 0; i < slots; i++) ids[i] = i;
    *kq = malloc((size_t)(slots * qrow));
    *vq = malloc((size_t)(slots * qrow));
    write_kv_rows_f32_fp8((const char*)p->k, row * 4, (const char*)p->v, row * 4, (char*)*kq, (char*)*vq, ids, slots,
                          row * 4, p->hd);
    *q = *p;
    q->k = malloc(sizeof(float) * (size_t)(slots * row));
    q->v = malloc(sizeof(float) * (size_t)(slots * row));
    int ok = 1;
    for (int w = 0; w < 2; w++) {
        const float* src = w ? p->v : p->k;
        const uint8_t* codes = w ? *vq : *kq;
        float* dst = w ? q->v : q->k;
        for (int64_t r = 0; r < slots * p->nkv; r++) {
            const uint8_t* c = codes + r * FP8_ROW(p->hd);
            uint16_t s16;
            memcpy(&s16, c + FP8_ROW(p->hd) - 2, 2);
            const uint32_t bits = (uint32_t)s16 << 16;
            float scale, amax = 0;
            memcpy(&scale, &bits, 4);
            for (int d = 0; d < p->hd; d++) amax = fmaxf(amax, fabsf(src[r * p->hd + d]));
            for (int d = 0; d < p->hd; d++) {
                dst[r * p->hd + d] = (float)(fp8_value(c[d]) * scale);
                ok &= fabs(dst[r * p->hd + d] - src[r * p->hd + d]) <= amax / 16;
            }
        }
    }
    free(ids);
    return ok;
}

/* paged_decode_f32_kvfp8 over pools that write_kv_rows_f32_fp8 quantized, against the
 * reference over the values those pools hold */
void check_paged_decode_fp8(void) {
    if (!present((const void*)paged_decode_f32_kvfp8, "paged_decode_f32_kvfp8")
        || !present((const void*)write_kv_rows_f32_fp8, "write_kv_rows_f32_fp8")) return;
    const struct attn_case cases[] = {
        {5, 9, 3, 64, 16, 300, 2.f},    /* SmolLM2's heads: whole rows an item */
        {3, 8, 8, 64, 16, 90, 1.f},     /* rows past the tile buffers: a kv head an item */
        {2, 4, 1, 36, 5, 70, 1.f},      /* head_dim 36: codes past whole vectors */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct attn_case k = cases[c];
        int64_t* lens = malloc(sizeof(int64_t) * (size_t)k.num_seqs);
        for (int s = 0; s < k.num_seqs; s++) lens[s] = rnd_int(1, k.max_len);
        lens[0] = k.max_len;
        struct pool p = make_pool(k.num_seqs, lens, k.block_size, k.nkv, k.hd), deq;
        uint8_t* kq, * vq;
        char name[128];
        snprintf(name, sizeof name, "write_kv_rows_f32_fp8 heads=%d d=%d within 2^-4 of each row's largest", k.nkv,
                 k.hd);
        result(quantize_pool(&p, &deq, &kq, &vq), name, "quantized");
        /* the reference reads deq's values; the kernel the codes behind them */
        float* fk = deq.k, * fv = deq.v;
        deq.k = (float*)(void*)kq;
        deq.v = (float*)(void*)vq;
        const int nkv = k.nkv, hd = k.hd;
        const int64_t row = (int64_t)k.nh * hd;
        float* q = frand(k.num_seqs * row, k.q_amp);
        float* out = malloc(sizeof(float) * (size_t)(k.num_seqs * row));
        double* want = malloc(sizeof(double) * (size_t)(k.num_seqs * row));
        const float scale = 1.f / sqrtf((float)hd);
        struct pool ref = deq;
        ref.k = fk;
        ref.v = fv;
        for (int s = 0; s < k.num_seqs; s++)
            for (int h = 0; h < k.nh; h++)
                ref_attend(&ref, s, h / (k.nh / nkv), q + s * row + (int64_t)h * hd, lens[s], scale,
                           want + s * row + (int64_t)h * hd);
        paged_decode_f32_kvfp8(q, row, deq.k, deq.v, p.bt, p.bt_stride, lens, out, k.num_seqs, k.nh, nkv, hd,
                               k.block_size, scale, k.max_len);
        double wa;
        const double r = err_ratio(out, want, k.num_seqs * row, 2e-6, 2e-5, &wa);
        snprintf(name, sizeof name, "paged_decode_f32_kvfp8 seqs=%d heads=%d/%d d=%d bs=%d", k.num_seqs, k.nh, nkv,
                 hd, k.block_size);
        result(r <= 1, name, "max abs err %.3g (atol 2e-6 + rtol 2e-5)", wa);
        free(q);
        free(out);
        free(want);
        free(fk);
        free(fv);
        free(kq);
        free(vq);
        free(lens);
        free_pool(&p);
    }
}
