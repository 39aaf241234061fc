/*
 * Low-bit panels for the fp32 GEMM (gemm_f32.c): a weight whose every block of 32
 * inputs holds values d * q + m with 4-bit q (what a GGUF Q4_0, Q4_1 or Q4_K tensor
 * dequantizes to), or d * q with 8-bit q (Q8_0), kept in that form: 0.75 or 1.125
 * bytes a weight instead of 4. The K-quant form (bits = 6), a d and m for every 16 inputs
 * and q in a byte (1.5 bytes a weight), holds what those cannot: Q6_K and Q3_K (d * q with a
 * d for every 16 inputs), Q5_0, Q5_1, Q5_K and Q2_K (d * q + m, q in 0..31), and fused
 * weights whose rows mix them with 4-bit ones (a Q4_K_M file's qkv).
 *
 * A decode step of a few rows reads every weight byte once from DRAM for two FLOPs a
 * row: fp32 panels make it wait on memory, low-bit ones cut the bytes by 3.6-5.3x.
 * Before the microkernel runs, a thread expands the panel into a scratch buffer of fp32
 * panel layout (its K x NR floats stay in L2 while the rows pass under it), so the
 * products and their order are exactly the fp32 panel GEMM's; a block of at most MR rows
 * instead expands each weight vector in registers (lowbit_micro.h), in the same order.
 * panel_lowbit.py packs a weight this way only after checking that lowbit_dequant gives
 * back its fp32 panels bit for bit (the values' forms are found by lowbit_fit.h).
 *
 * Layout of one panel (NR output columns, as the fp32 panel), block by block of 32 k:
 *   4-bit:  float d[NR], m[NR];   the block's scale and offset for each column
 *           uint8 q[16][NR];      byte j of pair i: column j's q at k = 2i in the low
 *                                 nibble, at k = 2i + 1 in the high one
 *   8-bit:  float d[NR];
 *           int8  q[32][NR];      column j's q at k in byte j of row k
 *   K-quant: float d[2][NR], m[2][NR];  scale and offset of the first and second 16 k
 *           int8  q[32][NR];      as the 8-bit form's
 * K is a multiple of 32.
 */
#ifndef INFLIGHT_PANEL_LOWBIT_H
#define INFLIGHT_PANEL_LOWBIT_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LB_K 32  /* inputs per block */

#define LB_HALF (LB_K / 2)  /* inputs per scale in the K-quant form */

static inline int lowbit_form(int bits) { return bits == 4 || bits == 6 || bits == 8; }
static inline int64_t lowbit_block_bytes(int bits) {
    return bits == 4 ? 8 * NR + LB_K * NR / 2 : bits == 6 ? 16 * NR + LB_K * NR : 4 * NR + LB_K * NR;
}
static inline int64_t lowbit_panel_bytes(int bits, int64_t K) { return K / LB_K * lowbit_block_bytes(bits); }
int64_t gemm_f32_lowbit_panel_bytes(int bits, int64_t K) { return lowbit_panel_bytes(bits, K); }

/* NOTE: d * q is exact in float32 (lowbit_fit.h keeps d's significant bits and q's within
 * 24), so the compiler may fuse d * q + m into one FMA without changing a bit. */
static void q4_block(const uint8_t* blk, float* o) {
    vf d[NV], m[NV];
    for (int i = 0; i < NV; i++) {
        d[i] = vf_load((const float*)blk + i * VL);
        m[i] = vf_load((const float*)blk + NR + i * VL);
    }
    const uint8_t* q = blk + 8 * NR;
    for (int k = 0; k < LB_K; k += 2, q += NR, o += 2 * NR) {
        for (int i = 0; i < NV; i++) {
            const vi b = vi_load_u8(q + i * VL);
            vf_store(o + i * VL, d[i] * __builtin_convertvector(b & 15, vf) + m[i]);
            vf_store(o + NR + i * VL, d[i] * __builtin_convertvector(b >> 4, vf) + m[i]);
        }
    }
}

static void q8_block(const uint8_t* blk, float* o) {
    vf d[NV];
    for (int i = 0; i < NV; i++) d[i] = vf_load((const float*)blk + i * VL);
    const int8_t* q = (const int8_t*)(blk + 4 * NR);
    for (int k = 0; k < LB_K; k++, q += NR, o += NR)
        for (int i = 0; i < NV; i++) vf_store(o + i * VL, d[i] * __builtin_convertvector(vi_load_s8(q + i * VL), vf));
}

static void q6_block(const uint8_t* blk, float* o) {
    const int8_t* q = (const int8_t*)(blk + 16 * NR);
    for (int h = 0; h < 2; h++) {
        vf d[NV], m[NV];
        for (int i = 0; i < NV; i++) {
            d[i] = vf_load((const float*)blk + h * NR + i * VL);
            m[i] = vf_load((const float*)blk + (2 + h) * NR + i * VL);
        }
        for (int k = 0; k < LB_HALF; k++, q += NR, o += NR)
            for (int i = 0; i < NV; i++)
                vf_store(o + i * VL, d[i] * __builtin_convertvector(vi_load_s8(q + i * VL), vf) + m[i]);
    }
}

/* panel (lowbit_panel_bytes(bits, K) bytes) -> out[K][NR], the fp32 panel it stands for */
static void lowbit_dequant(const uint8_t* panel, int bits, int64_t K, float* out) {
    const int64_t bb = lowbit_block_bytes(bits);
    for (int64_t kb = 0; kb < K / LB_K; kb++) {
        if (bits == 4) q4_block(panel + kb * bb, out + kb * LB_K * NR);
        else if (bits == 6) q6_block(panel + kb * bb, out + kb * LB_K * NR);
        else q8_block(panel + kb * bb, out + kb * LB_K * NR);
    }
}

/* every panel of a low-bit weight expanded to fp32 panels (out: panels x K x NR), for
 * the tests to compare with the fp32 packing */
int gemm_f32_lowbit_dequant(const uint8_t* qp, int bits, int64_t panels, int64_t K, float* out) {
    if (K % LB_K || !lowbit_form(bits)) return -2;
    for (int64_t p = 0; p < panels; p++)
        lowbit_dequant(qp + p * lowbit_panel_bytes(bits, K), bits, K, out + p * K * NR);
    return 0;
}

/* 1 when every panel of a low-bit weight expands to the value of each float of its fp32
 * panels (packed: panels x K x NR), 0 where one differs, -2 for a bad K or width, -3
 * without memory. Values, not bits: see panel_lowbit.py on the sign of zero. */
int gemm_f32_lowbit_matches(const uint8_t* qp, int bits, int64_t panels, int64_t K, const float* packed) {
    if (K % LB_K || !lowbit_form(bits)) return -2;
    int same = 1, oom = 0;
    #pragma omp parallel reduction(& : same) reduction(| : oom)
    {
        float* buf = (float*)malloc(sizeof(float) * (size_t)(K * NR));
        oom = !buf;
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            if (!buf) continue;
            lowbit_dequant(qp + p * lowbit_panel_bytes(bits, K), bits, K, buf);
            const float* want = packed + p * K * NR;
            for (int64_t i = 0; i < K * NR; i++) same &= buf[i] == want[i];
        }
        free(buf);
    }
    return oom ? -3 : same;
}

#endif
