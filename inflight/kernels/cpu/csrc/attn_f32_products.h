/*
 * The vector products of float32 paged attention (attn_f32.h), on vec.h: unaligned
 * loads and stores, the transpose-and-add reduction of VL dot products (af_reduce_each),
 * the VL x VL transpose of VL vectors (af_transpose),
 * masked selects, the Q.K product of a row against VL keys (af_qk) and the P.V register
 * blocks (af_pv, af_pv_rows). Included by attn_f32.h only, after AF_KT, AF_DV and AF_PAD.
 */
#ifndef INFLIGHT_ATTN_F32_PRODUCTS_H
#define INFLIGHT_ATTN_F32_PRODUCTS_H

#include <stdint.h>

#include "vec.h"

/* Unaligned vector load / store as a plain dereference of the under-aligned vf type.
 * NOTE: vec.h's memcpy-based vf_load compiled (GCC 12, -mavx2 with generic tuning,
 * which splits unaligned 256-bit loads) into a store to the stack and a reload that
 * misses store forwarding: many times slower in these inner loops. */
#define AF_LD(p) (*(const vf*)(const void*)(p))
#define AF_ST(p, v) (*(vf*)(void*)(p) = (v))

/* x and y folded lane-pairwise at chunk size s: chunks 2c and 2c+1 of [x y] summed
 * into chunk c (a transpose-and-add step; the masks are constants, so each shuffle is
 * one or two instructions) */
#define AF_LO(s, k) ((2 * ((k) / (s))) * (s) + (k) % (s))
#define AF_HI(s, k) (AF_LO(s, k) + (s))
#if VL == 4
#define AF_MASK(F, s) ((vi){F(s, 0), F(s, 1), F(s, 2), F(s, 3)})
#elif VL == 8
#define AF_MASK(F, s) ((vi){F(s, 0), F(s, 1), F(s, 2), F(s, 3), F(s, 4), F(s, 5), F(s, 6), F(s, 7)})
#elif VL == 16
#define AF_MASK(F, s) ((vi){F(s, 0), F(s, 1), F(s, 2), F(s, 3), F(s, 4), F(s, 5), F(s, 6), F(s, 7), \
                            F(s, 8), F(s, 9), F(s, 10), F(s, 11), F(s, 12), F(s, 13), F(s, 14), F(s, 15)})
#endif
#define AF_FOLD(x, y, s) (__builtin_shuffle((x), (y), AF_MASK(AF_LO, s)) + __builtin_shuffle((x), (y), AF_MASK(AF_HI, s)))
#define AF_LEVEL(s) for (int p = 0; p < (s); p++) b[p] = AF_FOLD(b[2 * p], b[2 * p + 1], s);

/* VL vectors -> one: lane j = the sum of a[j]'s lanes */
#if defined(INFLIGHT_ISA_AVX2)
static inline __attribute__((always_inline)) vf af_reduce_each(const vf* a) {
    /* hadd pairs within 128-bit lanes, then one cross-lane add (15 uops; GCC makes the
     * generic tree below into ~21 with vpermd and blends) */
    const __m256 t0 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]), t1 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
    const __m256 t2 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]), t3 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return (vf)_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#else
static inline __attribute__((always_inline)) vf af_reduce_each(const vf* a) {
    vf b[VL];
    for (int j = 0; j < VL; j++) b[j] = a[j];
#if VL >= 16
    AF_LEVEL(8)
#endif
#if VL >= 8
    AF_LEVEL(4)
#endif
    AF_LEVEL(2)
    AF_LEVEL(1)
    return b[0];
}
#endif

/* a[i][k] <-> a[k][i] for the VL x VL block in the VL vectors a: at each scale w the
 * off-diagonal w x w blocks of each pair of rows i, i + w swap, two shuffles a pair */
#define AF_TLO(w, k) (((k) & (w)) ? VL + (k) - (w) : (k))
#define AF_THI(w, k) (((k) & (w)) ? VL + (k) : (k) + (w))
#define AF_TSTAGE(w)                                                        \
    _Pragma("GCC unroll 16") for (int i = 0; i < VL; i++)                   \
        if (!(i & (w))) {                                                   \
            const vf x = a[i], y = a[i + (w)];                              \
            a[i] = __builtin_shuffle(x, y, AF_MASK(AF_TLO, w));             \
            a[i + (w)] = __builtin_shuffle(x, y, AF_MASK(AF_THI, w));       \
        }
static inline __attribute__((always_inline)) void af_transpose(vf* a) {
#if VL >= 16
    AF_TSTAGE(8)
#endif
#if VL >= 8
    AF_TSTAGE(4)
#endif
    AF_TSTAGE(2)
    AF_TSTAGE(1)
}
#undef AF_TSTAGE
#undef AF_TLO
#undef AF_THI

/* lanes of a where mask is set (all ones), else b */
static inline vf af_select(vi mask, vf a, vf b) {
    vi ai, bi;
    memcpy(&ai, &a, sizeof a);
    memcpy(&bi, &b, sizeof b);
    ai = (ai & mask) | (bi & ~mask);
    memcpy(&a, &ai, sizeof a);
    return a;
}

