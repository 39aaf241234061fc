/* vec.h's primitives: e^x, SiLU, the reductions, the lane moves and the bf16 loads. */
#include "check.h"

static double exp_err(float x, float got) {
    /* relative error for normal results; results below FLT_MIN are subnormal, where
     * the spacing is 2^-149 and one rounding costs up to half of it */
    const double want = exp((double)x);
    const double d = fabs((double)got - want);
    return want >= FLT_MIN ? d / want : d / (want * 1e-6 + ldexp(1.0, -149));
}

void check_vec_exp(void) {
    float in[VL], out[VL];
    double worst = 0, worst_sub = 0;
    float worst_x = 0;
    /* a dense sweep of [-103.9, 88], then random points */
    for (int64_t i = 0; i < 400000; i += VL) {
        for (int l = 0; l < VL; l++) {
            const int64_t k = i + l;
            in[l] = k < 200000 ? -103.9f + (float)k * (191.9f / 200000.f) : 191.9f * (rnd() + 1.f) / 2.f - 103.9f;
        }
        vf_store(out, vf_exp(vf_load(in)));
        for (int l = 0; l < VL; l++) {
            const double e = exp_err(in[l], out[l]);
            if (exp((double)in[l]) >= FLT_MIN) {
                if (e > worst) { worst = e; worst_x = in[l]; }
            } else if (e > worst_sub) {
                worst_sub = e;
            }
        }
    }
    result(worst < 3e-7, "vf_exp relative error on [-87.3, 88]", "max %.3g at x=%.6g (limit 3e-7)", worst, worst_x);
    result(worst_sub <= 1.0, "vf_exp subnormal results on [-103.9, -87.3]",
           "max err / (2^-149 + 1e-6 |exp|) = %.3g (limit 1)", worst_sub);
    /* documented edges: below -104 (and -inf) 0, e^0 = 1 exactly, above 88 saturates, finite */
    const float edge[8] = {-INFINITY, -1000.f, -104.5f, 0.f, 88.f, 100.f, INFINITY, 1.f};
    float ein[VL], eout[VL];
    int ok = 1;
    for (int i = 0; i < 8; i += VL < 8 ? VL : 8) {
        const int n = 8 - i < VL ? 8 - i : VL;
        for (int l = 0; l < VL; l++) ein[l] = edge[i + (l < n ? l : 0)];
        vf_store(eout, vf_exp(vf_load(ein)));
        for (int l = 0; l < n; l++) {
            const float x = ein[l], y = eout[l];
            if (x < -104.f) ok &= y == 0.f;
            else if (x == 0.f) ok &= y == 1.f;
            else if (x >= 88.f) ok &= isfinite(y) && y > 1e38f;
            if (!ok) {
                result(0, "vf_exp edges", "vf_exp(%g) = %g", x, y);
                return;
            }
        }
    }
    result(1, "vf_exp edges", "-inf, < -104 -> 0; 0 -> 1; >= 88 finite and saturated");
}

void check_vec_silu(void) {
    float in[VL], out[VL];
    double worst = 0;
    for (int i = 0; i < 20000; i += VL) {
        for (int l = 0; l < VL; l++) in[l] = 80.f * rnd();
        vf_store(out, vf_silu(vf_load(in)));
        for (int l = 0; l < VL; l++) {
            const double x = in[l], want = x / (1.0 + exp(-x));
            const double e = fabs(out[l] - want) / (fabs(want) + 1e-30);
            worst = e > worst ? e : worst;
        }
    }
    result(worst < 1e-6, "vf_silu relative error on [-80, 80]", "max %.3g (limit 1e-6)", worst);
}

