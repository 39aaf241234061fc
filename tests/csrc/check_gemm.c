/* The fp32 panel GEMM, its SiLU and argmax epilogues, and the low-bit panels. */
#include "check.h"

/* W [N, K] into panels of NR columns, K-major: packed[N/NR][K][NR], zero past N */
static float* pack_f32(const float* w, int64_t N, int64_t K, int NR) {
    const int64_t panels = (N + NR - 1) / NR;
    float* p = calloc((size_t)(panels * (K > 0 ? K : 1) * NR), sizeof(float));
    for (int64_t q = 0; q < panels; q++)
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < NR; j++)
                if (q * NR + j < N) p[(q * K + k) * NR + j] = w[(q * NR + j) * K + k];
    return p;
}

/* out = x . W^T (+ bias) in double, and sum |x_k w_k| per output (the rounding scale) */
static void ref_gemm(const float* x, int64_t M, int64_t K, int64_t lda, const float* w, int64_t N, const float* bias,
                     double* out, double* mag) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0, a = bias ? fabs(bias[n]) : 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = (double)x[m * lda + k] * w[n * K + k];
                s += t;
                a += fabs(t);
            }
            out[m * N + n] = s;
            mag[m * N + n] = a;
        }
}

/* max |got - want| / (1e-7 + 2e-7 sqrt(K) mag) over an M x N output (got rows ldc apart) */
static double gemm_err(const float* got, int64_t ldc, const double* want, const double* mag, int64_t M, int64_t N,
                       int64_t K) {
    double r = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const double d = fabs(got[m * ldc + n] - want[m * N + n]);
            const double q = d / (1e-7 + 2e-7 * sqrt((double)(K > 0 ? K : 1)) * mag[m * N + n]);
            if (!(q <= r)) r = q;  /* NaN too */
        }
    return r;
}

/* a weight that is 4- or 8-bit underneath: per row n and block of 32 k, w = d * q + m
 * (d a half float's worth of bits, q in 0..15; 8-bit: w = d * q, q in -128..127), packed
 * both as fp32 panels and as the low-bit panels of panel_lowbit.h; the GEMMs over the
 * two must agree bit for bit */
static void check_gemm_lowbit(int NR, int bits) {
    typedef int (*lb_gemm)(const float*, int64_t, int64_t, int64_t, const uint8_t*, int64_t, const float*, float*,
                           int64_t);
    typedef int (*lb_silu)(const float*, int64_t, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t);
    const lb_gemm gemm = bits == 4 ? gemm_f32_q4 : gemm_f32_q8;
    const lb_silu silu = bits == 4 ? gemm_f32_q4_silu : gemm_f32_q8_silu;
    if (!present((const void*)gemm, bits == 4 ? "gemm_f32_q4" : "gemm_f32_q8") ||
        !present((const void*)silu, bits == 4 ? "gemm_f32_q4_silu" : "gemm_f32_q8_silu") ||
        !present((const void*)gemm_f32_lowbit_dequant, "gemm_f32_lowbit_dequant"))
        return;
    const int64_t K = 96, N = 4 * NR, panels = N / NR, kb = K / 32;
    const int64_t block = bits == 4 ? 8 * NR + 16 * NR : 4 * NR + 32 * NR;
    float* w = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t* qp = calloc((size_t)(panels * kb * block), 1);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < kb; b++) {
            const float d = (float)rnd_int(1, 2047) / 4096.f, m = bits == 4 ? (float)rnd_int(-2047, 2047) / 1024.f : 0;
            uint8_t* blk = qp + ((n / NR) * kb + b) * block;
            memcpy(blk + 4 * (n % NR), &d, 4);
            if (bits == 4) memcpy(blk + 4 * NR + 4 * (n % NR), &m, 4);
            for (int k = 0; k < 32; k++) {
                const int q = bits == 4 ? rnd_int(0, 15) : rnd_int(-128, 127);
                w[n * K + b * 32 + k] = bits == 4 ? d * (float)q + m : d * (float)q;
                if (bits == 4) blk[8 * NR + (k / 2) * NR + n % NR] |= (uint8_t)(q << (k % 2 ? 4 : 0));
                else blk[4 * NR + k * NR + n % NR] = (uint8_t)(int8_t)q;
            }
        }
    float* packed = pack_f32(w, N, K, NR);
    float* back = malloc(sizeof(float) * (size_t)(N * K));
    const int rcd = gemm_f32_lowbit_dequant(qp, bits, panels, K, back);
    char name[96];
    snprintf(name, sizeof name, "gemm_f32_lowbit_dequant bits=%d", bits);
    result(rcd == 0 && memcmp(back, packed, sizeof(float) * (size_t)(N * K)) == 0, name,
           "rc %d; the fp32 panels bit for bit", rcd);
    const int64_t rows[] = {1, 7, 33};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const int64_t M = rows[r];
        float* x = frand(M * K, 1.f);
        float* bias = frand(N, 1.f);
        float *a = malloc(sizeof(float) * (size_t)(M * N)), *c = malloc(sizeof(float) * (size_t)(M * N));
        const int rc = gemm(x, M, K, K, qp, N, bias, a, N);
        gemm_f32(x, M, K, K, packed, N, bias, c, N);
        snprintf(name, sizeof name, "gemm_f32_q%d M=%lld K=%lld N=%lld", bits, (long long)M, (long long)K,
                 (long long)N);
        result(rc == 0 && memcmp(a, c, sizeof(float) * (size_t)(M * N)) == 0, name, "rc %d; gemm_f32's bits", rc);
        const int rcs = silu(x, M, K, K, qp, N, a, N / 2);
        gemm_f32_silu(x, M, K, K, packed, N, c, N / 2);
        snprintf(name, sizeof name, "gemm_f32_q%d_silu M=%lld", bits, (long long)M);
        result(rcs == 0 && memcmp(a, c, sizeof(float) * (size_t)(M * N / 2)) == 0, name,
               "rc %d; gemm_f32_silu's bits", rcs);
        free(x);
        free(bias);
        free(a);
        free(c);
    }
    free(w);
    free(qp);
    free(packed);
    free(back);
}

