/*
 * fp32 linear layer for the CPU, every ISA level from this one source (vec.h):
 * out[M, N] = x[M, K] . W[N, K]^T (+ bias).
 *
 * W is packed once at load time (gemm_f32.py) into panels of NR output columns,
 * K-major inside a panel: packed[N/NR][K][NR], zero-padded past N. The
 * microkernel keeps an R x NR block of out (R <= MR rows) in MR * NV vector
 * registers over a stretch of K: per k it loads the panel's NV vectors and
 * broadcasts one x value per row (BLIS style; x is read in place, rows lda apart).
 *
 *   level     VL  regs  MR x NR   accumulators + B + broadcast
 *   avx512    16  32     8 x 48   24 + 3 + 1
 *   avx2       8  16     6 x 16   12 + 2 + 1
 *   neon       4  32     8 x 12   24 + 3 + 1
 *   scalar     4  16     4 x 8     8 + 2 + 1 (whatever the baseline makes of it)
 *
 * Blocking: per block of MC rows (its MC x K slice of x stays in L2), each panel
 * passes under the block's row groups, from L2; the second row group prefetches the
 * next panel, so that only the first panel of a block waits on DRAM. A K longer than
 * a 96 KB chunk of a panel goes in chunks (smaller chunks, sized for L1, measured
 * slower at K = 576-1536: the partial sums cost more than the L1 reuse saved);
 * partial sums go to out (or a per-thread scratch for the epilogues) between chunks
 * and come back unchanged, so every output is the same fp32 sum in the same order
 * whatever M, the blocking or the thread count: a row's result does not depend on
 * the batch it is in.
 *
 * Threads split the panels (each streams its own contiguous stretch of the packed
 * weight: a decode step reads it once at DRAM speed) and, when the panels are too
 * few for all of them, the row blocks too.
 *
 * Entry points: gemm_f32 (plain, optional bias); gemm_f32_silu (the gate_up
 * projection, silu(gate) * up in its epilogue); gemm_f32_argmax (the logits
 * projection reduced to each row's argmax, for greedy sampling; _masked: over the
 * tokens a grammar allows); gemm_f32_q4*, gemm_f32_q8* and gemm_f32_q6* (the same over
 * 4-bit, 8-bit and K-quant panels, panel_lowbit.h: for the few rows of a decode step).
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "gemm_f32_tile.h"
#include "panel_lowbit.h"
#include "lowbit_fit.h"
#include "lowbit_micro.h"

#if defined(INFLIGHT_ISA_AMX_BF16)
#define ISA_NAME "amx_bf16"
#elif defined(INFLIGHT_ISA_AVX512_BF16)
#define ISA_NAME "avx512_bf16"
#else
#define ISA_NAME VEC_ISA_NAME
#endif

int gemm_f32_panel(void) { return NR; }
const char* gemm_f32_isa(void) { return ISA_NAME; }

/* a low-bit weight (panel_lowbit.h): its panels and their width in bits */
struct lowbit {
    const uint8_t* data;
    int bits;
};

/* panel q of the weight: in place, or (lb.data != NULL) a low-bit panel expanded into buf */
static const float* panel_at(const float* packed, struct lowbit lb, int64_t q, int64_t K, float* buf) {
    if (!lb.data) return packed + q * K * NR;
    lowbit_dequant(lb.data + q * lowbit_panel_bytes(lb.bits, K), lb.bits, K, buf);
    return buf;
}

/* One thread's share: rows [m0, m1), panels [q0, q1) of packed, or of lb (low-bit
 * panels, panel_lowbit.h) when lb.data is not NULL.
 * silu_half > 0: gate panels [q0, q1), each paired with up panel q + silu_half,
 * written as silu(gate) * up (out has silu_half * NR columns).
 * best != NULL: each row's argmax goes to best[row] instead of out.
 * Returns -3 when the buffer for expanded low-bit panels cannot be had. */
