/* The bf16 kernels (gemm_bf16.c: plain, argmax, silu; paged_prefill.c: paged_prefill_bf16;
 * paged_decode.c: paged_decode_bf16 over shared prefixes) built with one ISA level's flags,
 * against references in double: the check tests/test_kernels_bf16.py runs natively for every
 * level the CPU runs, under qemu-user for the aarch64 levels and through SIMDe for the AVX-512
 * levels on a CPU without them. Prints "<passed> passed, <failed> failed" last;
 * exit status 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bf16_simd.h"

int gemm_bf16_supported(void);
int gemm_bf16(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, uint16_t*,
              int64_t);
int gemm_bf16_silu(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, uint16_t*, int64_t);
int gemm_bf16_argmax(const uint16_t*, int64_t, int64_t, int64_t, const uint16_t*, int64_t, int64_t*);
int paged_prefill_supported(int);
int paged_prefill_bf16(const uint16_t*, int64_t, const uint16_t*, const uint16_t*, const int64_t*, int64_t,
                       const int64_t*, const int64_t*, const int64_t*, uint16_t*, int, int, int, int, int, float, void*);
int64_t paged_prefill_workspace(const int64_t*, const int64_t*, int, int, int, int);
int encoder_attention_bf16(const uint16_t*, int64_t, const uint16_t*, const uint16_t*, int64_t, const int64_t*,
                           const int64_t*, uint16_t*, int, int, int, int, float, void*);
int64_t encoder_attention_workspace(const int64_t*, int, int, int, int);
void paged_decode_bf16(const uint16_t*, int64_t, const uint16_t*, const uint16_t*, const int64_t*, int64_t,
                       const int64_t*, uint16_t*, int, int, int, int, int, float, int);

static int passed, failed;
static uint32_t seed = 12345;
static float rnd(void) { seed = seed * 1664525u + 1013904223u; return (float)(seed >> 8) / (1 << 24) * 2 - 1; }
static float b2f(uint16_t x) { return bf16_to_f32(x); }

static void report(int ok, const char* what) {
    if (ok) passed++;
    else { failed++; printf("FAIL %s\n", what); }
}

/* W [N][K] -> packed [N/32][K/2][32][2], zero-padded (gemm_bf16.py's pack_panels) */
static uint16_t* pack(const uint16_t* w, int N, int K) {
    const int Np = (N + 31) / 32 * 32, Kp = K + K % 2;
    uint16_t* pk = calloc((size_t)Np * Kp, 2);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            pk[(((int64_t)(n / 32) * (Kp / 2) + k / 2) * 32 + n % 32) * 2 + k % 2] = w[(int64_t)n * K + k];
    return pk;
}

static void check_gemm(int M, int N, int K) {
    char what[96];
    uint16_t *w = malloc((size_t)N * K * 2), *x = malloc((size_t)M * (K + 1) * 2), *bias = malloc((size_t)N * 2);
    uint16_t *out = malloc((size_t)M * N * 2), *nob = malloc((size_t)M * N * 2);
    int64_t* tok = malloc((size_t)M * 8);
    const int lda = K + 1;  /* rows one apart more than K: the element after a row is a NaN */
    for (int i = 0; i < N * K; i++) w[i] = f32_to_bf16(rnd());
    for (int m = 0; m < M; m++) {
        for (int k = 0; k < K; k++) x[m * lda + k] = f32_to_bf16(rnd());
        x[m * lda + K] = 0x7FC0;
    }
    for (int n = 0; n < N; n++) bias[n] = f32_to_bf16(rnd());
    uint16_t* pk = pack(w, N, K);
    int ok = gemm_bf16(x, M, K, lda, pk, N, bias, out, N) == 0 && gemm_bf16(x, M, K, lda, pk, N, NULL, nob, N) == 0;
    for (int m = 0; m < M && ok; m++)
        for (int n = 0; n < N && ok; n++) {
            double r = b2f(bias[n]), a = fabs(r);
            for (int k = 0; k < K; k++) {
                const double p = (double)b2f(x[m * lda + k]) * b2f(w[(int64_t)n * K + k]);
                r += p;
                a += fabs(p);
            }
            /* one bf16 rounding of an fp32 sum: half an ulp plus the summation order */
            ok = fabs(b2f(out[m * N + n]) - r) <= fabs(r) / 256 + a * 1e-6 + 1e-30;
        }
    snprintf(what, sizeof what, "gemm_bf16 M=%d N=%d K=%d", M, N, K);
    report(ok, what);
    ok = gemm_bf16_argmax(x, M, K, lda, pk, N, tok) == 0;
    for (int m = 0; m < M && ok; m++) {
        int best = 0;
        for (int n = 1; n < N; n++)
            if (b2f(nob[m * N + n]) > b2f(nob[m * N + best])) best = n;
        ok = tok[m] == best;
    }
    snprintf(what, sizeof what, "gemm_bf16_argmax M=%d N=%d K=%d", M, N, K);
    report(ok, what);
    if (N % 64 == 0) {
        uint16_t* o = malloc((size_t)M * N / 2 * 2);
        ok = gemm_bf16_silu(x, M, K, lda, pk, N, o, N / 2) == 0;
        for (int m = 0; m < M && ok; m++)
            for (int n = 0; n < N / 2 && ok; n++) {
                const double g = b2f(nob[m * N + n]), u = b2f(nob[m * N + N / 2 + n]);
                const double r = g / (1 + exp(-g)) * u;
                ok = fabs(b2f(o[m * N / 2 + n]) - r) <= fabs(r) / 64 + 1e-6;  /* two bf16 roundings */
            }
        snprintf(what, sizeof what, "gemm_bf16_silu M=%d N=%d K=%d", M, N, K);
        report(ok, what);
        free(o);
    }
    free(w); free(x); free(bias); free(out); free(nob); free(tok); free(pk);
}

