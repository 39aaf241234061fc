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

/* The row's next values as the norms read them: x, or with add bf16(x + h) written back into
 * h (the residual). Vector (16 lanes under mask m) and scalar forms. */
#ifdef HAVE_AVX512_BF16
static inline __m512 add_residual16(const uint16_t* x, uint16_t* h, __mmask16 m, int add) {
    __m512 v = load_bf16x16(x, m);
    if (add) {
        v = round_bf16(_mm512_add_ps(v, load_bf16x16(h, m)));
        store_bf16x16(h, v, m);
    }
    return v;
}
#endif

static inline float add_residual1(const uint16_t* x, uint16_t* h, int add) {
    if (!add) return bf16_to_f32(*x);
    *h = f32_to_bf16(bf16_to_f32(*x) + bf16_to_f32(*h));
    return bf16_to_f32(*h);
}

/* One row of add_rmsnorm_bf16 (hr: the residual row, or xr itself without add). Not inlined:
 * add_rmsnorm_bf16 and rmsnorm_heads_bf16 run this one body, so a head normed by either is
 * bit-identical (-fassociative-math would let two inlined copies sum differently). */
static __attribute__((noinline)) void rmsnorm_row_bf16(uint16_t* xr, uint16_t* hr, const uint16_t* weight,
                                                       uint16_t* orow, int64_t dim, float eps, int add) {
#ifdef HAVE_AVX512_BF16
    {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < dim; i += 16) {
            const __m512 h = add_residual16(xr + i, hr + i, tail_mask(dim - i), add);
            acc = _mm512_fmadd_ps(h, h, acc);
        }
        const __m512 inv = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps));
        for (int64_t i = 0; i < dim; i += 16) {
            const __mmask16 m = tail_mask(dim - i);
            store_bf16x16(orow + i, _mm512_mul_ps(load_bf16x16(weight + i, m), round_bf16(_mm512_mul_ps(load_bf16x16(hr + i, m), inv))), m);
        }
        return;
    }
#endif
    float ss = 0.f;
    for (int64_t i = 0; i < dim; i++) {
        const float h = add_residual1(xr + i, hr + i, add);
        ss += h * h;
    }
    const float inv = 1.f / sqrtf(ss / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++) orow[i] = f32_to_bf16(bf16_to_f32(weight[i]) * bf16_to_f32(f32_to_bf16(bf16_to_f32(hr[i]) * inv)));
}

/* residual += x (when add), then out = weight * bf16(residual * rsqrt(mean(residual^2) + eps)).
 * x and out may alias. */
void add_rmsnorm_bf16(uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* out,
                      int64_t rows, int64_t dim, float eps, int add) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        rmsnorm_row_bf16(x + r * dim, add ? residual + r * dim : x + r * dim, weight, out + r * dim, dim, eps, add);
}

/* Per-head RMSNorm in place on fused qkv rows (row stride `stride` elements), before RoPE
 * (Qwen3): each of the nh q heads of d with q_w [d], each of the nkv k heads with k_w [d];
 * v untouched. Each head is exactly add_rmsnorm_bf16 (add=0) on a row of d. */
