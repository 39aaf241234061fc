/* e^x and SiLU on the vector layer, written once for every ISA level (vec.h includes this
 * at its end, so every kernel that includes vec.h has them). */
#ifndef INFLIGHT_VEC_EXP_H
#define INFLIGHT_VEC_EXP_H

/* e^x = 2^n * p: n per lane and p(r), r = x - n ln2 in [-ln2/2, ln2/2], a degree-6 Taylor
 * polynomial (relative error ~2e-7), for x the caller has clamped (no NaN from -inf) */
static inline vf vf_exp_core(vf x, vf* n_out) {
    const vf n = vf_round(x * 1.44269504089f);
    /* fused: the build's -fassociative-math would fold a mul-sub pair into x - n ln2 */
    vf r = vf_fma(n, vf_set1(-0.693145751953125f), x);
    r = vf_fma(n, vf_set1(-1.428606765330187e-06f), r);
    vf p = vf_set1(1.f / 720);
    p = vf_fma(p, r, vf_set1(1.f / 120));
    p = vf_fma(p, r, vf_set1(1.f / 24));
    p = vf_fma(p, r, vf_set1(1.f / 6));
    p = vf_fma(p, r, vf_set1(0.5f));
    p = vf_fma(p, r, vf_set1(1.f));
    *n_out = n;
    return vf_fma(p, r, vf_set1(1.f));
}

/* vf_exp_core with x clamped to [-104, 88] first (-inf included) */
static inline vf vf_exp_poly(vf x, vf* n_out) {
    return vf_exp_core(vf_min(vf_max(x, vf_set1(-104.f)), vf_set1(88.f)), n_out);
}

/* p * 2^n (n integral, down to -150: subnormal results), rounded once */
static inline vf vf_exp_scale(vf p, vf n) {
#if VL == 16
    return (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    /* from the exponent field, in two exact factors: the last multiplication rounds */
    const vi ni = __builtin_convertvector(n, vi);
    const vi h = ni / 2;
    const vi e1 = (h + 127) << 23, e2 = (ni - h + 127) << 23;
    const vf s1 = (vf)e1, s2 = (vf)e2;  /* same-size vector casts reinterpret the bits */
    return p * s1 * s2;
#endif
}

/* e^x per lane (relative error ~2e-7). Inputs below -104 give 0 (-inf included), above 88
 * saturate. */
static inline vf vf_exp(vf x) {
    vf n;
    const vf p = vf_exp_poly(x, &n);
    return vf_exp_scale(p, n);
}

/* vf_exp(x) in the lanes of keep (all ones), 0 in the others. NOTE: a softmax's masked lanes
 * (-inf scores) would each make a subnormal, for which AVX-512's scalef takes a microcode
 * assist: there those lanes are left out of it. */
static inline vf vf_exp_where(vi keep, vf x) {
    vf n;
    const vf p = vf_exp_poly(x, &n);
#if VL == 16
    return (vf)_mm512_maskz_scalef_ps(_mm512_test_epi32_mask((__m512i)keep, (__m512i)keep), (__m512)p, (__m512)n);
#else
    return (vf)((vi)vf_exp_scale(p, n) & keep);
#endif
}

/* silu(x) = x / (1 + e^-x) */
static inline vf vf_silu(vf x) { return x / (1.f + vf_exp(-x)); }

#endif