/* One query row (q: D values, of kv head kh) over the first n keys a block table (bt, blocks of
 * BS tokens, pool rows of row_len) holds, in double; whether out (D values) is within 1e-2 +
 * |ref| / 64 of it. p: n doubles of scratch. */
static int attention_row_ok(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const int64_t* bt, int64_t n,
                            int BS, int64_t row_len, int kh, int D, float scale, const uint16_t* out, double* p) {
    double mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; t++) {
        const int64_t at = (bt[t / BS] * BS + t % BS) * row_len + (int64_t)kh * D;
        double d = 0;
        for (int e = 0; e < D; e++) d += (double)b2f(q[e]) * b2f(kc[at + e]);
        p[t] = d * scale;
        mx = p[t] > mx ? p[t] : mx;
    }
    for (int64_t t = 0; t < n; t++) sum += p[t] = exp(p[t] - mx);
    for (int e = 0; e < D; e++) {
        double ref = 0;
        for (int64_t t = 0; t < n; t++)
            ref += p[t] / sum * b2f(vc[(bt[t / BS] * BS + t % BS) * row_len + (int64_t)kh * D + e]);
        if (fabs(b2f(out[e]) - ref) > 1e-2 + fabs(ref) / 64) return 0;
    }
    return 1;
}

/* requests (cached, new): causal over the cache and the chunk, H heads over KVH kv heads */
static void check_prefill(int H, int KVH, int D, int BS) {
    char what[96];
    snprintf(what, sizeof what, "paged_prefill_bf16 H=%d KVH=%d D=%d block=%d", H, KVH, D, BS);
    if (!paged_prefill_supported(D)) { report(0, what); return; }
    const int R = 3;
    const int64_t cached[3] = {40, 0, 100}, fresh[3] = {30, 70, 3};
    int64_t q_start[3], q_len[3], seq_len[3], T = 0, maxb = 0;
    for (int r = 0; r < R; r++) {
        q_start[r] = T; q_len[r] = fresh[r]; seq_len[r] = cached[r] + fresh[r]; T += fresh[r];
        maxb = (seq_len[r] + BS - 1) / BS > maxb ? (seq_len[r] + BS - 1) / BS : maxb;
    }
    const int nb = (int)(R * maxb + 1);
    const int64_t row_len = (int64_t)KVH * D;
    uint16_t *kc = calloc((size_t)nb * BS * row_len, 2), *vc = calloc((size_t)nb * BS * row_len, 2);
    int64_t* bt = malloc(sizeof(int64_t) * R * maxb);
    for (int i = 0; i < R * maxb; i++) bt[i] = nb - 1 - (i * 7) % (nb - 1);  /* scattered, distinct */
    for (int r = 0; r < R; r++)
        for (int64_t t = 0; t < seq_len[r]; t++)
            for (int i = 0; i < row_len; i++) {
                const int64_t s = (bt[r * maxb + t / BS] * BS + t % BS) * row_len + i;
                kc[s] = f32_to_bf16(rnd() * 2);
                vc[s] = f32_to_bf16(rnd());
            }
    uint16_t *q = malloc((size_t)T * H * D * 2), *o = malloc((size_t)T * H * D * 2);
    for (int64_t i = 0; i < T * H * D; i++) q[i] = f32_to_bf16(rnd() * 2);
    void* ws = malloc((size_t)paged_prefill_workspace(seq_len, q_len, R, H, KVH, D) + 64);
    const float scale = 1.f / sqrtf((float)D);
    int ok = paged_prefill_bf16(q, (int64_t)H * D, kc, vc, bt, maxb, q_start, q_len, seq_len, o, R, H, KVH, D, BS,
                                scale, ws) == 0;
    double* p = malloc(sizeof(double) * 256);
    for (int r = 0; r < R && ok; r++)
        for (int64_t i = 0; i < q_len[r] && ok; i++)
            for (int h = 0; h < H && ok; h++) {
                const int64_t row = q_start[r] + i;
                ok = attention_row_ok(q + (row * H + h) * D, kc, vc, bt + r * maxb, cached[r] + i + 1, BS, row_len,
                                      h / (H / KVH), D, scale, o + (row * H + h) * D, p);
            }
    report(ok, what);
    free(kc); free(vc); free(bt); free(q); free(o); free(ws); free(p);
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

/* paged_decode_bf16 over requests whose block tables start with the same `shared` blocks
 * (prefix caching): the first n_shared of N requests, one of them only a token past the prefix.
 * At the AVX-512-BF16 levels their prefix is scored for several requests in one pass (the
 * cascade); every request's output against a reference in double */
static void check_decode_shared(int N, int n_shared, int H, int KVH, int D, int BS, int shared) {
    char what[128];
    snprintf(what, sizeof what, "paged_decode_bf16 shared prefix seqs=%d/%d H=%d KVH=%d D=%d block=%d blocks=%d",
             n_shared, N, H, KVH, D, BS, shared);
    const int64_t row_len = (int64_t)KVH * D, shared_len = (int64_t)shared * BS;
    int64_t* lens = malloc(sizeof(int64_t) * (size_t)N);
    int64_t maxb = 0, longest = 0;
    for (int s = 0; s < N; s++) {
        lens[s] = s == 1 ? shared_len + 1 : shared_len + 1 + (int64_t)((rnd() + 1) * 40);
        maxb = (lens[s] + BS - 1) / BS > maxb ? (lens[s] + BS - 1) / BS : maxb;
        longest = lens[s] > longest ? lens[s] : longest;
    }
    const int64_t nb = N * maxb;
    int64_t* bt = malloc(sizeof(int64_t) * (size_t)nb);
    int64_t step = 7;  /* scattered, distinct: a step coprime with nb */
    while (gcd64(step, nb) != 1) step += 2;
    for (int64_t i = 0; i < nb; i++) bt[i] = (i * step) % nb;
    for (int s = 1; s < n_shared; s++)
        for (int b = 0; b < shared; b++) bt[s * maxb + b] = bt[b];
    uint16_t *kc = malloc((size_t)(nb * BS * row_len) * 2), *vc = malloc((size_t)(nb * BS * row_len) * 2);
    for (int64_t i = 0; i < nb * BS * row_len; i++) kc[i] = f32_to_bf16(rnd() * 2), vc[i] = f32_to_bf16(rnd());
    uint16_t *q = malloc((size_t)N * H * D * 2), *o = malloc((size_t)N * H * D * 2);
    for (int64_t i = 0; i < (int64_t)N * H * D; i++) q[i] = f32_to_bf16(rnd() * 2);
    const float scale = 1.f / sqrtf((float)D);
    paged_decode_bf16(q, (int64_t)H * D, kc, vc, bt, maxb, lens, o, N, H, KVH, D, BS, scale, (int)longest);
    double* p = malloc(sizeof(double) * (size_t)longest);
    int ok = 1;
    for (int r = 0; r < N && ok; r++)
        for (int h = 0; h < H && ok; h++) {
            const int64_t row = (int64_t)r * H + h;
            ok = attention_row_ok(q + row * D, kc, vc, bt + r * maxb, lens[r], BS, row_len, h / (H / KVH), D, scale,
                                  o + row * D, p);
        }
    report(ok, what);
    free(lens); free(bt); free(kc); free(vc); free(q); free(o); free(p);
}

/* an encoder's attention: each request's rows over every row of the request, both ways; q, k
 * and v read in place from one fused [T][(H + 2 KVH) D] output, as the model hands them over */
static void check_encoder(int H, int KVH, int D) {
    char what[96];
    snprintf(what, sizeof what, "encoder_attention_bf16 H=%d KVH=%d D=%d", H, KVH, D);
    const int R = 3;
    const int64_t len[3] = {5, 70, 130}, stride = (int64_t)(H + 2 * KVH) * D;
    int64_t q_start[3], T = 0;
    for (int r = 0; r < R; r++) { q_start[r] = T; T += len[r]; }
    uint16_t *qkv = malloc((size_t)T * stride * 2), *o = malloc((size_t)T * H * D * 2);
    for (int64_t i = 0; i < T * stride; i++) qkv[i] = f32_to_bf16(rnd() * 2);
    const uint16_t *k = qkv + (int64_t)H * D, *v = k + (int64_t)KVH * D;
    void* ws = malloc((size_t)encoder_attention_workspace(len, R, H, KVH, D) + 64);
    const float scale = 1.f / sqrtf((float)D);
    int ok = encoder_attention_bf16(qkv, stride, k, v, stride, q_start, len, o, R, H, KVH, D, scale, ws) == 0;
    double* p = malloc(sizeof(double) * 256);
    for (int r = 0; r < R && ok; r++)
        for (int64_t i = 0; i < len[r] && ok; i++)
            for (int h = 0; h < H && ok; h++) {
                const int64_t row = q_start[r] + i, kh = h / (H / KVH);
                double mx = -INFINITY, sum = 0;
                for (int64_t t = 0; t < len[r]; t++) {
                    const uint16_t* kr = k + (q_start[r] + t) * stride + kh * D;
                    double d = 0;
                    for (int e = 0; e < D; e++) d += (double)b2f(qkv[row * stride + h * D + e]) * b2f(kr[e]);
                    p[t] = d * scale;
                    mx = p[t] > mx ? p[t] : mx;
                }
                for (int64_t t = 0; t < len[r]; t++) sum += p[t] = exp(p[t] - mx);
                for (int e = 0; e < D && ok; e++) {
                    double ref = 0;
                    for (int64_t t = 0; t < len[r]; t++)
                        ref += p[t] / sum * b2f(v[(q_start[r] + t) * stride + kh * D + e]);
                    ok = fabs(b2f(o[(row * H + h) * D + e]) - ref) <= 1e-2 + fabs(ref) / 64;
                }
            }
    report(ok, what);
    free(qkv); free(o); free(ws); free(p);
}

#ifdef HAVE_AVX512_BF16
/* exp2_for_bf16, the softmax's 2^x: within a relative 1e-4 of 2^x wherever that is a normal
 * float (the bf16 rounding after it errs by up to 2e-3), and 0 for -inf and far below (masked keys) */
static void check_exp2(void) {
    double worst = 0;
    int zeros = 1;
    for (int i = 0; i <= 40000; i++) {
        float x[16], y[16];
        for (int l = 0; l < 16; l++) x[l] = -126.f + 130.f * (float)(i * 16 + l) / (40001.f * 16);
        _mm512_storeu_ps(y, exp2_for_bf16(_mm512_loadu_ps(x)));
        for (int l = 0; l < 16; l++) {
            const double rel = fabs(y[l] / exp2((double)x[l]) - 1);
            worst = rel > worst ? rel : worst;
        }
    }
    const float far[4] = {-INFINITY, -1e30f, -250.f, -200.5f};
    for (int l = 0; l < 4; l++) zeros &= _mm512_reduce_add_ps(exp2_for_bf16(_mm512_set1_ps(far[l]))) == 0.f;
    report(worst <= 1e-4, "exp2_for_bf16 within 1e-4 of 2^x on [-126, 4]");
    report(zeros, "exp2_for_bf16 is 0 for -inf and below -200");
}
#endif

int main(void) {
    report(gemm_bf16_supported() == 1, "gemm_bf16_supported");
    const int shapes[][3] = {{1, 100, 33}, {5, 64, 40}, {7, 160, 96}, {8, 128, 64}, {13, 64, 7},
                             {30, 96, 64}, {97, 70, 1}, {100, 1000, 40},
                             /* K a multiple of 32, 16 rows or more: the AMX tiles at amx_bf16 (rows past a
                              * multiple of 16, past a 32-row block, past an L2 block of rows: 128 where a
                              * panel outgrows L1, up to 512 where it fits) */
                             {16, 64, 64}, {37, 96, 96}, {48, 100, 32}, {133, 160, 64}, {133, 64, 800},
                             {530, 96, 64}};
    for (unsigned s = 0; s < sizeof shapes / sizeof shapes[0]; s++) check_gemm(shapes[s][0], shapes[s][1], shapes[s][2]);
    check_prefill(4, 2, 64, 16);
    check_prefill(9, 3, 32, 32);
    check_prefill(8, 1, 128, 16);
    check_prefill(6, 2, 96, 16);  /* a last group of 32 head-dim columns on the AMX tiles */
    if (paged_prefill_supported(48)) check_prefill(4, 2, 48, 16);
    check_decode_shared(40, 36, 9, 3, 64, 16, 12);  /* several passes of 3 query heads a kv head */
    check_decode_shared(40, 36, 8, 8, 64, 16, 12);  /* one query head a kv head */
    check_decode_shared(12, 12, 8, 2, 128, 5, 20);  /* head_dim 128; a prefix of 100 keys: no whole 32 */
    check_encoder(4, 4, 64);  /* BERT's: as many kv heads as heads */
    check_encoder(12, 12, 32);
    check_encoder(6, 2, 96);
#ifdef HAVE_AVX512_BF16
    check_exp2();
#endif
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