void rmsnorm_heads_bf16(uint16_t* qkv, int64_t rows, int64_t stride, int nh, int nkv, int d,
                        const uint16_t* q_w, const uint16_t* k_w, float eps) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h < nh + nkv; h++) {
            uint16_t* x = qkv + r * stride + (int64_t)h * d;
            rmsnorm_row_bf16(x, x, h < nh ? q_w : k_w, x, d, eps, 0);
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

/* One row of add_layernorm_bf16 (hr: the residual row, or xr itself without add). */
static void layernorm_row_bf16(const uint16_t* xr, uint16_t* hr, const uint16_t* weight, const uint16_t* bias,
                               uint16_t* orow, int64_t dim, float eps, int add) {
#ifdef HAVE_AVX512_BF16
    {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < dim; i += 16)
            acc = _mm512_add_ps(acc, add_residual16(xr + i, hr + i, tail_mask(dim - i), add));
        const __m512 mv = _mm512_set1_ps(_mm512_reduce_add_ps(acc) / (float)dim);
        acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < dim; i += 16) {
            const __mmask16 m = tail_mask(dim - i);
            const __m512 d = _mm512_maskz_sub_ps(m, load_bf16x16(hr + i, m), mv);
            acc = _mm512_fmadd_ps(d, d, acc);
        }
        const __m512 rs = _mm512_set1_ps(1.f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps));
        for (int64_t i = 0; i < dim; i += 16) {
            const __mmask16 m = tail_mask(dim - i);
            const __m512 y = _mm512_mul_ps(_mm512_sub_ps(load_bf16x16(hr + i, m), mv), rs);
            const __m512 w = load_bf16x16(weight + i, m), b = load_bf16x16(bias + i, m);
            store_bf16x16(orow + i, _mm512_fmadd_ps(y, w, b), m);
        }
        return;
    }
#endif
    float sum = 0.f, ss = 0.f;
    for (int64_t i = 0; i < dim; i++) sum += add_residual1(xr + i, hr + i, add);
    const float mean = sum / (float)dim;
    for (int64_t i = 0; i < dim; i++) ss += (bf16_to_f32(hr[i]) - mean) * (bf16_to_f32(hr[i]) - mean);
    const float rs = 1.f / sqrtf(ss / (float)dim + eps);
    for (int64_t i = 0; i < dim; i++)
        orow[i] = f32_to_bf16((bf16_to_f32(hr[i]) - mean) * rs * bf16_to_f32(weight[i]) + bf16_to_f32(bias[i]));
}

/* residual += x (rounded to bf16, when add), then out = bf16((residual - mean) * rstd * weight
 * + bias) with mean and variance over the row in float32: post-norm LayerNorm (BERT's). */
void add_layernorm_bf16(const uint16_t* x, uint16_t* residual, const uint16_t* weight, const uint16_t* bias,
                        uint16_t* out, int64_t rows, int64_t dim, float eps, int add) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        layernorm_row_bf16(x + r * dim, add ? residual + r * dim : (uint16_t*)x + r * dim, weight, bias,
                           out + r * dim, dim, eps, add);
}

/* ---- float32: the same ops written once against vec.h (every ISA level) ----
 * No rounding between steps: they match torch's float32 ops to float rounding
 * (the sum of squares is summed in another order, the exp is vec.h's). */
#include "vec.h"

/* plain dereferences of the under-aligned vf type: vec.h's memcpy-based vf_load went
 * through the stack under GCC 12's generic tuning (see attn_f32.h) */
#define FV_LD(p) (*(const vf*)(const void*)(p))
#define FV_ST(p, v) (*(vf*)(void*)(p) = (v))

/* One row of add_rmsnorm_f32 (hr: the residual row, or xr itself without add). Not inlined:
 * add_rmsnorm_f32 and rmsnorm_heads_f32 run this one body, so a head normed by either is
 * bit-identical (-fassociative-math would let two inlined copies sum differently). */
static __attribute__((noinline)) void rmsnorm_row_f32(const float* xr, float* hr, const float* weight, float* orow,
                                                      int64_t dim, float eps, int add) {
    vf acc0 = vf_zero(), acc1 = vf_zero();
    int64_t i = 0;
    for (; i + 2 * VL <= dim; i += 2 * VL) {
        vf h0 = FV_LD(xr + i), h1 = FV_LD(xr + i + VL);
        if (add) {
            h0 = h0 + FV_LD(hr + i);
            h1 = h1 + FV_LD(hr + i + VL);
            FV_ST(hr + i, h0);
            FV_ST(hr + i + VL, h1);
        }
        acc0 = vf_fma(h0, h0, acc0);
        acc1 = vf_fma(h1, h1, acc1);
    }
    for (; i < dim; i += VL) {
        vf h = vf_load_n(xr + i, dim - i);
        if (add) {
            h = h + vf_load_n(hr + i, dim - i);
            vf_store_n(hr + i, h, dim - i);
        }
        acc0 = vf_fma(h, h, acc0);
    }
    const vf inv = vf_set1(1.f / sqrtf(vf_reduce_add(acc0 + acc1) / (float)dim + eps));
    for (i = 0; i + VL <= dim; i += VL)  /* weight * (h * inv), in torch's order */
        FV_ST(orow + i, FV_LD(weight + i) * (FV_LD(hr + i) * inv));
    if (i < dim) vf_store_n(orow + i, vf_load_n(weight + i, dim - i) * (vf_load_n(hr + i, dim - i) * inv), dim - i);
}

