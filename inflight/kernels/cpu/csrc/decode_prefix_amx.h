/* A pass over a shared prefix on Intel AMX tiles (decode_bf16_prefix.h, the amx_bf16 level):
 * up to 64 query rows (other requests' tokens x the query heads of one kv head) against every
 * prefix key, which is a small GEMM, where decode_core.h's passes score a row at a time. Per
 * kv head: the prefix's K repacked as K^T in pairs (one 1 KB B tile per 16 keys x 32 head
 * dims: a 16 x 16 transpose of 32-bit pairs) and V as pairs of keys (one B tile per 32 keys x
 * 16 head dims); Q.K^T on the tiles into score rows, the softmax in AVX-512 (decode_core.h's
 * probs_row, bf16 probabilities over the front of each row), then P.V on the tiles. Each
 * row's softmax state (unnormalized outputs, max, sum) goes out for dk_merge.
 */
#ifndef INFLIGHT_DECODE_PREFIX_AMX_H
#define INFLIGHT_DECODE_PREFIX_AMX_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "amx_tiles.h"
#include "bf16_simd.h"
#include "decode_core.h"

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

/* the scores of row tile rt (16 rows of qa, D values each) against every key: C tiles 0-3
 * four key tiles at a time, A tile 4, B tiles 5 and 6; raw into sbuf (pitch floats a row) */