/* all ones in lanes [lo, hi), zero in the rest (lo may be negative, hi past VL) */
static inline vi af_range_mask(int64_t lo, int64_t hi) {
    vi lane;
    for (int i = 0; i < VL; i++) lane[i] = i;
    return (lane >= (vi){0} + (int32_t)(lo > 0 ? lo : 0)) & (lane < (vi){0} + (int32_t)(hi < VL ? hi : VL));
}

/* lanes [lo, hi) of a, the rest `fill` (lo may be negative, hi past VL) */
static inline vf af_keep_range(vf a, int64_t lo, int64_t hi, float fill) {
    if (lo <= 0 && hi >= VL) return a;
    return af_select(af_range_mask(lo, hi), a, vf_set1(fill));
}

/* lanes [0, n) of a, the rest `fill` */
static inline vf af_keep(vf a, int64_t n, float fill) { return af_keep_range(a, 0, n, fill); }

/* lane j = q . k[j][ko ..] for the VL key rows k[0..VL); q is padded with zeros to AF_PAD(D) */
static inline __attribute__((always_inline)) vf af_qk(const float* q, const float* const* k, int64_t ko, int D) {
    vf a[VL];
#pragma GCC unroll 16
    for (int j = 0; j < VL; j++) a[j] = vf_zero();
    const int nf = D / VL;
    for (int i = 0; i < nf; i++) {
        const vf qi = AF_LD(q + i * VL);
#pragma GCC unroll 16
        for (int j = 0; j < VL; j++) a[j] = vf_fma(qi, AF_LD(k[j] + ko + i * VL), a[j]);
    }
    if (D % VL) {
        const vf qi = AF_LD(q + nf * VL);
#pragma GCC unroll 16
        for (int j = 0; j < VL; j++) a[j] = vf_fma(qi, vf_load_n(k[j] + ko + nf * VL, D % VL), a[j]);
    }
    return af_reduce_each(a);
}

/* o[g][d0 .. d0 + DV*VL) += sum_j p[g][j] v[j][ko + d0 ..] for GB rows over nk keys; n:
 * the dims left from d0 (only the DV == 1 tail block ever has n < VL) */
static inline __attribute__((always_inline)) void af_pv(const int GB, const int DV, float* const* o,
                                                        const float* const* p, const float* const* v, int64_t ko,
                                                        int nk, int64_t d0, int64_t n) {
    vf acc[4 * 4];
    for (int g = 0; g < GB; g++)
        for (int i = 0; i < DV; i++) acc[g * DV + i] = AF_LD(o[g] + d0 + i * VL);
    if (n >= DV * VL) {
        for (int j = 0; j < nk; j++) {
            vf vv[4];
            for (int i = 0; i < DV; i++) vv[i] = AF_LD(v[j] + ko + d0 + i * VL);
            for (int g = 0; g < GB; g++) {
                const vf pj = vf_set1(p[g][j]);
                for (int i = 0; i < DV; i++) acc[g * DV + i] = vf_fma(pj, vv[i], acc[g * DV + i]);
            }
        }
    } else {  /* DV == 1, a tail of n < VL dims */
        for (int j = 0; j < nk; j++) {
            const vf vv = vf_load_n(v[j] + ko + d0, n);
            for (int g = 0; g < GB; g++) acc[g] = vf_fma(vf_set1(p[g][j]), vv, acc[g]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int i = 0; i < DV; i++) AF_ST(o[g] + d0 + i * VL, acc[g * DV + i]);
}

/* rows [r0, R) of the padded output buffer ob += P V, P rows in sb (AF_KT apart), V at
 * offset ko of each row v[j] */
static inline void af_pv_rows(float* ob, const float* sb, int r0, int R, int Dp, int D, const float* const* v,
                              int64_t ko, int nk) {
    for (int r = r0; r < R; r += 4) {
        const int gb = R - r < 4 ? R - r : 4;
        float* o[4];
        const float* p[4];
        for (int g = 0; g < gb; g++) {
            o[g] = ob + (int64_t)(r + g) * Dp;
            p[g] = sb + (int64_t)(r + g) * AF_KT;
        }
        int64_t d0 = 0;
#define AF_PV(DV, N)                                          \
        switch (gb) {                                         \
        case 4: af_pv(4, DV, o, p, v, ko, nk, d0, N); break;      \
        case 3: af_pv(3, DV, o, p, v, ko, nk, d0, N); break;      \
        case 2: af_pv(2, DV, o, p, v, ko, nk, d0, N); break;      \
        default: af_pv(1, DV, o, p, v, ko, nk, d0, N); break;     \
        }
        for (; d0 + AF_DV * VL <= D; d0 += AF_DV * VL) AF_PV(AF_DV, AF_DV * VL)
        for (; d0 + VL <= D; d0 += VL) AF_PV(1, VL)
        if (d0 < D) AF_PV(1, D - d0)
#undef AF_PV
    }
}

#endif