/* residual += x (when add), then out = weight * (residual * rsqrt(mean(residual^2) + eps)).
 * Without add the norm is of x itself and residual is not touched. x and out may alias. */
void add_rmsnorm_f32(float* x, float* residual, const float* weight, float* out, int64_t rows, int64_t dim,
                     float eps, int add) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        rmsnorm_row_f32(x + r * dim, add ? residual + r * dim : x + r * dim, weight, out + r * dim, dim, eps, add);
}

/* Per-head RMSNorm in place on fused qkv rows (row stride `stride` floats), before RoPE
 * (Qwen3): each of the nh q heads of d with q_w [d], each of the nkv k heads with k_w [d];
 * v untouched. Each head is exactly add_rmsnorm_f32 (add=0) on a row of d. */
void rmsnorm_heads_f32(float* qkv, int64_t rows, int64_t stride, int nh, int nkv, int d, const float* q_w,
                       const float* k_w, float eps) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h < nh + nkv; h++) {
            float* x = qkv + r * stride + (int64_t)h * d;
            rmsnorm_row_f32(x, x, h < nh ? q_w : k_w, x, d, eps, 0);
        }
}

/* Rotate-half RoPE on the q and k heads of fused qkv rows in place (row stride
 * `stride` floats; nh q heads then nkv k heads of d), cos/sin rows [rows, d]:
 * x1' = x1 cos1 - x2 sin1, x2' = x2 cos2 + x1 sin2. */
void rope_f32(float* qkv, int64_t rows, int64_t stride, int nh, int nkv, int d, const float* cos_rows,
              const float* sin_rows) {
    const int half = d / 2;
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        float* row = qkv + r * stride;
        const float* c = cos_rows + r * d;
        const float* s = sin_rows + r * d;
        for (int h = 0; h < nh + nkv; h++) {
            float* x = row + (int64_t)h * d;
            int i = 0;
            for (; i + VL <= half; i += VL) {
                const vf a = FV_LD(x + i), b = FV_LD(x + i + half);
                const vf lo = a * FV_LD(c + i) - b * FV_LD(s + i);
                const vf hi = b * FV_LD(c + i + half) + a * FV_LD(s + i + half);
                FV_ST(x + i, lo);
                FV_ST(x + i + half, hi);
            }
            for (; i < half; i += VL) {
                const int n = half - i;
                const vf a = vf_load_n(x + i, n), b = vf_load_n(x + i + half, n);
                const vf lo = a * vf_load_n(c + i, n) - b * vf_load_n(s + i, n);
                const vf hi = b * vf_load_n(c + i + half, n) + a * vf_load_n(s + i + half, n);
                vf_store_n(x + i, lo, n);
                vf_store_n(x + i + half, hi, n);
            }
        }
    }
}

/* out = silu(gate) * up, gate_up rows = [gate | up] of `inter` each. */
void silu_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t inter) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float* g = gate_up + r * 2 * inter;
        const float* u = g + inter;
        float* o = out + r * inter;
        int64_t i = 0;
        for (; i + VL <= inter; i += VL) FV_ST(o + i, vf_silu(FV_LD(g + i)) * FV_LD(u + i));
        if (i < inter) vf_store_n(o + i, vf_silu(vf_load_n(g + i, inter - i)) * vf_load_n(u + i, inter - i), inter - i);
    }
}
