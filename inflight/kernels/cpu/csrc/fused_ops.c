/*
 * Fused element-wise ops of a Llama layer for bf16 on the CPU. Each replaces a
 * chain of 4-10 small torch ops (one pass over memory instead of several, and one
 * call instead of several dispatches) and rounds to bf16 where the torch reference
 * path rounds, so both paths agree to the last bit in most elements.
 * Rows are spread over the cores with OpenMP.
 */
#include <math.h>
#include <stdint.h>

#include "bf16_simd.h"

/* residual += x (when add), then out = weight * bf16(residual * rsqrt(mean(residual^2) + eps)).
 * x and out may alias. */
void add_rmsnorm_bf16(uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* out,
                      int64_t rows, int64_t dim, float eps, int add) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t* xr = x + r * dim;
        uint16_t* hr = add ? residual + r * dim : xr;
#ifdef HAVE_AVX512_BF16
        {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < dim; i += 16) {
                const __mmask16 m = tail_mask(dim - i);
                __m512 h = load_bf16x16(xr + i, m);
                if (add) {
                    h = round_bf16(_mm512_add_ps(h, load_bf16x16(hr + i, m)));
                    store_bf16x16(hr + i, h, m);
                }
                acc = _mm512_fmadd_ps(h, h, acc);
            }
            const __m512 inv = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps));
            uint16_t* orow = out + r * dim;
            for (int64_t i = 0; i < dim; i += 16) {
                const __mmask16 m = tail_mask(dim - i);
                store_bf16x16(orow + i, _mm512_mul_ps(load_bf16x16(weight + i, m), round_bf16(_mm512_mul_ps(load_bf16x16(hr + i, m), inv))), m);
            }
            continue;
        }
#endif
        float ss = 0.f;
        for (int64_t i = 0; i < dim; i++) {
            float h = add ? bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) + bf16_to_f32(hr[i]))) : bf16_to_f32(xr[i]);
            if (add) hr[i] = f32_to_bf16(h);
            ss += h * h;
        }
        const float inv = 1.f / sqrtf(ss / (float)dim + eps);
        uint16_t* orow = out + r * dim;
        for (int64_t i = 0; i < dim; i++) orow[i] = f32_to_bf16(bf16_to_f32(weight[i]) * bf16_to_f32(f32_to_bf16(bf16_to_f32(hr[i]) * inv)));
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
            int i = 0;
#ifdef HAVE_AVX512_BF16
            for (; i + 16 <= half; i += 16) {
                const __m512 a = load_bf16x16(x + i, 0xFFFF), b = load_bf16x16(x + i + half, 0xFFFF);
                const __m512 lo = _mm512_add_ps(round_bf16(_mm512_mul_ps(a, load_bf16x16(c + i, 0xFFFF))),
                                                round_bf16(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), b),
                                                                         load_bf16x16(s + i, 0xFFFF))));
                const __m512 hi = _mm512_add_ps(round_bf16(_mm512_mul_ps(b, load_bf16x16(c + i + half, 0xFFFF))),
                                                round_bf16(_mm512_mul_ps(a, load_bf16x16(s + i + half, 0xFFFF))));
                store_bf16x16(x + i, lo, 0xFFFF);
                store_bf16x16(x + i + half, hi, 0xFFFF);
            }
#endif
            for (; i < half; i++) {
                const float a = bf16_to_f32(x[i]), b = bf16_to_f32(x[i + half]);  /* rotate_half(x) = (-x2, x1) */
                x[i] = f32_to_bf16(bf16_to_f32(f32_to_bf16(a * bf16_to_f32(c[i]))) + bf16_to_f32(f32_to_bf16(-b * bf16_to_f32(s[i]))));
                x[i + half] = f32_to_bf16(bf16_to_f32(f32_to_bf16(b * bf16_to_f32(c[i + half]))) + bf16_to_f32(f32_to_bf16(a * bf16_to_f32(s[i + half]))));
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
#ifdef HAVE_AVX512_BF16
        for (int64_t i = 0; i < inter; i += 16) {
            const __mmask16 m = tail_mask(inter - i);
            const __m512 x = load_bf16x16(g + i, m);
            const __m512 sx = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
            store_bf16x16(o + i, _mm512_mul_ps(round_bf16(sx), load_bf16x16(u + i, m)), m);
        }
        continue;
#endif
        for (int64_t i = 0; i < inter; i++) {
            const float x = bf16_to_f32(g[i]);
            o[i] = f32_to_bf16(bf16_to_f32(f32_to_bf16(x / (1.f + expf(-x)))) * bf16_to_f32(u[i]));
        }
    }
}