static void pa_scores(const uint16_t* qa, int rt, const uint32_t* kt, int64_t lp, int D, float* sbuf, int64_t pitch) {
    const int nv = D / 32;
    for (int64_t t0 = 0; t0 < lp; t0 += 64) {
        const int nk = lp - t0 < 64 ? (int)((lp - t0) / 16) : 4;
        amx_zero_c();
        for (int s = 0; s < nv; s++) {
            _tile_loadd(4, qa + rt * 16 * D + 32 * s, D * 2);
            _tile_loadd(5, kt + ((t0 / 16 * nv + s) * 16) * 16, 64);
            _tile_dpbf16ps(0, 4, 5);
            if (nk > 1) {
                _tile_loadd(6, kt + (((t0 / 16 + 1) * nv + s) * 16) * 16, 64);
                _tile_dpbf16ps(1, 4, 6);
            }
            if (nk > 2) {
                _tile_loadd(5, kt + (((t0 / 16 + 2) * nv + s) * 16) * 16, 64);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (nk > 3) {
                _tile_loadd(6, kt + (((t0 / 16 + 3) * nv + s) * 16) * 16, 64);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
        float* at = sbuf + rt * 16 * pitch + t0;
        _tile_stored(0, at, pitch * 4);
        if (nk > 1) _tile_stored(1, at + 16, pitch * 4);
        if (nk > 2) _tile_stored(2, at + 32, pitch * 4);
        if (nk > 3) _tile_stored(3, at + 48, pitch * 4);
    }
}

/* P.V of row tile rt (bf16 probabilities over the front of its sbuf rows) into o [16][D]:
 * four C tiles of 16 head dims at a time, A tile 4, B tiles 5 and 6 */
static void pa_values(int rt, const uint32_t* vt, int64_t lp, int D, const float* sbuf, int64_t pitch, float* o) {
    for (int c0 = 0; c0 < D / 16; c0 += 4) {
        const int nc = D / 16 - c0 < 4 ? D / 16 - c0 : 4;
        amx_zero_c();
        for (int64_t t0 = 0; t0 < lp; t0 += 32) {
            _tile_loadd(4, (const uint16_t*)(sbuf + rt * 16 * pitch) + t0, pitch * 4);
            const uint32_t* vb = vt + (t0 / 32 * (D / 16) + c0) * 256;
            _tile_loadd(5, vb, 64);
            _tile_dpbf16ps(0, 4, 5);
            if (nc > 1) {
                _tile_loadd(6, vb + 256, 64);
                _tile_dpbf16ps(1, 4, 6);
            }
            if (nc > 2) {
                _tile_loadd(5, vb + 512, 64);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (nc > 3) {
                _tile_loadd(6, vb + 768, 64);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
        _tile_stored(0, o + 16 * c0, D * 4);
        if (nc > 1) _tile_stored(1, o + 16 * (c0 + 1), D * 4);
        if (nc > 2) _tile_stored(2, o + 16 * (c0 + 2), D * 4);
        if (nc > 3) _tile_stored(3, o + 16 * (c0 + 3), D * 4);
    }
}

/* decode_bf16_prefix.h's pass on the tiles: nq query tokens (rows q + i * q_stride) x the G
 * heads of every kv head (G * nq <= PA_MAX_ROWS) over the len keys of block table bt, every row
 * seeing every key; each
 * head's state to part + i * part_row + head * (D + 2). buf: pa_floats(len, D) floats, 64-byte
 * aligned; rows: the padded length's cache offsets. Returns -1 (nothing done) without the
 * kernel's permission for the tiles. */
static int prefix_pass_amx(const uint16_t* q, int64_t q_stride, int nq, const uint16_t* k_cache,
                           const uint16_t* v_cache, const int64_t* bt, int64_t len, int G, int num_kv_heads, int D,
                           int block_size, int64_t tok_stride, float scale, float* part, int64_t part_row,
                           float* buf, int64_t* rows) {
    if (!amx_permitted()) return -1;
    const int nr = G * nq, ntiles = (nr + 15) / 16;
    const int64_t lp = (len + 31) & ~(int64_t)31, pitch = lp + 16;  /* NOTE: + 16: no row pitch of 4 KiB sets */
    float* sbuf = buf;
    uint32_t* kt = (uint32_t*)(sbuf + PA_MAX_ROWS * pitch);
    uint32_t* vt = kt + lp * D / 2;
    uint16_t* qa = (uint16_t*)(vt + lp * D / 2);
    float* o = (float*)(qa + PA_MAX_ROWS * D);
    key_rows(rows, bt, len, lp, block_size, tok_stride);
    memset(qa, 0, sizeof(uint16_t) * PA_MAX_ROWS * (size_t)D);
    amx_configure();
    for (int kh = 0; kh < num_kv_heads; kh++) {
        pa_repack(k_cache + (int64_t)kh * D, v_cache + (int64_t)kh * D, rows, len, lp, D, kt, vt);
        for (int r = 0; r < nr; r++)
            memcpy(qa + r * D, q + r / G * q_stride + (int64_t)(kh * G + r % G) * D, sizeof(uint16_t) * (size_t)D);
        for (int rt = 0; rt < ntiles; rt++) pa_scores(qa, rt, kt, lp, D, sbuf, pitch);
        float mx[PA_MAX_ROWS], l[PA_MAX_ROWS];
        const __m512 vs = _mm512_set1_ps(scale);
        for (int r = 0; r < nr; r++) {
            float* sc = sbuf + r * pitch;
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (int64_t t = 0; t < len; t += 16) {
                const __mmask16 m = tail_mask(len - t);
                const __m512 sv = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + t), vs);
                vmax = _mm512_mask_max_ps(vmax, m, vmax, sv);
                _mm512_mask_storeu_ps(sc + t, m, sv);
            }
            mx[r] = _mm512_reduce_max_ps(vmax);
            l[r] = probs_row(sc, len, lp, mx[r], NULL, 0);
        }
        for (int rt = 0; rt < ntiles; rt++) {
            pa_values(rt, vt, lp, D, sbuf, pitch, o);
            for (int r = rt * 16; r < nr && r < rt * 16 + 16; r++) {
                float* st = part + r / G * part_row + (int64_t)(kh * G + r % G) * (D + 2);
                memcpy(st, o + (r - rt * 16) * D, sizeof(float) * (size_t)D);
                st[D] = mx[r];
                st[D + 1] = l[r];
            }
        }
    }
    _tile_release();
    return 0;
}

#endif
