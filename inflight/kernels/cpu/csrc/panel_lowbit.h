/*
 * Low-bit panels for the fp32 GEMM (gemm_f32.c): a weight whose every block of 32
 * inputs holds values d * q + m with 4-bit q (what a GGUF Q4_0 or Q4_1 tensor
 * dequantizes to), or d * q with 8-bit q (Q8_0), kept in that form: 0.75 or 1.125
 * bytes a weight instead of 4.
 *
 * A decode step of a few rows reads every weight byte once from DRAM for two FLOPs a
 * row: fp32 panels make it wait on memory, low-bit ones cut the bytes by 3.6-5.3x.
 * Before the microkernel runs, a thread expands the panel into a scratch buffer of fp32
 * panel layout (its K x NR floats stay in L2 while the rows pass under it), so the
 * products and their order are exactly the fp32 panel GEMM's; panel_lowbit.py packs a
 * weight this way only after checking that lowbit_dequant gives back its fp32 panels
 * bit for bit.
 *
 * Layout of one panel (NR output columns, as the fp32 panel), block by block of 32 k:
 *   4-bit:  float d[NR], m[NR];   the block's scale and offset for each column
 *           uint8 q[16][NR];      byte j of pair i: column j's q at k = 2i in the low
 *                                 nibble, at k = 2i + 1 in the high one
 *   8-bit:  float d[NR];
 *           int8  q[32][NR];      column j's q at k in byte j of row k
 * K is a multiple of 32.
 */
#ifndef INFLIGHT_PANEL_LOWBIT_H
#define INFLIGHT_PANEL_LOWBIT_H
#include <stdint.h>

#define LB_K 32  /* inputs per block */

static inline int64_t lowbit_block_bytes(int bits) { return bits == 4 ? 8 * NR + LB_K * NR / 2 : 4 * NR + LB_K * NR; }
static inline int64_t lowbit_panel_bytes(int bits, int64_t K) { return K / LB_K * lowbit_block_bytes(bits); }

/* NOTE: d * q is exact in float32 (a half float times a 4- or 8-bit integer), so the
 * compiler may fuse d * q + m into one FMA without changing a bit. */
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

/* panel (lowbit_panel_bytes(bits, K) bytes) -> out[K][NR], the fp32 panel it stands for */
static void lowbit_dequant(const uint8_t* panel, int bits, int64_t K, float* out) {
    const int64_t bb = lowbit_block_bytes(bits);
    for (int64_t kb = 0; kb < K / LB_K; kb++) {
        if (bits == 4) q4_block(panel + kb * bb, out + kb * LB_K * NR);
        else q8_block(panel + kb * bb, out + kb * LB_K * NR);
    }
}

/* every panel of a low-bit weight expanded to fp32 panels (out: panels x K x NR): what
 * panel_lowbit.py compares with the fp32 packing before it keeps the low-bit one */
int gemm_f32_lowbit_dequant(const uint8_t* qp, int bits, int64_t panels, int64_t K, float* out) {
    if (K % LB_K || (bits != 4 && bits != 8)) return -2;
    for (int64_t p = 0; p < panels; p++) lowbit_dequant(qp + p * lowbit_panel_bytes(bits, K), bits, K, out + p * K * NR);
    return 0;
}

/* a panel's bytes toward the caches before it is expanded and used */
static inline void lowbit_prefetch(const uint8_t* panel, int bits, int64_t K) {
    for (int64_t b = 0; b < lowbit_panel_bytes(bits, K); b += 64) __builtin_prefetch(panel + b, 0, 2);
}
#endif
