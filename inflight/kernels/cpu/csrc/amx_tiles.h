/*
 * Intel AMX tile set-up shared by the kernels that run TDPBF16PS (gemm_bf16_amx.h,
 * prefill_bf16_amx.h): the per-process permission Linux asks for and one tile
 * configuration, eight tiles of 16 rows x 64 bytes.
 */
#ifndef INFLIGHT_AMX_TILES_H
#define INFLIGHT_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_K 32  /* bf16 values per A tile row (64 bytes) */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Linux hands out the tile registers only to a process that asks (per process, once).
 * NOTE: call it once before threads start (each library does so at load or on entry):
 * the state below is not guarded. */
static int amx_permitted(void) {
    static int state;  /* 0: not asked yet, 1: granted, -1: refused */
    if (!state) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state > 0;
}

struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* the calling thread's tiles 0-7, each 16 rows of 64 bytes (16 fp32 or 32 bf16 a row) */
static void amx_configure(void) {
    struct amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* tiles 0-3, the four C tiles of the kernels' register blocks, to zero */
static inline void amx_zero_c(void) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

#endif
