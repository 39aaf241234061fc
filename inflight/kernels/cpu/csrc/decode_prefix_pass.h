/* A pass over a shared prefix as a small GEMM (decode_bf16_prefix.h, both bf16 levels): up to
 * PA_MAX_ROWS query rows (other requests' tokens x the query heads of one kv head) against every
 * prefix key, where decode_core.h's passes score a row at a time. Per kv head the prefix's K is
 * repacked as K^T in 32-bit pairs (16 keys x 32 head dims a block: a 16 x 16 transpose of
 * pairs) and V as pairs of keys (32 keys x 16 head dims a block), the layout of an AMX B tile
 * and of vdpbf16ps's second operand alike. Q.K^T into score rows, the softmax in AVX-512
 * (decode_core.h's probs_row: bf16 probabilities over the front of each row), then P.V: on AMX
 * tiles where the level has them and the kernel may use them (decode_prefix_amx.h), else with
 * vdpbf16ps, each repacked K or V vector loaded once for several rows. Each row's softmax state
 * (unnormalized outputs, max, sum) goes out for dk_merge.
 */
#ifndef INFLIGHT_DECODE_PREFIX_PASS_H
#define INFLIGHT_DECODE_PREFIX_PASS_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"
#include "decode_core.h"
#if defined(INFLIGHT_ISA_AMX_BF16)
#include "decode_prefix_amx.h"
#endif

#define PA_MAX_ROWS 64  /* query rows a pass takes, at most: four A tiles, over one repack of the prefix */

/* floats a thread's buffers take for a pass over len keys of head_dim D: score rows, then K
 * and V tiles, then the rows' queries and a tile's outputs */
static inline int64_t pa_floats(int64_t len, int D) {
    const int64_t lp = (len + 31) & ~(int64_t)31;
    return PA_MAX_ROWS * (lp + 16) + lp * D + PA_MAX_ROWS * D / 2 + 16 * D + 64;
}

/* the prefix's keys of kv head kh (rows: their pool offsets, zero-padded to lp) into K tiles
 * kt [lp / 16][D / 32][16 pairs][16 keys] and V tiles vt [lp / 32][D / 16][16 key pairs][16
 * dims], 32-bit pairs; keys from len on zero (a zero V row keeps 0 * garbage out of the sums) */
static void pa_repack(const uint16_t* kbase, const uint16_t* vbase, const int64_t* rows, int64_t len, int64_t lp,
                      int D, uint32_t* kt, uint32_t* vt) {
    const int nv = D / 32;
    for (int64_t t0 = 0; t0 < lp; t0 += 16)
        for (int s = 0; s < nv; s++) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = t0 + j < len ? _mm512_loadu_si512(kbase + rows[t0 + j] + 32 * s) : _mm512_setzero_si512();
            transpose16_epi32(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(kt + ((t0 / 16 * nv + s) * 16 + i) * 16, r[i]);
        }
    for (int64_t t = 0; t < lp; t += 2)
        for (int s = 0; s < nv; s++) {
            const __m512i a = t < len ? _mm512_loadu_si512(vbase + rows[t] + 32 * s) : _mm512_setzero_si512();
            const __m512i b = t + 1 < len ? _mm512_loadu_si512(vbase + rows[t + 1] + 32 * s) : _mm512_setzero_si512();
            uint32_t* at = vt + ((t / 32 * (D / 16) + 2 * s) * 16 + t % 32 / 2) * 16;
            __m512i lo, hi;
            pair_rows_epi16(a, b, &lo, &hi);
            _mm512_storeu_si512(at, lo);
            _mm512_storeu_si512(at + 256, hi);  /* the next tile: head dims 16-31 of this 32 */
        }
}

#define PD_RB 8  /* score rows a register block: 8 rows x 32 keys, one K vector load for 8 products */

/* pa_scores with vdpbf16ps: the scores of the rows of row tile rt below nr (16 rows of qa, D
 * values each; qa holds PA_MAX_ROWS rows, those from nr on zero) against every key, raw into
 * sbuf (pitch floats a row) */
