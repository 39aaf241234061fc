/* The fused element-wise ops: add + RMSNorm, RoPE, SiLU-times-up, per-head RMSNorm. */
#include "check.h"

/* The verdict of a kernel that works in place on the q and k heads of fused qkv rows
 * (stride floats apart): within atol 1e-6 + rtol of want, and the v heads and the gap
 * after each row, where want holds the input, unchanged to the bit. */
static void report_qk_heads(const char* kernel, const float* qkv, const double* want, int rows, int64_t stride,
                            int nh, int nkv, int d, double rtol) {
    int untouched = 1;
    for (int r = 0; r < rows; r++)
        for (int64_t i = (int64_t)(nh + nkv) * d; i < stride; i++)
            untouched &= qkv[r * stride + i] == (float)want[r * stride + i];
    double wa = 0;
    const double e = err_ratio(qkv, want, rows * stride, 1e-6, rtol, &wa);
    char name[96];
    snprintf(name, sizeof name, "%s rows=%d heads=%d+%d d=%d", kernel, rows, nh, nkv, d);
    result(e <= 1 && untouched, name, "max abs err %.3g (atol 1e-6 + rtol %g), v heads %s", wa, rtol,
           untouched ? "untouched" : "CHANGED");
}

/* One add_rmsnorm_f32 call (residual += x when add, then RMSNorm into out, which is x when
 * alias) against the reference in double; the residual must be x + residual exactly. */
static void add_rmsnorm_case(int64_t D, int64_t rows, int add, int alias) {
    const int64_t n = rows * D;
    const float eps = 1e-6f;
    float* x = frand(n, 3.f);
    float* res = frand(n, 3.f);
    float* w = frand(D, 1.f);
    float* x0 = malloc(sizeof(float) * (size_t)n);
    float* res0 = malloc(sizeof(float) * (size_t)n);
    memcpy(x0, x, sizeof(float) * (size_t)n);
    memcpy(res0, res, sizeof(float) * (size_t)n);
    float* out = alias ? x : malloc(sizeof(float) * (size_t)n);
    double* want = malloc(sizeof(double) * (size_t)n);
    int res_ok = 1;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < D; i++) {
            const float h = add ? x0[r * D + i] + res0[r * D + i] : x0[r * D + i];
            ss += (double)h * h;
        }
        const double inv = 1.0 / sqrt(ss / (double)D + eps);
        for (int64_t i = 0; i < D; i++) {
            const float h = add ? x0[r * D + i] + res0[r * D + i] : x0[r * D + i];
            want[r * D + i] = (double)w[i] * h * inv;
        }
    }
    add_rmsnorm_f32(x, res, w, out, rows, D, eps, add);
    for (int64_t i = 0; i < n; i++)  /* residual: x + residual exactly, or untouched */
        res_ok &= res[i] == (add ? x0[i] + res0[i] : res0[i]);
    double wa = 0;
    const double e = err_ratio(out, want, n, 1e-6, 2e-6, &wa);
    char name[128];
    snprintf(name, sizeof name, "add_rmsnorm_f32 rows=%lld dim=%lld add=%d out=%s", (long long)rows,
             (long long)D, add, alias ? "x" : "separate");
    result(e <= 1 && res_ok, name, "max abs err %.3g (atol 1e-6 + rtol 2e-6), residual %s", wa,
           res_ok ? "right" : "WRONG");
    free(x);
    free(res);
    free(w);
    free(x0);
    free(res0);
    if (!alias) free(out);
    free(want);
}

/* residual += x (or not), then RMSNorm: rows, widths, out aliasing x or not. */
static void check_add_rmsnorm(void) {
    if (!present((const void*)add_rmsnorm_f32, "add_rmsnorm_f32")) return;
    const int64_t dims[] = {7, 64, 100, 2048};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int add = 0; add < 2; add++)
            for (int alias = 0; alias < 2; alias++) add_rmsnorm_case(dims[di], di % 2 ? 5 : 1, add, alias);
}

