/* fp8 KV pools (kv_cache_dtype "fp8"; attention/kv_quant.py holds the torch side): each
 * (token, kv head) row of a pool is FP8_ROW(D) bytes, the head's D e4m3 codes (padded to an
 * even count) and then its bfloat16 scale, amax(|row|) / 448 rounded to bf16. A value is
 * code * scale. The K/V write here quantizes as kv_quant.quantize_fp8 does, bit for bit;
 * the float32 attention kernels dequantize rows as they copy them into their tiles.
 */
#ifndef INFLIGHT_KV_FP8_H
#define INFLIGHT_KV_FP8_H
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"
#include "vec.h"

#define FP8_VALUES(D) ((D) + ((D) & 1))  /* the scale's byte offset in a row */
#define FP8_ROW(D) (FP8_VALUES(D) + 2)
#define FP8_MAX 448.f
#define FP8_MAX_D 512  /* head_dim the write takes, at most */

static inline float fp8_row_scale(const uint8_t* row, int D) {
    uint16_t s;
    memcpy(&s, row + FP8_VALUES(D), sizeof s);
    return bf16_to_f32(s);
}

/* rows of an fp8 pool (FP8_ROW(D) bytes apart) dequantized into float32 rows (D apart):
 * each value code * scale, one rounding, as kv_quant.dequantize_fp8 computes it */
static inline void fp8_rows_to_f32(float* dst, const uint8_t* src, int rows, int D) {
    for (int r = 0; r < rows; r++, dst += D, src += FP8_ROW(D)) {
        const float scale = fp8_row_scale(src, D);
        const vf s = vf_set1(scale * 256.f);  /* the loads' values are the codes' times 2^-8 */
        int d = 0;
        for (; d + VL <= D; d += VL) vf_store(dst + d, vf_load_fp8_scaled(src + d) * s);
        for (; d < D; d++) dst[d] = fp8_to_f32_scaled(src[d]) * (scale * 256.f);
    }
}

/* One head's D floats quantized into an fp8 row: the scale amax / 448 (at least 1e-30)
 * rounded to bf16, each value divided by the rounded scale, clamped to +-448, rounded. */
static inline void fp8_quantize_row(const float* x, uint8_t* row, int D) {
    vf amax = vf_zero();
    for (int d = 0; d < D; d += VL) {
        const vf v = vf_load_n(x + d, D - d);
        amax = vf_max(amax, vf_max(v, -v));
    }
    float s = vf_reduce_max(amax) / FP8_MAX;
    s = s < 1e-30f ? 1e-30f : s;
    const uint16_t s16 = f32_to_bf16(s);
    const vf div = vf_set1(bf16_to_f32(s16));
    for (int d = 0; d < D; d += VL) {
        const vf q = vf_min(vf_max(vf_load_n(x + d, D - d) / div, vf_set1(-FP8_MAX)), vf_set1(FP8_MAX));
        const vi c = vi_fp8_codes(q);
        if (d + VL <= D) {
            vi_store_u8(row + d, c);
        } else {
            for (int i = 0; d + i < D; i++) row[d + i] = (uint8_t)c[i];
        }
    }
    if (D & 1) row[D] = 0;
    memcpy(row + FP8_VALUES(D), &s16, sizeof s16);
}

/* n bfloat16 rows of `row` values (src_stride apart) widened into contiguous float32 rows
 * (exactly): a bf16 model's queries for the float32 kernels over fp8 pools, and its K/V rows
 * before the fp8 write quantizes them */
static inline void bf16_rows_to_f32(float* dst, const uint16_t* src, int64_t src_stride, int64_t n, int64_t row) {
    for (int64_t i = 0; i < n; i++, dst += row, src += src_stride) {
        int64_t d = 0;
        for (; d + VL <= row; d += VL) vf_store(dst + d, vf_load_bf16(src + d));
        for (; d < row; d++) dst[d] = bf16_to_f32(src[d]);
    }
}

/* n float32 values rounded to bfloat16 (nearest, ties to even; a NaN stays a NaN): those
 * kernels' outputs, and a float32 model's K/V rows into bf16 pools */
static inline void f32_rows_to_bf16(uint16_t* dst, const float* src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

/* write_kv_rows into fp8 pools from rows of float32 (es 4) or bfloat16 (es 2) values:
 * row_bytes is the source rows' (kv heads x head_dim values), a slot holds FP8_ROW(D) a head */
static void fp8_write_rows(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                           char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes, int D, int es) {
    const int nkv = (int)(row_bytes / es / D);
    const int64_t slot_bytes = (int64_t)nkv * FP8_ROW(D);
    #pragma omp parallel for schedule(static) if (n * nkv * D >= 8192)
    for (int64_t i = 0; i < n; i++) {
        float buf[FP8_MAX_D];
        for (int h = 0; h < nkv; h++)
            for (int which = 0; which < 2; which++) {
                const char* src = (which ? v + i * v_stride : k + i * k_stride) + (int64_t)h * D * es;
                uint8_t* dst = (uint8_t*)(which ? v_cache : k_cache) + slots[i] * slot_bytes + (int64_t)h * FP8_ROW(D);
                uint8_t row[FP8_ROW(FP8_MAX_D)];
                const float* x = (const float*)(const void*)src;  /* float32 rows as they are */
                if (es == 2) {  /* bf16 rows widened first */
                    bf16_rows_to_f32(buf, (const uint16_t*)(const void*)src, D, 1, D);
                    x = buf;
                }
                /* NOTE: the row is built in L1 and copied whole: the pool's lines are rarely in
                 * the caches, and byte-wide stores to them fill the store buffer while they load */
                fp8_quantize_row(x, row, D);
                memcpy(dst, row, (size_t)FP8_ROW(D));
            }
    }
}

#endif
