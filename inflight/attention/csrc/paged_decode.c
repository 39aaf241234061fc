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

#include "bf16_simd.h"

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
DEFINE_DECODE(paged_decode_bf16_generic, uint16_t, bf16_to_f32, f32_to_bf16)

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define CHUNK 16

/* Sixteen dot-product accumulators -> one vector of their sums, lane j = sum(a[j]):
 * a transpose-and-add tree, 45 ops instead of 16 horizontal reductions. */
static inline __m512 reduce16(__m512 a[16]) {
    __m512 b[8], c[4], e[2];
    for (int p = 0; p < 8; p++)
        b[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]), _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]));
    for (int p = 0; p < 4; p++) {
        const __m512d x = _mm512_castps_pd(b[2 * p]), y = _mm512_castps_pd(b[2 * p + 1]);
        c[p] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int p = 0; p < 2; p++)
        e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One sequence, kv heads [kh0, kh1): online softmax over chunks of CHUNK tokens,
 * every head of a chunk before the next chunk so each cached row is read while it
 * is hot. Both products use the bf16 dot-product instruction on the cached rows in
 * place: Q.K per token, and P.V over token pairs (probabilities rounded to bf16, as
 * flash attention does), with float32 accumulation. head_dim must be a multiple of 32. */
#define MAX_QH 64
static void decode_seq_avx512(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                              const int64_t* bt, int64_t len, uint16_t* out, int G, int kh0, int kh1,
                              int head_dim, int block_size, int64_t tok_stride, float scale) {
    const int nv = head_dim / 32, nf = head_dim / 16;
    const int h0 = kh0 * G, nh = (kh1 - kh0) * G;
    __m512bh qv[MAX_QH][MAX_D / 32];
    /* acc[h][2i], acc[h][2i+1]: dims 32i.. of head h, pair-interleaved (see the end) */
    __m512 acc[MAX_QH][MAX_D / 16];
    float m[MAX_QH], l[MAX_QH];
    uint32_t pp[MAX_QH][CHUNK / 2];  /* probabilities of a chunk as bf16 pairs */
    int64_t rows[CHUNK];
    for (int h = 0; h < nh; h++) {
        for (int i = 0; i < nv; i++)
            qv[h][i] = (__m512bh)_mm512_loadu_si512(q + (int64_t)(h0 + h) * head_dim + 32 * i);
        for (int i = 0; i < nf; i++) acc[h][i] = _mm512_setzero_ps();
        m[h] = -INFINITY;
        l[h] = 0.f;
    }
    const int64_t span = (int64_t)(kh1 - kh0) * head_dim * 2;  /* bytes of a row this item reads */
    for (int64_t t0 = 0; t0 < len; t0 += CHUNK) {
        const int n = (int)(len - t0 < CHUNK ? len - t0 : CHUNK);
        for (int j = 0; j < n; j++) {
            const int64_t t = t0 + j;
            rows[j] = (bt[t / block_size] * block_size + t % block_size) * tok_stride;
        }
        /* Blocks sit at random places in the pool, out of the hardware prefetcher's
         * reach: fetch the next chunk's rows while this one computes. */
        for (int64_t t = t0 + CHUNK; t < t0 + 2 * CHUNK && t < len; t++) {
            const int64_t r = (bt[t / block_size] * block_size + t % block_size) * tok_stride + (int64_t)kh0 * head_dim;
            for (int64_t b = 0; b < span; b += 64) {
                _mm_prefetch((const char*)(k_cache + r) + b, _MM_HINT_T0);
                _mm_prefetch((const char*)(v_cache + r) + b, _MM_HINT_T0);
            }
        }
        const __mmask16 mask = (__mmask16)((1u << n) - 1);
        for (int h = 0; h < nh; h++) {
            const uint16_t* kbase = k_cache + (int64_t)((h0 + h) / G) * head_dim;
            __m512 a[CHUNK];
            for (int j = 0; j < CHUNK; j++) {
                a[j] = _mm512_setzero_ps();
                if (j < n)
                    for (int i = 0; i < nv; i++)
                        a[j] = _mm512_dpbf16_ps(a[j], qv[h][i], (__m512bh)_mm512_loadu_si512(kbase + rows[j] + 32 * i));
            }
            const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), mask,
                                                _mm512_mul_ps(reduce16(a), _mm512_set1_ps(scale)));
            const float new_m = fmaxf(m[h], _mm512_reduce_max_ps(s));
            const float corr = expf(m[h] - new_m);
            const __m512 p = exp512(_mm512_sub_ps(s, _mm512_set1_ps(new_m)));
            l[h] = l[h] * corr + _mm512_reduce_add_ps(p);
            m[h] = new_m;
            _mm256_storeu_si256((__m256i*)pp[h], (__m256i)_mm512_cvtneps_pbh(p));
            const __m512 c = _mm512_set1_ps(corr);
            for (int i = 0; i < nf; i++) acc[h][i] = _mm512_mul_ps(acc[h][i], c);
        }
        for (int j = 0; j < n; j += 2) {
            for (int kh = kh0; kh < kh1; kh++) {
                const uint16_t* v0 = v_cache + rows[j] + (int64_t)kh * head_dim;
                const uint16_t* v1 = v_cache + rows[j + 1 < n ? j + 1 : j] + (int64_t)kh * head_dim;
                __m512i lo[MAX_D / 32], hi[MAX_D / 32];
                for (int i = 0; i < nv; i++) {
                    const __m512i x = _mm512_loadu_si512(v0 + 32 * i);
                    /* a lone last token pairs with zeros (its partner's p is 0 too) */
                    const __m512i y = j + 1 < n ? _mm512_loadu_si512(v1 + 32 * i) : _mm512_setzero_si512();
                    lo[i] = _mm512_unpacklo_epi16(x, y);
                    hi[i] = _mm512_unpackhi_epi16(x, y);
                }
                for (int g = 0; g < G; g++) {
                    const int h = (kh - kh0) * G + g;
                    const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)pp[h][j / 2]);
                    for (int i = 0; i < nv; i++) {
                        acc[h][2 * i] = _mm512_dpbf16_ps(acc[h][2 * i], pb, (__m512bh)lo[i]);
                        acc[h][2 * i + 1] = _mm512_dpbf16_ps(acc[h][2 * i + 1], pb, (__m512bh)hi[i]);
                    }
                }
            }
        }
    }
    /* unpacklo/hi interleave within 128-bit lanes: lane 4k+r of acc[2i] holds dim
     * 32i+8k+r, of acc[2i+1] dim 32i+8k+4+r. */
    for (int h = 0; h < nh; h++) {
        const float inv = 1.f / l[h];
        uint16_t* op = out + (int64_t)(h0 + h) * head_dim;
        for (int i = 0; i < nv; i++) {
            float lo_f[16], hi_f[16];
            _mm512_storeu_ps(lo_f, acc[h][2 * i]);
            _mm512_storeu_ps(hi_f, acc[h][2 * i + 1]);
            for (int k = 0; k < 4; k++)
                for (int r = 0; r < 4; r++) {
                    op[32 * i + 8 * k + r] = f32_to_bf16(lo_f[4 * k + r] * inv);
                    op[32 * i + 8 * k + 4 + r] = f32_to_bf16(hi_f[4 * k + r] * inv);
                }
        }
    }
}
#endif

