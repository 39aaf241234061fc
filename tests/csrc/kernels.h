/* Prototypes of the fp32 kernels kernel_check.c tests, as the kernels in
 * inflight/kernels/cpu/csrc define them. The build force-includes this header into
 * every kernel source (-include), so a signature that drifts is a compile error
 * ("conflicting types"), not a silent mismatch. Weak: a kernel whose source is not
 * linked is a NULL pointer, and the driver reports it as skipped. */
#ifndef INFLIGHT_KERNEL_CHECK_KERNELS_H
#define INFLIGHT_KERNEL_CHECK_KERNELS_H
#include <stdint.h>

#define KWEAK __attribute__((weak))

/* gemm_f32.c */
KWEAK int gemm_f32_panel(void);
KWEAK const char* gemm_f32_isa(void);
KWEAK int gemm_f32(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                   const float* bias, float* out, int64_t ldc);
KWEAK int gemm_f32_silu(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                        float* out, int64_t ldc);
KWEAK int gemm_f32_argmax(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                          int64_t* tokens);
KWEAK int gemm_f32_q4(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,
                      const float* bias, float* out, int64_t ldc);
KWEAK int gemm_f32_q4_silu(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,
                           float* out, int64_t ldc);
KWEAK int gemm_f32_q8(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,
                      const float* bias, float* out, int64_t ldc);
KWEAK int gemm_f32_q8_silu(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,
                           float* out, int64_t ldc);
KWEAK int gemm_f32_lowbit_dequant(const uint8_t* qp, int bits, int64_t panels, int64_t K, float* out);

/* fused_ops.c */
KWEAK void add_rmsnorm_f32(float* x, float* residual, const float* weight, float* out, int64_t rows, int64_t dim,
                           float eps, int add);
KWEAK void rope_f32(float* qkv, int64_t rows, int64_t stride, int nh, int nkv, int d, const float* cos_rows,
                    const float* sin_rows);
KWEAK void silu_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t inter);
KWEAK void rmsnorm_heads_f32(float* qkv, int64_t rows, int64_t stride, int nh, int nkv, int d, const float* q_w,
                             const float* k_w, float eps);

/* paged_decode.c */
KWEAK void paged_decode_f32(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                            const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, float* out,
                            int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,
                            int max_len);

KWEAK void paged_decode_f32_kvfp8(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                                  const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens,
                                  float* out, int num_seqs, int num_heads, int num_kv_heads, int head_dim,
                                  int block_size, float scale, int max_len);
KWEAK void write_kv_rows_f32_fp8(const char* k, int64_t k_stride, const char* v, int64_t v_stride, char* k_cache,
                                 char* v_cache, const int64_t* slots, int64_t n, int64_t row_bytes, int head_dim);

/* paged_prefill.c */
KWEAK int paged_prefill_f32_supported(int head_dim, int group);
KWEAK int paged_prefill_f32(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                            const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start,
                            const int64_t* q_len, const int64_t* seq_len, float* out, int num_reqs, int num_heads,
                            int num_kv_heads, int head_dim, int block_size, float scale, void* workspace);
KWEAK int paged_prefill_f32_sw(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                               const int64_t* block_tables, int64_t bt_stride, const int64_t* q_start,
                               const int64_t* q_len, const int64_t* seq_len, float* out, int num_reqs, int num_heads,
                               int num_kv_heads, int head_dim, int block_size, float scale, void* workspace,
                               int window);
KWEAK void paged_decode_f32_sw(const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                               const int64_t* block_tables, int64_t bt_stride, const int64_t* seq_lens, float* out,
                               int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                               float scale, int max_len, int window);

#endif