static void pd_scores(const uint16_t* qa, int rt, int nr, const uint32_t* kt, int64_t lp, int D, float* sbuf,
                      int64_t pitch) {
    const int nv = D / 32;
    for (int r0 = rt * 16; r0 < rt * 16 + 16 && r0 < nr; r0 += PD_RB) {
        const uint32_t* qp = (const uint32_t*)(qa + r0 * D);  /* row r0 + r's pair k: qp[r * D / 2 + k] */
        for (int64_t t0 = 0; t0 < lp; t0 += 32) {
            __m512 acc[PD_RB][2];
            for (int r = 0; r < PD_RB; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (int s = 0; s < nv; s++) {
                const uint32_t* k0 = kt + (t0 / 16 * nv + s) * 256;  /* keys t0..t0+15, dims 32s.. */
                const uint32_t* k1 = k0 + nv * 256;                  /* keys t0+16..t0+31 */
                for (int i = 0; i < 16; i++) {
                    const __m512bh ka = (__m512bh)_mm512_loadu_si512(k0 + i * 16);
                    const __m512bh kb = (__m512bh)_mm512_loadu_si512(k1 + i * 16);
                    for (int r = 0; r < PD_RB; r++) {
                        const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qp[r * D / 2 + s * 16 + i]);
                        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qb, ka);
                        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qb, kb);
                    }
                }
            }
            for (int r = 0; r < PD_RB; r++) {
                _mm512_storeu_ps(sbuf + (r0 + r) * pitch + t0, acc[r][0]);
                _mm512_storeu_ps(sbuf + (r0 + r) * pitch + t0 + 16, acc[r][1]);
            }
        }
    }
}

/* P.V of 4 rows from r0 (bf16 probabilities over the front of their sbuf rows) for head dims
 * [16 c0, 16 (c0 + W)) into o (row r0 - o_row0 first, D floats a row) */
static inline __attribute__((always_inline)) void pd_values_block(int r0, int c0, const int W, const uint32_t* vt,
                                                                  int64_t lp, int D, const float* sbuf,
                                                                  int64_t pitch, float* o) {
    const int nc = D / 16;
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < W; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < lp; t0 += 32) {
        const uint32_t* vb = vt + (t0 / 32 * nc + c0) * 256;
        for (int p = 0; p < 16; p++) {
            __m512bh v[4];
            for (int c = 0; c < W; c++) v[c] = (__m512bh)_mm512_loadu_si512(vb + c * 256 + p * 16);
            for (int r = 0; r < 4; r++) {
                const uint32_t pp = ((const uint32_t*)(sbuf + (r0 + r) * pitch))[t0 / 2 + p];  /* keys 2p, 2p+1 */
                const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)pp);
                for (int c = 0; c < W; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, v[c]);
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < W; c++) _mm512_storeu_ps(o + r * D + 16 * (c0 + c), acc[r][c]);
}

/* pa_values with vdpbf16ps: P.V of the rows of row tile rt below nr into o [16][D] */
static void pd_values(int rt, int nr, const uint32_t* vt, int64_t lp, int D, const float* sbuf, int64_t pitch,
                      float* o) {
    const int nc = D / 16;  /* even: D is a multiple of 32 */
    for (int r0 = rt * 16; r0 < rt * 16 + 16 && r0 < nr; r0 += 4) {
        float* orow = o + (r0 - rt * 16) * D;
        int c0 = 0;
        for (; c0 + 4 <= nc; c0 += 4) pd_values_block(r0, c0, 4, vt, lp, D, sbuf, pitch, orow);
        if (c0 < nc) pd_values_block(r0, c0, 2, vt, lp, D, sbuf, pitch, orow);
    }
}

/* one row tile's scores and values: on the tiles (tiles: configured) or with vdpbf16ps */
static inline void pp_scores(int tiles, const uint16_t* qa, int rt, int nr, const uint32_t* kt, int64_t lp, int D,
                             float* sbuf, int64_t pitch) {
#if defined(INFLIGHT_ISA_AMX_BF16)
    if (tiles) {
        pa_scores(qa, rt, kt, lp, D, sbuf, pitch);
        return;
    }
#endif
    (void)tiles;
    pd_scores(qa, rt, nr, kt, lp, D, sbuf, pitch);
}