void check_vec_reductions(void) {
    float a[VL];
    /* exact on integers; within log2(VL) roundings of the double sum otherwise */
    int exact = 1;
    double worst = 0;
    for (int it = 0; it < 2000; it++) {
        double want = 0, mag = 0;
        for (int l = 0; l < VL; l++) {
            a[l] = (float)rnd_int(-1000, 1000);
            want += a[l];
        }
        exact &= (double)vf_reduce_add(vf_load(a)) == want;
        want = 0;
        for (int l = 0; l < VL; l++) {
            a[l] = ldexpf(rnd(), rnd_int(-8, 8));
            want += a[l];
            mag += fabs(a[l]);
        }
        const double e = fabs(vf_reduce_add(vf_load(a)) - want) / (mag * FLT_EPSILON * 4);
        worst = e > worst ? e : worst;
    }
    result(exact, "vf_reduce_add exact on integers", "VL=%d", VL);
    result(worst <= 1.0, "vf_reduce_add rounding", "max err / (4 eps sum|a|) = %.3g (limit 1)", worst);
    /* the max at every lane, all-negative vectors, -inf lanes */
    int ok = 1;
    for (int pos = 0; pos < VL; pos++)
        for (int sign = 0; sign < 2; sign++) {
            for (int l = 0; l < VL; l++) a[l] = sign ? -100.f - (float)l : (l % 2 ? -INFINITY : (float)l - 50.f);
            a[pos] = sign ? -1.5f : 77.f;
            ok &= vf_reduce_max(vf_load(a)) == (sign ? -1.5f : 77.f);
        }
    result(ok, "vf_reduce_max", "max at each lane, negative, -inf lanes");
}

void check_vec_lanes(void) {
    float a[VL], b[VL], c[VL], r[VL];
    int ok_fma = 1, ok_mm = 1;
    for (int it = 0; it < 1000; it++) {
        for (int l = 0; l < VL; l++) { a[l] = rnd(); b[l] = rnd(); c[l] = rnd(); }
        vf_store(r, vf_fma(vf_load(a), vf_load(b), vf_load(c)));
        for (int l = 0; l < VL; l++)  /* fused or not: within one rounding of the exact value */
            ok_fma &= fabs(r[l] - ((double)a[l] * b[l] + c[l])) <= 2 * FLT_EPSILON;
        vf_store(r, vf_max(vf_load(a), vf_load(b)));
        for (int l = 0; l < VL; l++) ok_mm &= r[l] == (a[l] > b[l] ? a[l] : b[l]);
        vf_store(r, vf_min(vf_load(a), vf_load(b)));
        for (int l = 0; l < VL; l++) ok_mm &= r[l] == (a[l] < b[l] ? a[l] : b[l]);
    }
    result(ok_fma, "vf_fma", "a*b+c within 2 eps");
    result(ok_mm, "vf_max / vf_min", "per lane");
    /* round: ties to even */
    const float rin[8] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.49f, 3.7f, -1e6f - 0.5f};
    const float rout[8] = {0.f, 2.f, 2.f, 0.f, -2.f, -2.f, 4.f, -1e6f};
    int ok_round = 1;
    for (int i = 0; i < 8; i += VL < 8 ? VL : 8) {
        const int n = 8 - i < VL ? 8 - i : VL;
        for (int l = 0; l < VL; l++) a[l] = rin[i + (l < n ? l : 0)];
        vf_store(r, vf_round(vf_load(a)));
        for (int l = 0; l < n; l++) ok_round &= r[l] == rout[i + l];
    }
    result(ok_round, "vf_round", "to nearest, ties to even");
    /* partial loads and stores: lanes past n are 0 on load and untouched on store */
    float src[2 * VL], dst[2 * VL];
    int ok_tail = 1;
    for (int i = 0; i < 2 * VL; i++) src[i] = (float)(i + 1);
    for (int n = 0; n <= VL; n++) {
        vf_store(r, vf_load_n(src, n));
        for (int l = 0; l < VL; l++) ok_tail &= r[l] == (l < n ? src[l] : 0.f);
        for (int i = 0; i < 2 * VL; i++) dst[i] = -7.f;
        vf_store_n(dst, vf_load(src), n);
        for (int i = 0; i < 2 * VL; i++) ok_tail &= dst[i] == (i < n ? src[i] : -7.f);
    }
    result(ok_tail, "vf_load_n / vf_store_n", "n = 0..VL");
    /* bf16 widening is exact */
    uint16_t h[VL];
    int ok_bf16 = 1;
    for (int it = 0; it < 100; it++) {
        for (int l = 0; l < VL; l++) h[l] = (uint16_t)(rnd_u32() & 0x7F7F) | (uint16_t)(rnd_u32() & 0x8000);
        vf_store(r, vf_load_bf16(h));
        for (int l = 0; l < VL; l++) {
            uint32_t u;
            memcpy(&u, &r[l], sizeof u);
            ok_bf16 &= u == (uint32_t)h[l] << 16;
        }
    }
    result(ok_bf16, "vf_load_bf16", "exact widening");
}
