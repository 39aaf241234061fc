/* The tile products of a pass over a shared prefix on Intel AMX (decode_prefix_pass.h, the
 * amx_bf16 level): Q.K^T and P.V for a tile of 16 query rows, over decode_prefix_pass.h's
 * repacked K and V (their pair layout is that of a B tile).
 */
#ifndef INFLIGHT_DECODE_PREFIX_AMX_H
#define INFLIGHT_DECODE_PREFIX_AMX_H
#include <immintrin.h>
#include <stdint.h>

#include "amx_tiles.h"

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

#endif