/* Rotate-half RoPE in place on the q and k heads of strided qkv rows. */
static void check_rope(void) {
    if (!present((const void*)rope_f32, "rope_f32")) return;
    const int ds[] = {6, 64, 80, 128};
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        const int d = ds[di], half = d / 2, nh = 4, nkv = 2, rows = 3;
        const int64_t stride = (int64_t)(nh + 2 * nkv) * d + 5;  /* q, k, v heads and a gap */
        float* qkv = frand(rows * stride, 2.f);
        float* orig = malloc(sizeof(float) * (size_t)(rows * stride));
        memcpy(orig, qkv, sizeof(float) * (size_t)(rows * stride));
        float* cs = malloc(sizeof(float) * (size_t)(rows * d));
        float* sn = malloc(sizeof(float) * (size_t)(rows * d));
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < d; i++) {
                const double th = (r + 3) * pow(10000.0, -2.0 * (i % half) / d);
                cs[r * d + i] = (float)cos(th);
                sn[r * d + i] = (float)sin(th);
            }
        double* want = malloc(sizeof(double) * (size_t)(rows * stride));
        for (int64_t i = 0; i < rows * stride; i++) want[i] = orig[i];
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < nh + nkv; h++)
                for (int i = 0; i < half; i++) {
                    const int64_t o = r * stride + (int64_t)h * d;
                    const double a = orig[o + i], b = orig[o + i + half];
                    want[o + i] = a * cs[r * d + i] - b * sn[r * d + i];
                    want[o + i + half] = b * cs[r * d + i + half] + a * sn[r * d + i + half];
                }
        rope_f32(qkv, rows, stride, nh, nkv, d, cs, sn);
        report_qk_heads("rope_f32", qkv, want, rows, stride, nh, nkv, d, 1e-6);
        free(qkv);
        free(orig);
        free(cs);
        free(sn);
        free(want);
    }
}

/* SiLU(gate) * up over fused gate_up rows, nothing written past the end. */
static void check_silu_mul(void) {
    if (!present((const void*)silu_mul_f32, "silu_mul_f32")) return;
    const int64_t inters[] = {1, 7, 100, 1024};
    for (size_t ii = 0; ii < sizeof inters / sizeof inters[0]; ii++) {
        const int64_t I = inters[ii], rows = ii % 2 ? 3 : 1;
        float* gu = frand(rows * 2 * I, 8.f);
        float* out = malloc(sizeof(float) * (size_t)(rows * I + 1));
        out[rows * I] = -7.f;  /* a guard past the end */
        double* want = malloc(sizeof(double) * (size_t)(rows * I));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < I; i++) {
                const double g = gu[r * 2 * I + i];
                want[r * I + i] = g / (1.0 + exp(-g)) * gu[r * 2 * I + I + i];
            }
        silu_mul_f32(gu, out, rows, I);
        double wa = 0;
        const double e = err_ratio(out, want, rows * I, 1e-6, 1e-6, &wa);
        char name[96];
        snprintf(name, sizeof name, "silu_mul_f32 rows=%lld inter=%lld", (long long)rows, (long long)I);
        result(e <= 1 && out[rows * I] == -7.f, name, "max abs err %.3g (atol 1e-6 + rtol 1e-6)", wa);
        free(gu);
        free(out);
        free(want);
    }
}

void check_fused(void) {
    check_add_rmsnorm();
    check_rope();
    check_silu_mul();
}

/* Qwen3's per-head q/k RMSNorm in place on strided qkv rows: q heads with q_w, k heads with k_w,
 * v heads and the gap after each row keep their bits. */
void check_rmsnorm_heads(void) {
    if (!present((const void*)rmsnorm_heads_f32, "rmsnorm_heads_f32")) return;
    const int ds[] = {7, 64, 128};
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        const int d = ds[di], nh = 4, nkv = 2, rows = 3;
        const int64_t stride = (int64_t)(nh + 2 * nkv) * d + 5, n = rows * stride;
        const float eps = 1e-6f;
        float* qkv = frand(n, 3.f);
        float* qw = frand(d, 1.f);
        float* kw = frand(d, 1.f);
        double* want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) want[i] = qkv[i];
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < nh + nkv; h++) {
                const int64_t o = r * stride + (int64_t)h * d;
                double ss = 0;
                for (int i = 0; i < d; i++) ss += (double)qkv[o + i] * qkv[o + i];
                const double inv = 1.0 / sqrt(ss / d + eps);
                for (int i = 0; i < d; i++) want[o + i] = (double)(h < nh ? qw : kw)[i] * qkv[o + i] * inv;
            }
        rmsnorm_heads_f32(qkv, rows, stride, nh, nkv, d, qw, kw, eps);
        report_qk_heads("rmsnorm_heads_f32", qkv, want, rows, stride, nh, nkv, d, 2e-6);
        free(qkv);
        free(qw);
        free(kw);
        free(want);
    }
}
