/* bf16 <-> float32 helpers shared by the CPU kernels (scalar, and AVX-512 where
 * the compiler targets AVX-512-BF16). */
#ifndef INFLIGHT_BF16_SIMD_H
#define INFLIGHT_BF16_SIMD_H
#include <stdint.h>

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)x) << 16;
    return v.f;
}

/* round to nearest even; a NaN stays a NaN */
static inline uint16_t f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16);
}

#if defined(INFLIGHT_ISA_AVX512_BF16)
#include <immintrin.h>

#include "vec.h"  /* 16 lanes here: exp512 is vec_exp.h's e^x on __m512 */
#define HAVE_AVX512_BF16 1

/* two rows of 32 bf16 values as 32-bit pairs (a[i], b[i]): *lo the pairs of values 0-15, *hi of
 * values 16-31 (the key-pair layout a tile product reads V in) */
static inline void pair_rows_epi16(__m512i a, __m512i b, __m512i* lo, __m512i* hi) {
    const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                           6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    *lo = _mm512_permutex2var_epi16(a, first, b);
    *hi = _mm512_permutex2var_epi16(a, _mm512_add_epi16(first, _mm512_set1_epi16(16)), b);
}

/* 16 rows of 16 32-bit values transposed in place: r[j][i] = r[i][j] */
static inline void transpose16_epi32(__m512i* r) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  /* r[4g + c]'s 128-bit lane L: column 4L + c of rows 4g..4g+3 */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++) {  /* then the 4 x 4 lanes of each c transposed */
        const __m512i p = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), q = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
        const __m512i u = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        const __m512i v = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_i32x4(p, u, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(p, u, 0xDD);
        t[4 + c] = _mm512_shuffle_i32x4(q, v, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(q, v, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* e^x for 16 floats: vec_exp.h's polynomial (relative error ~2e-7), clamped below only:
 * inputs below -100 give 0 (scalef underflows), -inf included; above ~88.7, inf. */
static inline __m512 exp512(__m512 x) {
    vf n;
    const vf p = vf_exp_core((vf)_mm512_max_ps(x, _mm512_set1_ps(-100.f)), &n);
    return (__m512)vf_exp_scale(p, n);
}

#define LOG2E_F 1.44269504088896341f  /* e^x = 2^(x log2 e) */

/* 2^x for 16 floats to a relative 8e-5, for probabilities that are rounded to bf16
 * (relative 2^-9) next: 2^n * p(f), f = x - n in [-1/2, 1/2], p a degree-3 fit of 2^f.
 * Half the instructions of exp512; inputs below -200 give 0 (scalef underflows), -inf
 * included. */
static inline __m512 exp2_for_bf16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-200.f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.05508868380751114f), f, _mm512_set1_ps(0.24260405145947936f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932762416819607f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999289403695112f));
    return _mm512_scalef_ps(p, n);
}

/* lanes [0, n) of a 16-lane vector */
static inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

static inline __m512 load_bf16x16(const uint16_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

static inline void store_bf16x16(uint16_t* p, __m512 x, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
}

/* bf16(x) as float32, as a store and reload would give */
static inline __m512 round_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)), 16));
}
#endif
#endif