/* The panel width, checked (and gemm_f32_isa's name for the level); 0 where unusable. */
static int checked_panel(void) {
    const int NR = gemm_f32_panel ? gemm_f32_panel() : 0;
#if defined(INFLIGHT_ISA_AMX_BF16)
    const char* level = "amx_bf16";
#elif defined(INFLIGHT_ISA_AVX512_BF16)
    const char* level = "avx512_bf16";  /* the ISA level's name, not vec.h's (avx512 for both) */
#else
    const char* level = VEC_ISA_NAME;
#endif
    if (gemm_f32_isa)
        result(strcmp(gemm_f32_isa(), level) == 0, "gemm_f32_isa", "\"%s\" (driver built for \"%s\")",
               gemm_f32_isa(), level);
    result(NR > 0 && NR % VL == 0, "gemm_f32_panel", "NR %d, VL %d", NR, VL);
    return NR > 0 && NR % VL == 0 ? NR : 0;
}

struct gcase {
    int64_t M, K, N, lda_pad, ldc_pad;
    int bias;
};

/* gemm_f32_argmax against the first largest of gemm_f32's plain outputs (out, rows ldc apart) */
static void check_argmax_case(struct gcase g, const float* x, int64_t lda, const float* packed, const float* out,
                              int64_t ldc) {
    int64_t* tok = malloc(sizeof(int64_t) * (size_t)g.M);
    const int rca = gemm_f32_argmax(x, g.M, g.K, lda, packed, g.N, tok);
    int ok = rca == 0;
    for (int64_t m = 0; m < g.M && ok; m++) {
        int64_t b = 0;
        for (int64_t n = 1; n < g.N; n++) b = out[m * ldc + n] > out[m * ldc + b] ? n : b;
        ok &= tok[m] == b;
    }
    char name[128];
    snprintf(name, sizeof name, "gemm_f32_argmax M=%lld K=%lld N=%lld", (long long)g.M, (long long)g.K,
             (long long)g.N);
    result(ok, name, "rc %d; the first largest of gemm_f32's outputs", rca);
    free(tok);
}