static inline void pp_values(int tiles, int rt, int nr, const uint32_t* vt, int64_t lp, int D, const float* sbuf,
                             int64_t pitch, float* o) {
#if defined(INFLIGHT_ISA_AMX_BF16)
    if (tiles) {
        pa_values(rt, vt, lp, D, sbuf, pitch, o);
        return;
    }
#endif
    (void)tiles;
    pd_values(rt, nr, vt, lp, D, sbuf, pitch, o);
}

/* decode_bf16_prefix.h's pass: nq query tokens (rows q + i * q_stride) x the G
 * heads of every kv head (G * nq <= PA_MAX_ROWS) over the len keys of block table bt, every row
 * seeing every key; each
 * head's state to part + i * part_row + head * (D + 2). buf: pa_floats(len, D) floats, 64-byte
 * aligned; rows: the padded length's cache offsets. On AMX tiles where the level has them and the
 * kernel may use them, else with vdpbf16ps. */
static void prefix_pass(const uint16_t* q, int64_t q_stride, int nq, const uint16_t* k_cache,
                        const uint16_t* v_cache, const int64_t* bt, int64_t len, int G, int num_kv_heads, int D,
                        int block_size, int64_t tok_stride, float scale, float* part, int64_t part_row,
                        float* buf, int64_t* rows) {
#if defined(INFLIGHT_ISA_AMX_BF16)
    const int tiles = amx_permitted();
    if (tiles) amx_configure();
#else
    const int tiles = 0;
#endif
    const int nr = G * nq, ntiles = (nr + 15) / 16;
    const int64_t lp = (len + 31) & ~(int64_t)31, pitch = lp + 16;  /* NOTE: + 16: no row pitch of 4 KiB sets */
    float* sbuf = buf;
    uint32_t* kt = (uint32_t*)(sbuf + PA_MAX_ROWS * pitch);
    uint32_t* vt = kt + lp * D / 2;
    uint16_t* qa = (uint16_t*)(vt + lp * D / 2);
    float* o = (float*)(qa + PA_MAX_ROWS * D);
    key_rows(rows, bt, len, lp, block_size, tok_stride);
    memset(qa, 0, sizeof(uint16_t) * PA_MAX_ROWS * (size_t)D);
    for (int kh = 0; kh < num_kv_heads; kh++) {
        pa_repack(k_cache + (int64_t)kh * D, v_cache + (int64_t)kh * D, rows, len, lp, D, kt, vt);
        for (int r = 0; r < nr; r++)
            memcpy(qa + r * D, q + r / G * q_stride + (int64_t)(kh * G + r % G) * D, sizeof(uint16_t) * (size_t)D);
        for (int rt = 0; rt < ntiles; rt++) pp_scores(tiles, qa, rt, nr, kt, lp, D, sbuf, pitch);
        float mx[PA_MAX_ROWS], l[PA_MAX_ROWS];
        const __m512 vs = _mm512_set1_ps(scale);
        for (int r = 0; r < nr; r++) {
            float* sc = sbuf + r * pitch;
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (int64_t t = 0; t < len; t += 16) {  /* lanes from len on stay in the row's pitch */
                const __mmask16 m = tail_mask(len - t);
                const __m512 sv = _mm512_mul_ps(_mm512_loadu_ps(sc + t), vs);
                vmax = _mm512_mask_max_ps(vmax, m, vmax, sv);
                _mm512_storeu_ps(sc + t, sv);  /* probs_row reads none from len on */
            }
            mx[r] = _mm512_reduce_max_ps(vmax);
            l[r] = probs_row(sc, len, lp, mx[r], NULL, 0);
        }
        for (int rt = 0; rt < ntiles; rt++) {
            pp_values(tiles, rt, nr, vt, lp, D, sbuf, pitch, o);
            for (int r = rt * 16; r < nr && r < rt * 16 + 16; r++) {
                float* st = part + r / G * part_row + (int64_t)(kh * G + r % G) * (D + 2);
                memcpy(st, o + (r - rt * 16) * D, sizeof(float) * (size_t)D);
                st[D] = mx[r];
                st[D + 1] = l[r];
            }
        }
    }
#if defined(INFLIGHT_ISA_AMX_BF16)
    if (tiles) _tile_release();
#endif
}

#endif
