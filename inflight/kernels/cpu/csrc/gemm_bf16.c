/*
 * bf16 linear layer for the CPU: out[M, N] = x[M, K] . W[N, K]^T (+ bias), float32
 * accumulation, rounded to bf16 once at the end (as oneDNN does).
 *
 * W is packed once at load time (gemm_bf16.py) into panels of 32 output columns:
 * packed[N/32][K/2][32][2], each K pair of 32 columns is one 64-byte vector, the
 * operand layout of the AVX-512-BF16 dot-product instruction. A decode step
 * streams every panel from DRAM exactly once whatever M is; a prefill step keeps
 * one panel in cache while every row block of x passes over it.
 *
 * Entry points: gemm_bf16 (the plain layer); gemm_bf16_silu (the gate_up projection
 * with silu(gate) * up in its epilogue); gemm_bf16_argmax (the logits projection
 * reduced to each row's argmax, for greedy sampling; _masked: over the tokens a
 * grammar allows). All three share the loops.
 *
 * Three implementations of the per-thread loops (gemm_range), one header each:
 * gemm_bf16_amx.h, Intel AMX tiles at the amx_bf16 level (K not a multiple of 32 there
 * takes the dot-product loops); gemm_bf16_dp.h, the bf16 dot product at the avx512_bf16 level;
 * gemm_bf16_widen.h, every other level (avx512, avx2, neon, scalar), bf16 widened to
 * fp32 in registers with vec.h and fp32 FMAs.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "argmax_best.h"
#include "bf16_simd.h"

#define PANEL 32  /* output columns per packed panel */
#define MC 96     /* rows per L2 block of x */

int gemm_bf16_panel(void) { return PANEL; }

enum mode { PLAIN, SILU, ARGMAX };

#if defined(INFLIGHT_ISA_AMX_BF16)
#include "gemm_bf16_amx.h"
#define gemm_range amx_gemm_range
#elif defined(INFLIGHT_ISA_AVX512_BF16)
#include "gemm_bf16_dp.h"
#define gemm_range dp_gemm_range
#else
#include "gemm_bf16_widen.h"
#endif

#if defined(INFLIGHT_ISA_AMX_BF16)
/* asks for the tiles at load, before threads race to; refused, the dot product runs */
int gemm_bf16_supported(void) { amx_permitted(); return 1; }
#else
int gemm_bf16_supported(void) { return 1; }
#endif

/* out = x . W^T (+ bias); x rows lda apart, out rows ldc apart. Threads split the
 * panels evenly, so each reads its own contiguous stretch of the packed weight. */
int gemm_bf16(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
              const uint16_t* bias, uint16_t* out, int64_t ldc) {
    if (M <= 0 || N <= 0) return 0;
    const int64_t panels = (N + PANEL - 1) / PANEL;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = panels * t / nt, q1 = panels * (t + 1) / nt;
        if (q0 < q1) gemm_range(x, M, K, lda, packed, N, bias, out, ldc, q0, q1, 0, NULL);
    }
    return 0;
}

/* out[M, N/2] = bf16(silu(gate)) * up for the gate_up projection, [gate | up] = x . W^T
 * (no bias), as gemm_bf16 then silu_mul_bf16 give it, bit for bit, without writing
 * gate_up out. N/2 must be a multiple of the panel (else -2: use the two calls). */
int gemm_bf16_silu(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
                   uint16_t* out, int64_t ldc) {
    if (N % (2 * PANEL)) return -2;
    if (M <= 0) return 0;
    const int64_t half = N / 2 / PANEL;
    #pragma omp parallel
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = half * t / nt, q1 = half * (t + 1) / nt;
        if (q0 < q1) gemm_range(x, M, K, lda, packed, N / 2, NULL, out, ldc, q0, q1, half, NULL);
    }
    return 0;
}

/* tokens[m] = argmax over columns of bf16(x . W^T)[m] (no bias), the first column on
 * ties: what rounding the logits to bf16 and taking their argmax gives, without
 * writing the logits out (greedy sampling). bitmask (NULL: none) holds grammar masks of
 * `words` int32 each: row m considers only the columns set in mask row mask_rows[m]
 * (every column where that is negative), as argmax of the logits with the disallowed
 * ones at -inf gives it; a row whose allowed outputs are all -inf (or that allows
 * none) gets 0, as that argmax does. */
int gemm_bf16_argmax_masked(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
                            const int32_t* bitmask, int64_t words, const int64_t* mask_rows, int64_t* tokens) {
    if (M <= 0) return 0;
    if (bitmask && words * 32 < N) return -4;
    const int64_t panels = (N + PANEL - 1) / PANEL;
    const int nt = omp_get_max_threads();
    struct best* all = best_alloc(M, nt, bitmask, words, mask_rows);
    if (!all) return -3;
    #pragma omp parallel num_threads(nt)
    {
        const int n = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = panels * t / n, q1 = panels * (t + 1) / n;
        if (q0 < q1) gemm_range(x, M, K, lda, packed, N, NULL, NULL, 0, q0, q1, 0, all + (int64_t)t * M);
    }
    best_reduce(all, M, nt, tokens);  /* threads hold increasing column ranges */
    return 0;
}

int gemm_bf16_argmax(const uint16_t* x, int64_t M, int64_t K, int64_t lda, const uint16_t* packed, int64_t N,
                     int64_t* tokens) {
    return gemm_bf16_argmax_masked(x, M, K, lda, packed, N, NULL, 0, NULL, tokens);
}
