/*
 * Paged decode attention for the CPU: one query token per sequence, reading K/V
 * straight from the block pool (no gather copy). Parallel over (sequence, kv head)
 * with OpenMP. Scores go to a per-thread buffer, then softmax, then the weighted
 * sum of V: K and V are each read once.
 *
 * Layouts: q, out [num_seqs, num_heads, head_dim]; caches [num_blocks, block_size,
 * num_kv_heads, head_dim]; block_tables [num_seqs, bt_stride] int64; seq_lens int64.
 * Build: gcc -O3 -march=native -fopenmp -shared -fPIC.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)x) << 16;
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t rounding = 0x7FFF + ((v.u >> 16) & 1); /* round to nearest even */
    return (uint16_t)((v.u + rounding) >> 16);
}

#define MAX_G 16
#define MAX_D 256

/* T: element type of q/out/caches; LOAD converts one element to float. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE)                                                  \
void NAME(const T* q, const T* k_cache, const T* v_cache, const int64_t* block_tables,       \
          int64_t bt_stride, const int64_t* seq_lens, T* out, int num_seqs, int num_heads,   \
          int num_kv_heads, int head_dim, int block_size, float scale, int max_len) {        \
    const int G = num_heads / num_kv_heads;                                                  \
    const int64_t tok_stride = (int64_t)num_kv_heads * head_dim;                             \
    _Pragma("omp parallel")                                                                  \
    {                                                                                        \
        float* scores = (float*)malloc(sizeof(float) * (size_t)G * (size_t)(max_len + 1));   \
        float qf[MAX_G][MAX_D];                                                              \
        float acc[MAX_G][MAX_D];                                                             \
        float kv[MAX_D];                                                                     \
        _Pragma("omp for collapse(2) schedule(dynamic, 1)")                                  \
        for (int s = 0; s < num_seqs; s++) {                                                 \
            for (int kh = 0; kh < num_kv_heads; kh++) {                                      \
                const int64_t len = seq_lens[s];                                             \
                const int64_t* bt = block_tables + (int64_t)s * bt_stride;                   \
                for (int g = 0; g < G; g++) {                                                \
                    const T* qp = q + ((int64_t)s * num_heads + kh * G + g) * head_dim;      \
                    for (int d = 0; d < head_dim; d++) qf[g][d] = LOAD(qp[d]) * scale;       \
                    memset(acc[g], 0, sizeof(float) * head_dim);                             \
                }                                                                            \
                float mx[MAX_G];                                                             \
                for (int g = 0; g < G; g++) mx[g] = -INFINITY;                               \
                for (int64_t t = 0; t < len; t++) {                                          \
                    const T* kp = k_cache + (bt[t / block_size] * block_size + t % block_size) \
                                  * tok_stride + (int64_t)kh * head_dim;                     \
                    for (int d = 0; d < head_dim; d++) kv[d] = LOAD(kp[d]);                  \
                    for (int g = 0; g < G; g++) {                                            \
                        float dot = 0.f;                                                     \
                        for (int d = 0; d < head_dim; d++) dot += qf[g][d] * kv[d];          \
                        scores[g * (max_len + 1) + t] = dot;                                 \
                        if (dot > mx[g]) mx[g] = dot;                                        \
                    }                                                                        \
                }                                                                            \
                float sum[MAX_G];                                                            \
                for (int g = 0; g < G; g++) {                                                \
                    float* sc = scores + g * (max_len + 1);                                  \
                    float acc_sum = 0.f;                                                     \
                    for (int64_t t = 0; t < len; t++) {                                      \
                        sc[t] = expf(sc[t] - mx[g]);                                         \
                        acc_sum += sc[t];                                                    \
                    }                                                                        \
                    sum[g] = acc_sum;                                                        \
                }                                                                            \
                for (int64_t t = 0; t < len; t++) {                                          \
                    const T* vp = v_cache + (bt[t / block_size] * block_size + t % block_size) \
                                  * tok_stride + (int64_t)kh * head_dim;                     \
                    for (int d = 0; d < head_dim; d++) kv[d] = LOAD(vp[d]);                  \
                    for (int g = 0; g < G; g++) {                                            \
                        const float p = scores[g * (max_len + 1) + t];                       \
                        for (int d = 0; d < head_dim; d++) acc[g][d] += p * kv[d];           \
                    }                                                                        \
                }                                                                            \
                for (int g = 0; g < G; g++) {                                                \
                    T* op = out + ((int64_t)s * num_heads + kh * G + g) * head_dim;          \
                    const float inv = 1.f / sum[g];                                          \
                    for (int d = 0; d < head_dim; d++) op[d] = STORE(acc[g][d] * inv);       \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        free(scores);                                                                        \
    }                                                                                        \
}

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
DEFINE_DECODE(paged_decode_f32, float, LOAD_F32, STORE_F32)
DEFINE_DECODE(paged_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)

int paged_decode_limits(int* max_g, int* max_d) {
    *max_g = MAX_G;
    *max_d = MAX_D;
    return 0;
}
