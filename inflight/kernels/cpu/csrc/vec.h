/* The thin vector layer the fp32 kernels are written in: one vector of VL float32
 * lanes, whatever the ISA level the library is built for (build.py defines the
 * INFLIGHT_ISA_* macro):
 *
 *   AVX-512 (with or without bf16)  VL 16   __m512 through GCC vector extensions
 *   AVX2 + FMA                      VL 8    __m256
 *   NEON (aarch64)                  VL 4    float32x4_t
 *   scalar                          VL 4    plain C: the compiler lowers it to whatever
 *                                           the baseline has (SSE2, or scalar code)
 *
 * The type is a GCC vector extension, so + - * / and comparisons work on it directly
 * and a kernel needs no per-ISA branches; only what the extensions lack (FMA, min/max,
 * reductions) has an intrinsic per ISA here. NR_VECS-wide register tiles and the
 * microkernel shapes are chosen per ISA by the kernels from VL and VEC_REGS.
 */
#ifndef INFLIGHT_VEC_H
#define INFLIGHT_VEC_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(INFLIGHT_ISA_AVX512) || defined(INFLIGHT_ISA_AVX512_BF16)
#include <immintrin.h>
#define VL 16
#define VEC_REGS 32
#define VEC_ISA_NAME "avx512"
#elif defined(INFLIGHT_ISA_AVX2)
#include <immintrin.h>
#define VL 8
#define VEC_REGS 16
#define VEC_ISA_NAME "avx2"
#elif defined(INFLIGHT_ISA_NEON)
#include <arm_neon.h>
#define VL 4
#define VEC_REGS 32
#define VEC_ISA_NAME "neon"
#else
#define VL 4
#define VEC_REGS 16
#define VEC_ISA_NAME "scalar"
#endif

/* NOTE: 4-byte aligned, so a vf may sit at any float's address (packed rows, pool slots) */
typedef float vf __attribute__((vector_size(VL * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VL * 4), aligned(4)));

static inline vf vf_zero(void) { return (vf){0}; }
static inline vf vf_set1(float x) { return (vf){0} + x; }
/* NOTE: loads and stores through a may_alias, 4-byte-aligned vector type, not memcpy:
 * GCC 12 at -mavx2 splits a 32-byte memcpy into two 16-byte moves through the stack. */
typedef float vf_unaligned __attribute__((vector_size(VL * 4), aligned(4), may_alias));
static inline vf vf_load(const float* p) { return *(const vf_unaligned*)p; }
static inline void vf_store(float* p, vf v) { *(vf_unaligned*)p = v; }

/* lanes [0, n) from p, the rest 0 (n < VL: a row's tail) */
static inline vf vf_load_n(const float* p, int64_t n) {
    if (n >= VL) return vf_load(p);
    float t[VL] = {0};
    memcpy(t, p, sizeof(float) * (size_t)n);
    return vf_load(t);
}

static inline void vf_store_n(float* p, vf v, int64_t n) {
    if (n >= VL) { vf_store(p, v); return; }
    float t[VL];
    vf_store(t, v);
    memcpy(p, t, sizeof(float) * (size_t)n);
}

/* a * b + c, fused where the ISA has it (the same rounding on every lane) */
static inline vf vf_fma(vf a, vf b, vf c) {
#if VL == 16
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(INFLIGHT_ISA_AVX2)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(INFLIGHT_ISA_NEON)
    return (vf)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

static inline vf vf_max(vf a, vf b) {
#if VL == 16
    return (vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(INFLIGHT_ISA_AVX2)
    return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#elif defined(INFLIGHT_ISA_NEON)
    return (vf)vmaxq_f32((float32x4_t)a, (float32x4_t)b);
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = a[i] > b[i] ? a[i] : b[i];
    return r;
#endif
}

/* sum of the lanes, in a fixed order per ISA (pairwise halves) */
static inline float vf_reduce_add(vf a) {
#if VL == 16
    return _mm512_reduce_add_ps((__m512)a);
#elif defined(INFLIGHT_ISA_NEON)
    return vaddvq_f32((float32x4_t)a);
#else
    float t[VL];
    vf_store(t, a);
    for (int w = VL / 2; w > 0; w /= 2)
        for (int i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
#endif
}

/* the largest lane (exact in any order) */
static inline float vf_reduce_max(vf a) {
#if VL == 16
    return _mm512_reduce_max_ps((__m512)a);
#elif defined(INFLIGHT_ISA_AVX2)
    __m128 m = _mm_max_ps(_mm256_castps256_ps128((__m256)a), _mm256_extractf128_ps((__m256)a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
#else
    float t[VL];
    vf_store(t, a);
    float m = t[0];
    for (int i = 1; i < VL; i++) m = t[i] > m ? t[i] : m;
    return m;
#endif
}

/* the smaller lane (the second operand where one is NaN, as x86's min and -max(-a, -b) give it) */
static inline vf vf_min(vf a, vf b) {
#if VL == 16
    return (vf)_mm512_min_ps((__m512)a, (__m512)b);
#elif defined(INFLIGHT_ISA_AVX2)
    return (vf)_mm256_min_ps((__m256)a, (__m256)b);
#else
    return -vf_max(-a, -b);
#endif
}

/* whether a and b are equal in every lane (-inf equals -inf; NaN equals nothing) */
static inline int vf_all_eq(vf a, vf b) {
#if VL == 16
    return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_EQ_OQ) == 0xFFFF;
#elif defined(INFLIGHT_ISA_AVX2)
    return _mm256_movemask_ps(_mm256_cmp_ps((__m256)a, (__m256)b, _CMP_EQ_OQ)) == 0xFF;
#else
    for (int i = 0; i < VL; i++)
        if (!(a[i] == b[i])) return 0;
    return 1;
#endif
}

/* whether a <= b in every lane (a NaN lane is not) */
static inline int vf_all_le(vf a, vf b) {
#if VL == 16
    return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_LE_OQ) == 0xFFFF;
#elif defined(INFLIGHT_ISA_AVX2)
    return _mm256_movemask_ps(_mm256_cmp_ps((__m256)a, (__m256)b, _CMP_LE_OQ)) == 0xFF;
#else
    for (int i = 0; i < VL; i++)
        if (!(a[i] <= b[i])) return 0;
    return 1;
#endif
}

/* round to the nearest integer (ties to even) per lane */
static inline vf vf_round(vf a) {
#if VL == 16
    return (vf)_mm512_roundscale_ps((__m512)a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(INFLIGHT_ISA_AVX2)
    return (vf)_mm256_round_ps((__m256)a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(INFLIGHT_ISA_NEON)
    return (vf)vrndnq_f32((float32x4_t)a);
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = nearbyintf(a[i]);
    return r;
#endif
}

/* VL bf16 values widened to fp32 (exact) */
typedef uint16_t vh_unaligned __attribute__((vector_size(VL * 2), aligned(2), may_alias));
static inline vf vf_load_bf16(const uint16_t* p) {
    return (vf)(__builtin_convertvector(*(const vh_unaligned*)p, vi) << 16);
}

/* VL bytes zero-extended to int32 lanes (GCC lowers the generic conversion to a
 * byte-by-byte insert at -mavx2, hence the intrinsics) */
static inline vi vi_load_u8(const uint8_t* p) {
#if VL == 16
    return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
#elif defined(INFLIGHT_ISA_AVX2)
    return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
#elif defined(INFLIGHT_ISA_NEON)
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(w)))));
#else
    vi r;
    for (int i = 0; i < VL; i++) r[i] = p[i];
    return r;
#endif
}

/* VL bytes sign-extended to int32 lanes */
static inline vi vi_load_s8(const int8_t* p) {
#if VL == 16
    return (vi)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p));