void paged_decode_bf16(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                       int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                       int max_len) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (head_dim % 32 == 0 && num_heads <= MAX_QH && head_dim <= MAX_D) {
        const int G = num_heads / num_kv_heads;
        const int64_t tok_stride = (int64_t)num_kv_heads * head_dim;
        /* Whole sequences per work item when there are enough of them (contiguous
         * block reads); (sequence, kv head) items otherwise, so a lone long
         * sequence still spreads over the cores. */
        const int split = num_seqs < 8 ? num_kv_heads : 1;
        const int per = num_kv_heads / split;
        _Pragma("omp parallel for schedule(dynamic, 1)")
        for (int item = 0; item < num_seqs * split; item++) {
            const int s = item / split, kh0 = (item % split) * per;
            decode_seq_avx512(q + (int64_t)s * num_heads * head_dim, k_cache, v_cache,
                              block_tables + (int64_t)s * bt_stride, seq_lens[s],
                              out + (int64_t)s * num_heads * head_dim, G, kh0, kh0 + per, head_dim,
                              block_size, tok_stride, scale);
        }
        return;
    }
#endif
    paged_decode_bf16_generic(q, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs, num_heads,
                              num_kv_heads, head_dim, block_size, scale, max_len);
}

int paged_decode_limits(int* max_g, int* max_d) {
    *max_g = MAX_G;
    *max_d = MAX_D;
    return 0;
}
