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

/* residual += x (when add), then out = weight * bf16(residual * rsqrt(mean(residual^2) + eps)).
 * x and out may alias. */
void add_rmsnorm_bf16(uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* out,
                      int64_t rows, int64_t dim, float eps, int add) {
    #pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t* xr = x + r * dim;
        uint16_t* hr = add ? residual + r * dim : xr;
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
        for (int64_t i = 0; i < inter; i++) {
            const float x = bf(g[i]);
            o[i] = to_bf(bf(to_bf(x / (1.f + expf(-x)))) * bf(u[i]));
        }
    }
}
