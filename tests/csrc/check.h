/* What the parts of kernel_check share: the verdicts, the deterministic inputs, the error
 * measure, the block pools with their reference attention, and each part's checks (run by
 * main in kernel_check.c, in one order: the inputs come from one random sequence). */
#ifndef INFLIGHT_KERNEL_CHECK_H
#define INFLIGHT_KERNEL_CHECK_H
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec.h"

/* check_common.c */
extern int verbose;  /* print the passing checks too */
void result(int ok, const char* name, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
int present(const void* fn, const char* name);  /* 0 (and a SKIP line) for a kernel not linked */
int check_summary(void);                        /* prints the counts; the exit status */
uint32_t rnd_u32(void);
float rnd(void);                                /* uniform in [-1, 1) */
int rnd_int(int lo, int hi);
float* frand(int64_t n, float amp);
double err_ratio(const float* got, const double* want, int64_t n, double atol, double rtol, double* worst_abs);

/* check_pool.c: a block pool with each sequence's blocks at shuffled places */
struct pool {
    int num_blocks, block_size, nkv, hd;
    int64_t bt_stride;
    float *k, *v;
    int64_t* bt;
};
struct pool make_pool(int num_seqs, const int64_t* lens, int block_size, int nkv, int hd);
void free_pool(struct pool* p);
const float* pool_row(const struct pool* p, const float* cache, int s, int64_t t, int kh);
void ref_attend_from(const struct pool* p, int s, int kh, const float* q, int64_t lo, int64_t n, float scale,
                     double* out);
void ref_attend(const struct pool* p, int s, int kh, const float* q, int64_t n, float scale, double* out);

/* the checks, a file each: check_vec.c, check_decode.c, check_prefill.c, check_fused.c, check_gemm.c */
void check_vec_exp(void);
void check_vec_silu(void);
void check_vec_reductions(void);
void check_vec_lanes(void);
void check_paged_decode(void);
void check_paged_decode_shared_prefix(void);
void check_paged_decode_fp8(void);
void check_paged_prefill(void);
void check_sliding_window(void);
void check_fused(void);
void check_rmsnorm_heads(void);
void check_gemm(void);

#endif
