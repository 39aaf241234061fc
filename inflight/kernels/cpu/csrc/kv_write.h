/* The K/V write entry points of the paged_decode library (paged_decode.c includes this once):
 * the step's new K and V rows into their pool slots, as they are or converted for the pool.
 */
#ifndef INFLIGHT_KV_WRITE_H
#define INFLIGHT_KV_WRITE_H
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"
#include "kv_fp8.h"

/* The step's new K and V token rows (row_bytes each; rows k_stride / v_stride bytes
 * apart, views into the fused qkv output) into their cache slots: one call instead
 * of two index_copy_ dispatches per layer. head_dim: the rows' heads' (the fp8 forms
 * scale each head's row; the others ignore it). */
void write_kv_rows(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                   char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes, int head_dim) {
    (void)head_dim;
    for (int64_t i = 0; i < n; i++) {
        memcpy(k_cache + slots[i] * row_bytes, k + i * k_stride, (size_t)row_bytes);
        memcpy(v_cache + slots[i] * row_bytes, v + i * v_stride, (size_t)row_bytes);
    }
}

/* write_kv_rows for float32 rows into bfloat16 pools, with the same arguments (strides and
 * row_bytes those of the float32 rows; a pool slot holds half as many bytes): each value
 * rounded to the nearest bf16, ties to even, as torch's .to(torch.bfloat16) */
void write_kv_rows_f32_bf16(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                            char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes, int head_dim) {
    (void)head_dim;
    const int64_t elems = row_bytes / (int64_t)sizeof(float);
    for (int64_t i = 0; i < n; i++) {
        f32_rows_to_bf16((uint16_t*)(void*)k_cache + slots[i] * elems, (const float*)(const void*)(k + i * k_stride),
                         elems);
        f32_rows_to_bf16((uint16_t*)(void*)v_cache + slots[i] * elems, (const float*)(const void*)(v + i * v_stride),
                         elems);
    }
}

/* write_kv_rows for float32 or bfloat16 rows into fp8 pools (kv_fp8.h), the same arguments:
 * each kv head's row quantized with its own scale */
void write_kv_rows_f32_fp8(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                           char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes, int head_dim) {
    fp8_write_rows(k, k_stride, v, v_stride, k_cache, v_cache, slots, n, row_bytes, head_dim, 4);
}

void write_kv_rows_bf16_fp8(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                            char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes, int head_dim) {
    fp8_write_rows(k, k_stride, v, v_stride, k_cache, v_cache, slots, n, row_bytes, head_dim, 2);
}

#endif
