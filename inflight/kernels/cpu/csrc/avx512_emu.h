/* AVX-512 (F/BW/VL/DQ and BF16) on a CPU that has only AVX2: force-included (-include)
 * into every source of a kernel test driver built for INFLIGHT_ISA_AVX512{,_BF16} with the
 * avx2 level's flags, so the AVX-512 code paths run here, slowly but with the same lane
 * semantics. The intrinsics come from SIMDe (Debian: libsimde-dev) under their Intel names;
 * the few SIMDe 0.7 lacks (or has under its own name only) are below, written from Intel's pseudo-code.
 *
 * NOTE: only the tests use this; the kernels themselves never include it. */
#ifndef INFLIGHT_AVX512_EMU_H
#define INFLIGHT_AVX512_EMU_H
#if defined(__AVX512F__)
#error "avx512_emu.h is for CPUs without AVX-512: build natively instead"
#endif
/* the native header first: its declarations must not meet the aliases below */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

static inline simde__m512 emu_mm512_maskz_loadu_ps(simde__mmask16 k, const void* p) {
    float v[16] = {0};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy(&v[i], (const float*)p + i, 4);  /* masked lanes are not read */
    simde__m512 r;
    memcpy(&r, v, 64);
    return r;
}

static inline simde__m256i emu_mm256_maskz_loadu_epi16(simde__mmask16 k, const void* p) {
    uint16_t v[16] = {0};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy(&v[i], (const uint16_t*)p + i, 2);
    simde__m256i r;
    memcpy(&r, v, 32);
    return r;
}

static inline void emu_mm256_mask_storeu_epi16(void* p, simde__mmask16 k, simde__m256i a) {
    uint16_t v[16];
    memcpy(v, &a, 32);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy((uint16_t*)p + i, &v[i], 2);
}

static inline simde__m512i emu_mm512_cvtepu16_epi32(simde__m256i a) {
    uint16_t v[16];
    uint32_t w[16];
    memcpy(v, &a, 32);
    for (int i = 0; i < 16; i++) w[i] = v[i];
    simde__m512i r;
    memcpy(&r, w, 64);
    return r;
}

static inline simde__m512i emu_mm512_cvtepu8_epi32(simde__m128i a) {
    uint8_t v[16];
    uint32_t w[16];
    memcpy(v, &a, 16);
    for (int i = 0; i < 16; i++) w[i] = v[i];
    simde__m512i r;
    memcpy(&r, w, 64);
    return r;
}

static inline simde__m512i emu_mm512_cvtepi8_epi32(simde__m128i a) {
    int8_t v[16];
    int32_t w[16];
    memcpy(v, &a, 16);
    for (int i = 0; i < 16; i++) w[i] = v[i];
    simde__m512i r;
    memcpy(&r, w, 64);
    return r;
}

/* VCVTNEPS2BF16: round to nearest even; denormals flushed to signed zero; NaN quieted */
static inline uint16_t emu_bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline simde__m256bh emu_mm512_cvtneps_pbh(simde__m512 a) {
    float f[16];
    uint16_t h[16];
    memcpy(f, &a, 64);
    for (int i = 0; i < 16; i++) h[i] = emu_bf16_rne(f[i]);
    simde__m256bh r;
    memcpy(&r, h, 32);
    return r;
}

/* the low byte of each of 16 32-bit lanes (vpmovdb) */
static inline simde__m128i emu_mm512_cvtepi32_epi8(simde__m512i a) {
    int32_t v[16];
    uint8_t b[16];
    memcpy(v, &a, 64);
    for (int i = 0; i < 16; i++) b[i] = (uint8_t)v[i];
    simde__m128i r;
    memcpy(&r, b, 16);
    return r;
}

/* 16 float16 values widened exactly (F16C on each half) */
static inline simde__m512 emu_mm512_cvtph_ps(simde__m256i a) {
    __m256i h;
    memcpy(&h, &a, 32);
    __m256 f[2] = {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
    simde__m512 r;
    memcpy(&r, f, 64);
    return r;
}

/* the reductions in the order GCC's immintrin.h sums them: halves, then quarters, ... */
static inline float emu_mm512_reduce_add_ps(simde__m512 a) {
    float v[16];
    memcpy(v, &a, 64);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) v[i] += v[i + w];
    return v[0];
}

static inline float emu_mm512_reduce_max_ps(simde__m512 a) {
    float v[16];
    memcpy(v, &a, 64);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) v[i] = v[i] > v[i + w] ? v[i] : v[i + w];
    return v[0];
}

#undef _mm512_maskz_loadu_ps
#undef _mm512_shuffle_f32x4
#undef _mm256_maskz_loadu_epi16
#undef _mm256_mask_storeu_epi16
#undef _mm512_cvtepu16_epi32
#undef _mm512_cvtneps_pbh
#undef _mm512_reduce_add_ps
#undef _mm512_reduce_max_ps
#define _mm512_maskz_loadu_ps emu_mm512_maskz_loadu_ps
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4(a, b, imm8)
#define _mm256_maskz_loadu_epi16 emu_mm256_maskz_loadu_epi16
#define _mm256_mask_storeu_epi16 emu_mm256_mask_storeu_epi16
#define _mm512_cvtepu16_epi32 emu_mm512_cvtepu16_epi32
#define _mm512_cvtepu8_epi32 emu_mm512_cvtepu8_epi32
#define _mm512_cvtepi8_epi32 emu_mm512_cvtepi8_epi32
#define _mm512_cvtneps_pbh emu_mm512_cvtneps_pbh
#define _mm512_reduce_add_ps emu_mm512_reduce_add_ps
#define _mm512_cvtph_ps emu_mm512_cvtph_ps
#define _mm512_cvtepi32_epi8 emu_mm512_cvtepi32_epi8
#define _mm512_reduce_max_ps emu_mm512_reduce_max_ps
#endif