/* The same bits with one thread as with nt, and for a row alone as in its batch. */
static int same_bits(struct gcase g, const float* x, int64_t lda, const float* packed, const float* bias,
                     const float* out, float* out1, int64_t ldc, int nt) {
    omp_set_num_threads(1);
    gemm_f32(x, g.M, g.K, lda, packed, g.N, bias, out1, ldc);
    omp_set_num_threads(nt);
    int same = 1;
    for (int64_t m = 0; m < g.M; m++)
        for (int64_t n = 0; n < g.N; n++) same &= memcmp(&out[m * ldc + n], &out1[m * ldc + n], 4) == 0;
    for (int64_t m = 0; m < g.M; m += 1 + g.M / 5) {
        gemm_f32(x + m * lda, 1, g.K, lda, packed, g.N, bias, out1, ldc);
        same &= memcmp(out1, out + m * ldc, sizeof(float) * (size_t)g.N) == 0;
    }
    return same;
}

/* One shape: against the reference in double, nothing written past N, the same bits at any
 * thread count or batch, and the argmax over its outputs. */
static void gemm_case(struct gcase g, int NR, int nt, int have_argmax) {
    const int64_t lda = g.K + g.lda_pad, ldc = g.N + g.ldc_pad;
    float* x = frand(g.M * lda, 1.f);
    float* w = frand(g.N * g.K, 1.f);
    float* bias = g.bias ? frand(g.N, 1.f) : NULL;
    float* packed = pack_f32(w, g.N, g.K, NR);
    float* out = malloc(sizeof(float) * (size_t)(g.M * ldc));
    float* out1 = malloc(sizeof(float) * (size_t)(g.M * ldc));
    for (int64_t i = 0; i < g.M * ldc; i++) out[i] = out1[i] = -7.f;
    double* want = malloc(sizeof(double) * (size_t)(g.M * g.N));
    double* mag = malloc(sizeof(double) * (size_t)(g.M * g.N));
    ref_gemm(x, g.M, g.K, lda, w, g.N, bias, want, mag);
    const int rc = gemm_f32(x, g.M, g.K, lda, packed, g.N, bias, out, ldc);
    const double e = gemm_err(out, ldc, want, mag, g.M, g.N, g.K);
    int gaps = 1;  /* the columns between N and ldc stay untouched */
    for (int64_t m = 0; m < g.M; m++)
        for (int64_t n = g.N; n < ldc; n++) gaps &= out[m * ldc + n] == -7.f;
    char name[128];
    snprintf(name, sizeof name, "gemm_f32 M=%lld K=%lld N=%lld lda=%lld ldc=%lld bias=%d", (long long)g.M,
             (long long)g.K, (long long)g.N, (long long)lda, (long long)ldc, g.bias);
    result(rc == 0 && e <= 1 && gaps, name, "rc %d, err / (1e-7 + 2e-7 sqrt(K) sum|xw|) = %.3g (limit 1)%s", rc,
           e, gaps ? "" : ", wrote past N");
    const int same = same_bits(g, x, lda, packed, bias, out, out1, ldc, nt);
    snprintf(name, sizeof name, "gemm_f32 M=%lld K=%lld N=%lld bit-identical", (long long)g.M, (long long)g.K,
             (long long)g.N);
    result(same, name, "1 vs %d threads, a row alone vs in the batch", nt);
    if (have_argmax && g.K > 0 && !g.bias) check_argmax_case(g, x, lda, packed, out, ldc);
    free(x);
    free(w);
    free(bias);
    free(packed);
    free(out);
    free(out1);
    free(want);
    free(mag);
}

/* Ties: equal weight rows in different panels and lanes give equal outputs; the first wins. */
static void check_argmax_ties(int NR) {
    const int64_t M = 4, K = 50, N = 3 * NR + 5;
    float* x = frand(M * K, 1.f);
    for (int64_t i = 0; i < M * K; i++) x[i] = fabsf(x[i]);
    float* w = frand(N * K, 0.1f);
    const int64_t cols[3] = {NR + 1, 2 * NR + 3, N - 1};
    for (int j = 0; j < 3; j++)
        for (int64_t k = 0; k < K; k++) w[cols[j] * K + k] = 1.f;
    float* packed = pack_f32(w, N, K, NR);
    int64_t tok[4];
    const int rc = gemm_f32_argmax(x, M, K, K, packed, N, tok);
    result(rc == 0 && tok[0] == cols[0] && tok[1] == cols[0] && tok[2] == cols[0] && tok[3] == cols[0],
           "gemm_f32_argmax ties", "columns %lld, %lld, %lld tie: got %lld (want %lld)", (long long)cols[0],
           (long long)cols[1], (long long)cols[2], (long long)tok[0], (long long)cols[0]);
    free(x);
    free(w);
    free(packed);
}