#elif defined(INFLIGHT_ISA_AVX2)
    return (vi)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
#elif defined(INFLIGHT_ISA_NEON)
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vcreate_u32(w)))));
#else
    vi r;
    for (int i = 0; i < VL; i++) r[i] = p[i];
    return r;
#endif
}


/* float8 e4m3 (the KV cache's fp8: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no
 * infinities). A code sign-extended to 16 bits and shifted left by 7 has the sign in bit 15 and
 * the exponent and mantissa in a float16's places (bit 14, the top exponent bit, must be
 * cleared): the same value times 2^-8 exactly, denormals included (a float16 has 1 more exponent
 * bit), which the ISA's float16 conversion widens exactly; scalar code computes it. */
static inline float fp8_to_f32_scaled(uint8_t b) {  /* b's value times 2^-8 */
    const int e = b >> 3 & 15, m = b & 7;
    const float v = (float)(e ? (8 + m) << (e - 1) : m) * 0x1p-17f;
    return b & 0x80 ? -v : v;
}

/* VL fp8 codes widened to float32, each value times 2^-8 (exact) */
static inline vf vf_load_fp8_scaled(const uint8_t* p) {
#if VL == 16
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
    return (vf)_mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBFFF)));
#elif defined(INFLIGHT_ISA_AVX2)
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i*)p));
    return (vf)_mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16((short)0xBFFF)));
#elif defined(INFLIGHT_ISA_NEON)
    uint32_t u;
    memcpy(&u, p, sizeof u);
    const int16x4_t w = vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vcreate_u32(u))));
    const uint16x4_t h = vand_u16(vreinterpret_u16_s16(vshl_n_s16(w, 7)), vdup_n_u16(0xBFFF));
    return (vf)vcvt_f32_f16(vreinterpret_f16_u16(h));
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = fp8_to_f32_scaled(p[i]);
    return r;
#endif
}

/* the low byte of each of c's VL lanes stored at p */
static inline void vi_store_u8(uint8_t* p, vi c) {
#if VL == 16
    _mm_storeu_si128((__m128i*)p, _mm512_cvtepi32_epi8((__m512i)c));
#elif defined(INFLIGHT_ISA_AVX2)
    const __m256i lo = _mm256_shuffle_epi8((__m256i)c, _mm256_set1_epi32(0x0C080400));  /* per 128-bit half */
    const int32_t a = _mm256_extract_epi32(lo, 0), b = _mm256_extract_epi32(lo, 4);
    memcpy(p, &a, 4);
    memcpy(p + 4, &b, 4);
#else
    for (int i = 0; i < VL; i++) p[i] = (uint8_t)c[i];
#endif
}

/* VL floats within [-448, 448] as e4m3 codes (the low byte of each lane), rounded to the
 * nearest, ties to even, as torch's .to(torch.float8_e4m3fn) rounds them */
static inline vi vi_fp8_codes(vf x) {
    const vi bits = (vi)x, a = bits & 0x7FFFFFFF;
    /* from 2^-6 up: the mantissa rounded to 3 bits, the exponent rebased from 127 to 7 */
    const vi normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3);
    /* below: denormal codes, the value in units of 2^-9 rounded to an integer (8: 2^-6) */
    const vi tiny = __builtin_convertvector(vf_round((vf)a * 512.f), vi);
    const vi small = a < (121 << 23);
    return (tiny & small) | (normal & ~small) | ((bits >> 24) & 0x80);
}

#include "vec_exp.h"  /* e^x and SiLU on this layer */

#endif
