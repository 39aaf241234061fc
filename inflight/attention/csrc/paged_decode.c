/*
 * Paged decode attention for the CPU: one query token per sequence, reading K/V
 * straight from the block pool (no gather copy). Parallel over (sequence, kv head)
 * with OpenMP. Scores go to a per-thread buffer, then softmax, then the weighted
 * sum of V: K and V are each read once.
 *
 * Layouts: q [num_seqs, num_heads, head_dim] with rows q_stride elements apart (a view
 * into the fused qkv output), out the same but contiguous; caches [num_blocks, block_size,
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
void NAME(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, const int64_t* block_tables,       \
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
                    const T* qp = q + (int64_t)s * q_stride + (int64_t)(kh * G + g) * head_dim; \
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
/* K and V rows are prefetched this many tokens ahead: blocks lie at random places
 * in the pool, where the hardware prefetcher loses the stream (8-10% faster on
 * contexts in DRAM; 16 tokens ahead gained nothing, 128 less than 32-64) */
#define AHEAD 32

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

/* Q.K of one query head against CHUNK cached rows, unscaled: lane j = q . k[rows[j]].
 * K rows are read in place; the sixteen dot products are summed by reduce16. */
static inline __attribute__((always_inline)) __m512 qk_chunk(const int nv, const __m512bh* qv,
                                                           const uint16_t* kbase, const int64_t* rows) {
    __m512 a[CHUNK];
    for (int j = 0; j < CHUNK; j++) {
        a[j] = _mm512_setzero_ps();
        for (int i = 0; i < nv; i++)
            a[j] = _mm512_dpbf16_ps(a[j], qv[i], (__m512bh)_mm512_loadu_si512(kbase + rows[j] + 32 * i));
    }
    return reduce16(a);
}

/* out[g] = sum_t p[g][t] v[t] for GB query heads sharing one kv head, over token
 * pairs: the bf16 dot-product instruction multiplies a pair of probabilities by
 * a pair of V rows interleaved (unpacklo/hi), accumulating in float32. */
static inline __attribute__((always_inline)) void pv_group(const int nv, const int GB, const uint16_t* vbase,
                                                         const int64_t* rows, int64_t len,
                                                         const uint16_t* const* p, __m512* acc) {
    for (int x = 0; x < GB * 2 * nv; x++) acc[x] = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 2) {
        const int pair = t + 1 < len;
        if (t + AHEAD + 1 < len)
            for (int i = 0; i < nv; i++) {
                _mm_prefetch((const char*)(vbase + rows[t + AHEAD] + 32 * i), _MM_HINT_T0);
                _mm_prefetch((const char*)(vbase + rows[t + AHEAD + 1] + 32 * i), _MM_HINT_T0);
            }
        __m512i lo[MAX_D / 32], hi[MAX_D / 32];
        for (int i = 0; i < nv; i++) {
            const __m512i x = _mm512_loadu_si512(vbase + rows[t] + 32 * i);
            const __m512i y = pair ? _mm512_loadu_si512(vbase + rows[t + 1] + 32 * i) : _mm512_setzero_si512();
            lo[i] = _mm512_unpacklo_epi16(x, y);
            hi[i] = _mm512_unpackhi_epi16(x, y);
        }
        for (int g = 0; g < GB; g++) {
            /* p rows are padded with zeros, so the pair load never mixes in garbage */
            int32_t pair_p;
            memcpy(&pair_p, p[g] + t, sizeof pair_p);
            const __m512bh pb = (__m512bh)_mm512_set1_epi32(pair_p);
            for (int i = 0; i < nv; i++) {
                acc[(g * nv + i) * 2] = _mm512_dpbf16_ps(acc[(g * nv + i) * 2], pb, (__m512bh)lo[i]);
                acc[(g * nv + i) * 2 + 1] = _mm512_dpbf16_ps(acc[(g * nv + i) * 2 + 1], pb, (__m512bh)hi[i]);
            }
        }
    }
}

/* unpacklo/hi interleave within 128-bit lanes: lane 4k+r of the lo accumulator of
 * dims 32i.. holds dim 32i+8k+r, of the hi one dim 32i+8k+4+r; two lane permutes
 * put the dims back in order. */