static int gemm_range(const float* x, int64_t m0, int64_t m1, int64_t K, int64_t lda, const float* packed,
                      struct lowbit lb, int64_t N, const float* bias, float* out, int64_t ldc, int64_t q0,
                      int64_t q1, int64_t silu_half, struct best* best) {
    float* qbuf = NULL;  /* the gate (or only) panel, then the up panel, expanded */
    const uint8_t* low = lb.data;
    if (LOWBIT_IN_REGISTERS && low && m1 - m0 <= MR) {  /* one register block of rows: no buffer */
        lowbit_range(x, m0, m1, K, lda, low, lb.bits, N, bias, out, ldc, q0, q1, silu_half, best);
        return 0;
    }
    if (low && !(qbuf = (float*)aligned_alloc(64, sizeof(float) * (size_t)(2 * K * NR)))) return -3;
    /* partial sums of a gate tile and of an up / logits tile, for the epilogues */
    float scratch[2 * MC_MAX * NR] __attribute__((aligned(64)));
    float* g = scratch;
    float* u = scratch + MC_MAX * NR;
    /* K in nk chunks of even length */
    const int64_t nk = K > KC_MAX ? (K + KC_MAX - 1) / KC_MAX : 1, kc_len = K > 0 ? (K + nk - 1) / nk : 1;
    int64_t mc_len = L2_X_BYTES / (4 * (K > 0 ? K : 1)) / MR * MR;
    mc_len = mc_len < MR ? MR : mc_len > MC_MAX ? MC_MAX : mc_len;
    for (int64_t mc = m0; mc < m1; mc += mc_len) {
        const int64_t mend = mc + mc_len < m1 ? mc + mc_len : m1;
        for (int64_t q = q0; q < q1; q++) {
            const int64_t col0 = q * NR, ncols = N - col0 < NR ? N - col0 : NR;
            /* fp32 panels: the panel after this one (the next in the range, or the first for
             * the next row block) is fetched while this one's second row group runs. Low-bit
             * panels are left to the hardware prefetcher (lowbit_range's NOTE). */
            const int64_t qn = q + 1 < q1 ? q + 1 : mend < m1 ? q0 : -1;
            const float* panel = panel_at(packed, lb, q, K, qbuf);
            const float* next = low || qn < 0 ? NULL : packed + qn * K * NR;
            if (silu_half > 0) {
                const float* up = panel_at(packed, lb, q + silu_half, K, qbuf + K * NR);
                panel_block(x, mc, mend, K, lda, panel, kc_len, NULL, g, NR, NR, STORE, NULL, 0, NULL, NULL, 0,
                            low ? NULL : up);
                panel_block(x, mc, mend, K, lda, up, kc_len, NULL, u, NR, NR, SILU, out + mc * ldc + col0, ldc, g,
                            NULL, 0, next);
            } else if (best) {
                panel_block(x, mc, mend, K, lda, panel, kc_len, bias ? bias + col0 : NULL, u, NR, ncols, ARGMAX,
                            NULL, 0, NULL, best + mc, col0, next);
            } else {
                panel_block(x, mc, mend, K, lda, panel, kc_len, bias ? bias + col0 : NULL, out + mc * ldc + col0, ldc,
                            ncols, STORE, NULL, 0, NULL, NULL, 0, next);
            }
        }
    }
    free(qbuf);
    return 0;
}

/* The thread grid: tn groups over the panels times tm over the rows (tm * tn = nt).
 * Panels first (each group streams its own weight); rows as well only when each
 * thread would get fewer than 4 panels and there are rows enough to share. */
static void split(int64_t M, int64_t panels, int nt, int* tm, int* tn) {
    int best_tn = nt;
    if (panels < 4 * (int64_t)nt && M > MR)
        for (best_tn = nt; best_tn > 1; best_tn--)
            if (nt % best_tn == 0 && panels >= 4 * (int64_t)best_tn) break;
    if ((M + MR - 1) / MR < nt / best_tn) best_tn = nt;  /* too few row groups: the panels it is */
    *tn = best_tn;
    *tm = nt / best_tn;
}

/* thread t's rows and panels */
static void share(int t, int tm, int tn, int64_t M, int64_t panels, int64_t* m0, int64_t* m1, int64_t* q0,
                  int64_t* q1) {
    const int ti = t / tn, tj = t % tn;
    const int64_t groups = (M + MR - 1) / MR;  /* whole register blocks per thread */
    *m0 = groups * ti / tm * MR;
    *m1 = groups * (ti + 1) / tm * MR;
    if (*m1 > M) *m1 = M;
    *q0 = panels * tj / tn;
    *q1 = panels * (tj + 1) / tn;
}

/* out = x . W^T (+ bias) over the panels in packed, or in lb when lb.data is not NULL */
static int gemm_panels(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, struct lowbit lb,
                       int64_t N, const float* bias, float* out, int64_t ldc) {
    if (M <= 0 || N <= 0) return 0;
    const int64_t panels = (N + NR - 1) / NR;
    int rc = 0;
    #pragma omp parallel
    {
        int tm, tn;  /* from the team's real size: inside another parallel region it is 1 */
        int64_t m0, m1, q0, q1;
        split(M, panels, omp_get_num_threads(), &tm, &tn);
        share(omp_get_thread_num(), tm, tn, M, panels, &m0, &m1, &q0, &q1);
        if (m0 < m1 && q0 < q1 && gemm_range(x, m0, m1, K, lda, packed, lb, N, bias, out, ldc, q0, q1, 0, NULL))
            rc = -3;  /* NOTE: a benign race: every thread that fails writes the same value */
    }
    return rc;
}

/* silu(gate) * up over the panels in packed, or in lb when lb.data is not NULL */
static int silu_panels(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, struct lowbit lb,
                       int64_t N, float* out, int64_t ldc) {
    if (N % (2 * NR)) return -2;
    if (M <= 0 || N <= 0) return 0;
    const int64_t half = N / 2 / NR;
    int rc = 0;
    #pragma omp parallel
    {
        int tm, tn;
        int64_t m0, m1, q0, q1;
        split(M, half, omp_get_num_threads(), &tm, &tn);
        share(omp_get_thread_num(), tm, tn, M, half, &m0, &m1, &q0, &q1);
        if (m0 < m1 && q0 < q1 && gemm_range(x, m0, m1, K, lda, packed, lb, N / 2, NULL, out, ldc, q0, q1, half, NULL))
            rc = -3;
    }
    return rc;
}