/* gemm_f32_silu: SiLU(gate) * up of the fused gate_up product, with the rounding of both
 * carried into the limit; a width that is not whole panel pairs is refused. */
static void check_gemm_silu(int NR) {
    const int64_t shapes[][3] = {{1, 64, 2 * NR}, {9, 130, 6 * NR}, {40, 300, 4 * NR}};
    for (int c = 0; c < 3; c++) {
        const int64_t M = shapes[c][0], K = shapes[c][1], N = shapes[c][2], H = N / 2, ldc = H + 3;
        float* x = frand(M * K, 1.f);
        float* w = frand(N * K, 1.f);
        float* packed = pack_f32(w, N, K, NR);
        float* out = malloc(sizeof(float) * (size_t)(M * ldc));
        double* gu = malloc(sizeof(double) * (size_t)(M * N));
        double* mag = malloc(sizeof(double) * (size_t)(M * N));
        double* want = malloc(sizeof(double) * (size_t)(M * H));
        double* wmag = malloc(sizeof(double) * (size_t)(M * H));
        ref_gemm(x, M, K, K, w, N, NULL, gu, mag);
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < H; j++) {
                const double g = gu[m * N + j], u = gu[m * N + H + j], sg = 1.0 / (1.0 + exp(-g));
                want[m * H + j] = g * sg * u;
                /* the rounding of gate and up carries through: d(silu(g) u) = silu'(g) u dg + silu(g) du */
                wmag[m * H + j] =
                    fabs((sg * (1 + g * (1 - sg))) * u) * mag[m * N + j] + fabs(g * sg) * mag[m * N + H + j];
            }
        const int rc = gemm_f32_silu(x, M, K, K, packed, N, out, ldc);
        const double e = gemm_err(out, ldc, want, wmag, M, H, K);
        char name[96];
        snprintf(name, sizeof name, "gemm_f32_silu M=%lld K=%lld N=%lld", (long long)M, (long long)K, (long long)N);
        result(rc == 0 && e <= 1, name, "rc %d, err / (1e-7 + 2e-7 sqrt(K) scale) = %.3g (limit 1)", rc, e);
        free(x);
        free(w);
        free(packed);
        free(out);
        free(gu);
        free(mag);
        free(want);
        free(wmag);
    }
    float one = 1.f, o;
    result(gemm_f32_silu(&one, 1, 1, 1, &one, NR, &o, 1) == -2, "gemm_f32_silu refuses N % 2NR != 0", "-2");
}

void check_gemm(void) {
    if (!present((const void*)gemm_f32, "gemm_f32")) return;
    const int NR = checked_panel();
    if (!NR) return;
    check_gemm_lowbit(NR, 4);
    check_gemm_lowbit(NR, 8);
    const int nt = omp_get_max_threads();
    const int have_argmax = present((const void*)gemm_f32_argmax, "gemm_f32_argmax");
    const struct gcase cases[] = {
        {1, 64, 64, 0, 0, 0},     /* decode: one row */
        {7, 100, 37, 3, 5, 1},    /* ragged N, strided x and out, bias */
        {3, 1, 20, 0, 0, 1},      /* K = 1 */
        {2, 0, 9, 0, 0, 1},       /* K = 0: out = bias */
        {33, 700, 70, 0, 0, 0},   /* K past one L1 chunk */
        {100, 300, 96, 1, 0, 1},  /* many row blocks */
        {5, 2000, 16, 0, 0, 0},   /* long K, few panels */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) gemm_case(cases[c], NR, nt, have_argmax);
    if (have_argmax) check_argmax_ties(NR);
    if (present((const void*)gemm_f32_silu, "gemm_f32_silu")) check_gemm_silu(NR);
}
