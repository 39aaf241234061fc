/*
 * 4-bit panels for the fp32 GEMM (gemm_f32.c): a weight whose every block of 32
 * inputs holds values d * q + m (q in 0..15; what a GGUF Q4_0 or Q4_1 tensor
 * dequantizes to) kept in that form, 0.75 bytes a weight instead of 4.
 *
 * A decode step of a few rows reads every weight byte once from DRAM for two FLOPs a
 * row: fp32 panels make it wait on memory, 4-bit ones cut the bytes by 5.3x. Before
 * the microkernel runs, a thread expands the panel into a scratch buffer of fp32 panel
 * layout (its K x NR floats stay in L2 while the rows pass under it), so the products
 * and their order are exactly the fp32 panel GEMM's; panel_q4.py packs a weight this
 * way only after checking that q4_dequant gives back its fp32 panels bit for bit.
 *
 * Layout of one panel (NR output columns, as the fp32 panel), block by block of 32 k:
 *   float d[NR], m[NR];          the block's scale and offset for each column
 *   uint8 q[16][NR];             byte j of pair i: column j's q at k = 2i in the low
 *                                nibble, at k = 2i + 1 in the high one
 * so a block is Q4_BLOCK_BYTES and a panel K / 32 blocks (K a multiple of 32).
 */
#ifndef INFLIGHT_PANEL_Q4_H
#define INFLIGHT_PANEL_Q4_H
#include <stdint.h>

#define Q4_K 32  /* inputs per block */
#define Q4_BLOCK_BYTES (8 * NR + Q4_K * NR / 2)

static inline int64_t q4_panel_bytes(int64_t K) { return K / Q4_K * Q4_BLOCK_BYTES; }

/* panel (q4_panel_bytes(K) bytes) -> out[K][NR], the fp32 panel it stands for.
 * NOTE: d * q is exact in float32 (a half float times a 4-bit integer), so the
 * compiler may fuse d * q + m into one FMA without changing a bit. */
static void q4_dequant(const uint8_t* panel, int64_t K, float* out) {
    for (int64_t kb = 0; kb < K / Q4_K; kb++) {
        const uint8_t* blk = panel + kb * Q4_BLOCK_BYTES;
        vf d[NV], m[NV];
        for (int i = 0; i < NV; i++) {
            d[i] = vf_load((const float*)blk + i * VL);
            m[i] = vf_load((const float*)blk + NR + i * VL);
        }
        const uint8_t* q = blk + 8 * NR;
        float* o = out + kb * Q4_K * NR;
        for (int k = 0; k < Q4_K; k += 2, q += NR, o += 2 * NR) {
            for (int i = 0; i < NV; i++) {
                const vi b = vi_load_u8(q + i * VL);
                vf_store(o + i * VL, d[i] * __builtin_convertvector(b & 15, vf) + m[i]);
                vf_store(o + NR + i * VL, d[i] * __builtin_convertvector(b >> 4, vf) + m[i]);
            }
        }
    }
}

/* every panel of a 4-bit weight expanded to fp32 panels (out: panels x K x NR): what
 * panel_q4.py compares with the fp32 packing before it keeps the 4-bit one */
int gemm_f32_q4_dequant(const uint8_t* q4, int64_t panels, int64_t K, float* out) {
    if (K % Q4_K) return -2;
    for (int64_t p = 0; p < panels; p++) q4_dequant(q4 + p * q4_panel_bytes(K), K, out + p * K * NR);
    return 0;
}

/* the next panel's bytes toward the caches while this one is expanded and used */
static inline void q4_prefetch(const uint8_t* panel, int64_t K) {
    for (int64_t b = 0; b < q4_panel_bytes(K); b += 64) __builtin_prefetch(panel + b, 0, 2);
}
#endif