static inline void store_head(const __m512* acc, int nv, float inv, uint16_t* op) {
    const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i second = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int i = 0; i < nv; i++) {
        const __m512 a = _mm512_permutex2var_ps(acc[2 * i], first, acc[2 * i + 1]);
        const __m512 b = _mm512_permutex2var_ps(acc[2 * i], second, acc[2 * i + 1]);
        store_bf16x16(op + 32 * i, _mm512_mul_ps(a, vinv), 0xFFFF);
        store_bf16x16(op + 32 * i + 16, _mm512_mul_ps(b, vinv), 0xFFFF);
    }
}

#define PV_REGS 16  /* accumulators a P.V group keeps in registers */

/* One sequence, kv heads [kh0, kh1), in three passes per kv head: the scores of
 * its G query heads into a per-thread buffer, then exp (one max per head, no
 * online rescaling) to bf16 probabilities, then P.V. Each kv head's K and V rows
 * are distinct cache lines, so the passes read each cached byte once from DRAM. */
static inline __attribute__((always_inline)) void decode_seq_nv(
        const int nv, const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* bt,
        int64_t len, uint16_t* out, int G, int kh0, int kh1, int block_size, int64_t tok_stride,
        float scale, float* sbuf, int64_t* rows) {
    const int head_dim = 32 * nv;
    const int64_t lp = (len + 31) & ~(int64_t)31;  /* padded score row */
    for (int64_t b = 0, t = 0; t < len; b++)  /* block by block: no division per token */
        for (int64_t j = 0, r = bt[b] * block_size * tok_stride; j < block_size && t < len; j++, t++)
            rows[t] = r + j * tok_stride;
    for (int64_t t = len; t < lp; t++) rows[t] = 0;
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int kh = kh0; kh < kh1; kh++) {
        const uint16_t* kbase = k_cache + (int64_t)kh * head_dim;
        const uint16_t* vbase = v_cache + (int64_t)kh * head_dim;
        float l[MAX_G];
        for (int g = 0; g < G; g++) {
            const uint16_t* qp = q + (int64_t)(kh * G + g) * head_dim;
            __m512bh qv[MAX_D / 32];
            for (int i = 0; i < nv; i++) qv[i] = (__m512bh)_mm512_loadu_si512(qp + 32 * i);
            float* sc = sbuf + (int64_t)g * lp;
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (int64_t t0 = 0; t0 < len; t0 += CHUNK) {
                if (g == 0)  /* the first head's pass reads K from DRAM; later ones hit L2 */
                    for (int64_t t = t0 + AHEAD; t < t0 + AHEAD + CHUNK && t < len; t++)
                        for (int i = 0; i < nv; i++) _mm_prefetch((const char*)(kbase + rows[t] + 32 * i), _MM_HINT_T0);
                const __mmask16 m = tail_mask(len - t0);
                const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), m,
                                                    _mm512_mul_ps(qk_chunk(nv, qv, kbase, rows + t0), vscale));
                vmax = _mm512_max_ps(vmax, s);
                _mm512_storeu_ps(sc + t0, s);
            }
            /* probabilities as bf16 (rounded, as flash attention does), written over
             * the front of the same row; zero up to the padded length */
            const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
            __m512 sum = _mm512_setzero_ps();
            uint16_t* pb = (uint16_t*)sc;
            for (int64_t t0 = 0; t0 < lp; t0 += 16) {
                const __mmask16 m = t0 < len ? tail_mask(len - t0) : 0;
                const __m512 p = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + t0), mx)));
                sum = _mm512_add_ps(sum, p);
                store_bf16x16(pb + t0, p, 0xFFFF);
            }
            l[g] = _mm512_reduce_add_ps(sum);
        }
        const int gb = PV_REGS / (2 * nv) > 0 ? PV_REGS / (2 * nv) : 1;
        for (int g0 = 0; g0 < G; g0 += gb) {
            const uint16_t* p[MAX_G];
            const int n = G - g0 < gb ? G - g0 : gb;
            for (int g = 0; g < n; g++) p[g] = (const uint16_t*)(sbuf + (int64_t)(g0 + g) * lp);
            __m512 acc[PV_REGS];
            /* constant group sizes keep the accumulators in registers */
            if (n == 4) pv_group(nv, 4, vbase, rows, len, p, acc);
            else if (n == 3) pv_group(nv, 3, vbase, rows, len, p, acc);
            else if (n == 2) pv_group(nv, 2, vbase, rows, len, p, acc);
            else for (int g = 0; g < n; g++) pv_group(nv, 1, vbase, rows, len, p + g, acc + g * 2 * nv);
            for (int g = 0; g < n; g++)
                store_head(acc + g * 2 * nv, nv, 1.f / l[g0 + g], out + (int64_t)(kh * G + g0 + g) * head_dim);
        }
    }
}

