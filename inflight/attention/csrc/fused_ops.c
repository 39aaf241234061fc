/*
 * Fused element-wise ops of a Llama layer for bf16 on the CPU. Each replaces a
 * chain of 4-10 small torch ops (one pass over memory instead of several, and one
 * call instead of several dispatches) and rounds to bf16 where the torch reference
 * path rounds, so both paths agree to the last bit in most elements.
 * Rows are spread over the cores with OpenMP.
 */
#include <math.h>
#include <stdint.h>

static inline float bf(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)x) << 16;
    return v.f;
}

static inline uint16_t to_bf(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((v.u + 0x7FFF + ((v.u >> 16) & 1)) >> 16);
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define VEC 1

static inline __mmask16 tail(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

static inline __m512 load16(const uint16_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

static inline void store16(uint16_t* p, __m512 x, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
}

/* bf16(x) as float: round to nearest even, as a store and reload would */
static inline __m512 round_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)), 16));
}

static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-100.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}
#endif

/* residual += x (when add), then out = weight * bf16(residual * rsqrt(mean(residual^2) + eps)).
 * x and out may alias. */
void add_rmsnorm_bf16(uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* out,
                      int64_t rows, int64_t dim, float eps, int add) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t* xr = x + r * dim;
        uint16_t* hr = add ? residual + r * dim : xr;
#ifdef VEC
        {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < dim; i += 16) {
                const __mmask16 m = tail(dim - i);
                __m512 h = load16(xr + i, m);
                if (add) {
                    h = round_bf16(_mm512_add_ps(h, load16(hr + i, m)));
                    store16(hr + i, h, m);
                }
                acc = _mm512_fmadd_ps(h, h, acc);
            }
            const __m512 inv = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps));
            uint16_t* orow = out + r * dim;
            for (int64_t i = 0; i < dim; i += 16) {
                const __mmask16 m = tail(dim - i);
                store16(orow + i, _mm512_mul_ps(load16(weight + i, m), round_bf16(_mm512_mul_ps(load16(hr + i, m), inv))), m);
            }
            continue;
        }
#endif
        float ss = 0.f;
        for (int64_t i = 0; i < dim; i++) {
            float h = add ? bf(to_bf(bf(xr[i]) + bf(hr[i]))) : bf(xr[i]);
            if (add) hr[i] = to_bf(h);
            ss += h * h;
        }
        const float inv = 1.f / sqrtf(ss / (float)dim + eps);
        uint16_t* orow = out + r * dim;
        for (int64_t i = 0; i < dim; i++) orow[i] = to_bf(bf(weight[i]) * bf(to_bf(bf(hr[i]) * inv)));
    }
}

/* Rotate-half RoPE on q and k in place: rows of the fused qkv output (row stride
 * `stride` elements), each token's cos/sin rows already gathered and rounded to
 * bf16 [rows, d]. Rounds where torch does: x*cos, rotate_half(x)*sin, their sum. */
void rope_bf16(uint16_t* qkv, int64_t rows, int64_t stride, int nh, int nkv, int d,
               const uint16_t* cos_rows, const uint16_t* sin_rows) {
    const int half = d / 2;
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t* row = qkv + r * stride;
        const uint16_t* c = cos_rows + r * d;
        const uint16_t* s = sin_rows + r * d;
        for (int h = 0; h < nh + nkv; h++) {
            uint16_t* x = row + (int64_t)h * d;
            for (int i = 0; i < half; i++) {
                const float a = bf(x[i]), b = bf(x[i + half]);  /* rotate_half(x) = (-x2, x1) */
                x[i] = to_bf(bf(to_bf(a * bf(c[i]))) + bf(to_bf(-b * bf(s[i]))));
                x[i + half] = to_bf(bf(to_bf(b * bf(c[i + half]))) + bf(to_bf(a * bf(s[i + half]))));
            }
        }
    }
}

/* out = bf16(silu(gate)) * up, gate_up rows = [gate | up] of `inter` each. */
void silu_mul_bf16(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t* g = gate_up + r * 2 * inter;
        const uint16_t* u = g + inter;
        uint16_t* o = out + r * inter;
#ifdef VEC
        for (int64_t i = 0; i < inter; i += 16) {
            const __mmask16 m = tail(inter - i);
            const __m512 x = load16(g + i, m);
            const __m512 sx = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
            store16(o + i, _mm512_mul_ps(round_bf16(sx), load16(u + i, m)), m);
        }
        continue;
#endif
        for (int64_t i = 0; i < inter; i++) {
            const float x = bf(g[i]);
            o[i] = to_bf(bf(to_bf(x / (1.f + expf(-x)))) * bf(u[i]));
        }
    }
}