/* tokens[m] = argmax over the columns of (x . W^T)[m] (no bias), the first column on
 * ties, as torch.argmax of the fp32 outputs gives it, without writing them out.
 * bitmask (NULL: none) holds grammar masks of `words` int32 each: row m considers only
 * the columns set in mask row mask_rows[m] (every column where that is negative), as
 * argmax of the logits with the disallowed ones at -inf gives it; a row whose allowed
 * outputs are all -inf (or that allows none) gets 0, as that argmax does. */
static int argmax_panels(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, struct lowbit lb,
                         int64_t N, const int32_t* bitmask, int64_t words, const int64_t* mask_rows, int64_t* tokens) {
    if (M <= 0) return 0;
    if (N <= 0) return -2;
    if (bitmask && words * 32 < N) return -4;
    const int64_t panels = (N + NR - 1) / NR;
    const int nt = omp_get_max_threads();  /* at least the team's size */
    struct best* all = best_alloc(M, nt, bitmask, words, mask_rows);
    if (!all) return -3;
    int tn = 1, rc = 0;
    #pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        int tm, tn_t;
        int64_t m0, m1, q0, q1;
        split(M, panels, omp_get_num_threads(), &tm, &tn_t);
        if (t == 0) tn = tn_t;
        share(t, tm, tn_t, M, panels, &m0, &m1, &q0, &q1);
        if (m0 < m1 && q0 < q1 &&
            gemm_range(x, m0, m1, K, lda, packed, lb, N, NULL, NULL, 0, q0, q1, 0, all + (int64_t)(t % tn_t) * M))
            rc = -3;
    }
    best_reduce(all, M, tn, tokens);  /* the panel groups hold increasing column ranges */
    return rc;
}

static const struct lowbit FP32 = {NULL, 0};

/* out = x . W^T (+ bias); x rows lda apart, out rows ldc apart. */
int gemm_f32(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N, const float* bias,
             float* out, int64_t ldc) {
    return gemm_panels(x, M, K, lda, packed, FP32, N, bias, out, ldc);
}

/* out[M, N/2] = silu(gate) * up for the gate_up projection, [gate | up] = x . W^T
 * (no bias), without writing gate_up out. N/2 must be a multiple of the panel (else
 * -2: the caller runs gemm_f32 and the product itself). */
int gemm_f32_silu(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N, float* out,
                  int64_t ldc) {
    return silu_panels(x, M, K, lda, packed, FP32, N, out, ldc);
}

int gemm_f32_argmax_masked(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                           const int32_t* bitmask, int64_t words, const int64_t* mask_rows, int64_t* tokens) {
    return argmax_panels(x, M, K, lda, packed, FP32, N, bitmask, words, mask_rows, tokens);
}

int gemm_f32_argmax(const float* x, int64_t M, int64_t K, int64_t lda, const float* packed, int64_t N,
                    int64_t* tokens) {
    return argmax_panels(x, M, K, lda, packed, FP32, N, NULL, 0, NULL, tokens);
}

/* The four entry points over low-bit panels (panel_lowbit.h; K a multiple of 32, else
 * -2): gemm_f32_q4*, gemm_f32_q8*, gemm_f32_q6*, the same outputs, bit for bit, as over the fp32
 * panels they expand to. */
#define LOWBIT_ENTRY_POINTS(B)                                                                                       \
    int gemm_f32_q##B(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,            \
                      const float* bias, float* out, int64_t ldc) {                                                  \
        return K % LB_K ? -2 : gemm_panels(x, M, K, lda, NULL, (struct lowbit){qp, B}, N, bias, out, ldc);           \
    }                                                                                                                \
    int gemm_f32_q##B##_silu(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,     \
                             float* out, int64_t ldc) {                                                              \
        return K % LB_K ? -2 : silu_panels(x, M, K, lda, NULL, (struct lowbit){qp, B}, N, out, ldc);                 \
    }                                                                                                                \
    int gemm_f32_q##B##_argmax_masked(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp,        \
                                      int64_t N, const int32_t* bitmask, int64_t words, const int64_t* mask_rows,    \
                                      int64_t* tokens) {                                                             \
        return K % LB_K ? -2                                                                                         \
                        : argmax_panels(x, M, K, lda, NULL, (struct lowbit){qp, B}, N, bitmask, words, mask_rows,    \
                                        tokens);                                                                     \
    }                                                                                                                \
    int gemm_f32_q##B##_argmax(const float* x, int64_t M, int64_t K, int64_t lda, const uint8_t* qp, int64_t N,   \
                               int64_t* tokens) {                                                                    \
        return gemm_f32_q##B##_argmax_masked(x, M, K, lda, qp, N, NULL, 0, NULL, tokens);                            \
    }

LOWBIT_ENTRY_POINTS(4)
LOWBIT_ENTRY_POINTS(8)
LOWBIT_ENTRY_POINTS(6)