static void decode_seq_avx512(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                              const int64_t* bt, int64_t len, uint16_t* out, int G, int kh0, int kh1,
                              int head_dim, int block_size, int64_t tok_stride, float scale, float* sbuf,
                              int64_t* rows) {
    /* head_dim as a constant lets the compiler unroll and keep accumulators in registers */
    const int nv = head_dim / 32;
    if (nv == 2)
        decode_seq_nv(2, q, k_cache, v_cache, bt, len, out, G, kh0, kh1, block_size, tok_stride, scale, sbuf, rows);
    else if (nv == 4)
        decode_seq_nv(4, q, k_cache, v_cache, bt, len, out, G, kh0, kh1, block_size, tok_stride, scale, sbuf, rows);
    else
        decode_seq_nv(nv, q, k_cache, v_cache, bt, len, out, G, kh0, kh1, block_size, tok_stride, scale, sbuf, rows);
}
#endif

void paged_decode_bf16(const uint16_t* q, int64_t q_stride, const uint16_t* k_cache, const uint16_t* v_cache,
                       const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, uint16_t* out,
                       int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                       int max_len) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (head_dim % 32 == 0 && num_heads / num_kv_heads <= MAX_G && head_dim <= MAX_D) {
        const int G = num_heads / num_kv_heads;
        const int64_t tok_stride = (int64_t)num_kv_heads * head_dim;
        /* Whole sequences per work item when there are enough of them (contiguous
         * block reads); (sequence, kv head) items otherwise, so a lone long
         * sequence still spreads over the cores. */
        const int split = num_seqs < 8 ? num_kv_heads : 1;
        const int per = num_kv_heads / split;
        int64_t longest = 0;  /* sizes the per-thread buffers (max_len is only a hint) */
        for (int s = 0; s < num_seqs; s++) longest = seq_lens[s] > longest ? seq_lens[s] : longest;
        const int64_t lp = (longest + 31) & ~(int64_t)31;
        _Pragma("omp parallel")
        {
        /* per thread: G score rows and the sequence's cache row offsets */
        float* sbuf = (float*)malloc(sizeof(float) * (size_t)G * (size_t)lp);
        int64_t* rows = (int64_t*)malloc(sizeof(int64_t) * (size_t)lp);
        _Pragma("omp for schedule(dynamic, 1)")
        for (int item = 0; item < num_seqs * split; item++) {
            const int s = item / split, kh0 = (item % split) * per;
            decode_seq_avx512(q + (int64_t)s * q_stride, k_cache, v_cache,
                              block_tables + (int64_t)s * bt_stride, seq_lens[s],
                              out + (int64_t)s * num_heads * head_dim, G, kh0, kh0 + per, head_dim,
                              block_size, tok_stride, scale, sbuf, rows);
        }
        free(sbuf);
        free(rows);
        }  /* omp parallel */
        return;
    }
#endif
    paged_decode_bf16_generic(q, q_stride, k_cache, v_cache, block_tables, bt_stride, seq_lens, out, num_seqs, num_heads,
                              num_kv_heads, head_dim, block_size, scale, max_len);
}

int paged_decode_limits(int* max_g, int* max_d) {
    *max_g = MAX_G;
    *max_d = MAX_D;
    return 0;
}

/* The step's new K and V token rows (row_bytes each; rows k_stride / v_stride bytes
 * apart, views into the fused qkv output) into their cache slots: one call instead
 * of two index_copy_ dispatches per layer. */
void write_kv_rows(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                   char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes) {
    for (int64_t i = 0; i < n; i++) {
        memcpy(k_cache + slots[i] * row_bytes, k + i * k_stride, (size_t)row_bytes);
        memcpy(v_cache + slots[i] * row_bytes, v + i * v_stride, (size_t)row_bytes);
    }
}
