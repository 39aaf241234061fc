/*
 * Finding a weight's low-bit form (panel_lowbit.h's layouts) from its fp32 values alone:
 * for each block of 32 inputs of an output row (16 in the K-quant form), a scale d, an
 * offset m and integer q such that d * q + m gives back every value exactly, as float32
 * computes it. Nothing trusts the GGUF's type: the loader's cache holds dequantized fp32
 * weights, and panel_lowbit.py keeps a packing only when its expansion matches the fp32
 * panels. Included by gemm_f32.c only, after panel_lowbit.h.
 */
#ifndef INFLIGHT_LOWBIT_FIT_H
#define INFLIGHT_LOWBIT_FIT_H

/* x rounded to the nearest half float (ties to even; float32's range, so no overflow) */
static float half_round(float x) {
    if (fabsf(x) < 0x1p-14f) return nearbyintf(x * 0x1p24f) * 0x1p-24f;  /* a half subnormal */
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
    memcpy(&x, &u, 4);
    return x;
}

/* x (a normal float) rounded to b significant bits, ties to even */
static float round_bits(float x, int b) {
    const int s = 24 - b;
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + (1u << (s - 1)) - 1 + ((u >> s) & 1u)) & ~((1u << s) - 1);
    memcpy(&x, &u, 4);
    return x;
}

/* the smallest and largest of n values */
static void block_range(const float* v, int n, float* lo, float* hi) {
    *lo = *hi = v[0];
    for (int k = 1; k < n; k++) *lo = v[k] < *lo ? v[k] : *lo, *hi = v[k] > *hi ? v[k] : *hi;
}

/* the largest magnitude of n values */
static float block_amax(const float* v, int n) {
    float amax = 0;
    for (int k = 0; k < n; k++) amax = fabsf(v[k]) > amax ? fabsf(v[k]) : amax;
    return amax;
}

/* 1 when each of the n values is dt * q for some q in -128..127 (q set), else 0 */
static int symmetric_try(const float* v, int n, float dt, int8_t* q) {
    for (int k = 0; k < n; k++) {
        float qk = dt != 0 ? nearbyintf(v[k] / dt) : 0;
        qk = qk < -128 ? -128 : qk > 127 ? 127 : qk;
        if (dt * qk != v[k]) return 0;
        q[k] = (int8_t)qk;
    }
    return 1;
}

/* 1 when each of the n values is dt * q + mt for some q in 0..qmax (q set), else 0 */
static int affine_try(const float* v, int n, int qmax, float dt, float mt, uint8_t* q) {
    for (int k = 0; k < n; k++) {
        float qk = dt != 0 ? nearbyintf((v[k] - mt) / dt) : 0;
        qk = qk < 0 ? 0 : qk > (float)qmax ? (float)qmax : qk;
        if (dt * qk + mt != v[k]) return 0;  /* exact product: fused or not, the same sum */
        q[k] = (uint8_t)qk;
    }
    return 1;
}

/* a block of n values as d * q + m, q in 0..qmax (15: the 4-bit form, Q4_0 / Q4_1; 31: Q5_0 /
 * Q5_1 in the K-quant form): q = 0 at one end of the block (the smallest value when d > 0, as
 * Q4_1 has it; either end in Q4_0), the other end's q qmax unless rounding lowered it, d a half
 * float. 0: found (d, m, q set). */
static int affine_fit_half(const float* v, int n, int qmax, float* d, float* m, uint8_t* q) {
    float lo, hi;
    block_range(v, n, &lo, &hi);
    for (int top = qmax; top > 0; top--)
        for (int sign = 1; sign >= -1; sign -= 2) {
            const float dt = half_round((float)sign * (hi - lo) / (float)top), mt = sign > 0 ? lo : hi;
            if (affine_try(v, n, qmax, dt, mt, q)) {
                *d = dt, *m = mt;
                return 0;
            }
        }
    return 1;
}

/* a block of a K-quant (Q4_K; Q5_K and Q2_K with qmax 31) as d * q + m, q in 0..qmax (2^b - 1):
 * d and -m are each a half float times a 6-bit integer (17 significant bits), not half floats
 * as affine_fit_half assumes, and the block's values need not reach q = 0 or qmax, so both the
 * span t of its q and its smallest q are searched. d keeps d * q exact, as the NOTE in
 * panel_lowbit.h needs. 0: found (d, m, q set). */
static int affine_fit_k(const float* v, int n, int qmax, float* d, float* m, uint8_t* q) {
    float lo, hi;
    block_range(v, n, &lo, &hi);
    for (int t = qmax; t > 0 && hi > lo; t--)
        for (int r = 0; r < 2; r++) {
            /* hi and lo are d * q + m rounded; where the rounding moved them, d and m come back
             * rounded to a K-quant scale's 17 bits */
            const float dt = r ? round_bits((hi - lo) / (float)t, 17) : (hi - lo) / (float)t;
            uint32_t bits;
            memcpy(&bits, &dt, 4);
            if (bits & (uint32_t)qmax) continue;  /* over 24 - b significant bits: d * q would round */
            for (int q0 = 0; q0 + t <= qmax; q0++) {
                const float mt = r ? round_bits(lo - dt * (float)q0, 17) : lo - dt * (float)q0;
                if (affine_try(v, n, qmax, dt, mt, q)) {
                    *d = dt, *m = mt;
                    return 0;
                }
            }
        }
    return 1;
}

/* 16 values as d * q, q in -32..32 (Q6_K's (d * scale) * q, q in -32..31): d of at most
 * 19 significant bits, so d * q is exact (panel_lowbit.h's NOTE). 0: found (d, q set). */
static int q6k_fit(const float* v, float* d, int8_t* q) {
    const float amax = block_amax(v, LB_HALF);
    for (int t = 32; t > 0; t--) {  /* the largest magnitude's |q| */
        const float dt = amax / (float)t;
        uint32_t bits;
        memcpy(&bits, &dt, 4);
        if (!(bits & 0x1Fu) && symmetric_try(v, LB_HALF, dt, q)) {
            *d = dt;
            return 0;
        }
    }
    return 1;
}

/* 16 values in the K-quant form: d * q as Q6_K, Q3_K or Q5_0 have them (m = 0), else d * q + m
 * with q in 0..31, as a 4- or 5-bit block (Q4_*, Q5_1, Q5_K) or Q2_K's has them */
static int kquant_fit(const float* v, float* d, float* m, int8_t* q) {
    uint8_t u[LB_HALF];
    *m = 0;
    if (!q6k_fit(v, d, q)) return 0;
    if (affine_fit_k(v, LB_HALF, 31, d, m, u) && affine_fit_half(v, LB_HALF, 31, d, m, u)) return 1;
    for (int k = 0; k < LB_HALF; k++) q[k] = (int8_t)u[k];
    return 0;
}

/* one block as d * q, q in -128..127 (the 8-bit form; the largest magnitude at |q| = 127) */
static int q8_fit(const float* v, float* d, int8_t* q) {
    *d = half_round(block_amax(v, LB_K) / 127.f);
    return !symmetric_try(v, LB_K, *d, q);
}

/* column j of one block (32 values at v) into the block's bytes at blk, in the form of
 * bits: 0 done, 1 where the values have no such exact form */
static int pack_column(const float* v, int bits, int64_t j, uint8_t* blk) {
    float d, m;
    if (bits == 4) {
        uint8_t q[LB_K];
        if (affine_fit_half(v, LB_K, 15, &d, &m, q) && affine_fit_k(v, LB_K, 15, &d, &m, q)) return 1;
        for (int k = 0; k < LB_K; k++) blk[8 * NR + (k / 2) * NR + j] |= (uint8_t)(q[k] << (k % 2 ? 4 : 0));
        memcpy(blk + 4 * j, &d, 4);
        memcpy(blk + 4 * (NR + j), &m, 4);
        return 0;
    }
    int8_t q[LB_K];
    if (bits == 8) {
        if (q8_fit(v, &d, q)) return 1;
        memcpy(blk + 4 * j, &d, 4);
        for (int k = 0; k < LB_K; k++) blk[4 * NR + k * NR + j] = (uint8_t)q[k];
        return 0;
    }
    for (int h = 0; h < 2; h++) {
        if (kquant_fit(v + h * LB_HALF, &d, &m, q + h * LB_HALF)) return 1;
        memcpy(blk + 4 * (h * NR + j), &d, 4);
        memcpy(blk + 4 * ((2 + h) * NR + j), &m, 4);
    }
    for (int k = 0; k < LB_K; k++) blk[16 * NR + k * NR + j] = (uint8_t)q[k];
    return 0;
}

/* w [N, K] (rows K apart) in the low-bit panels of bits (4, 6 or 8) into out (zeroed,
 * ceil(N / NR) panels): 0 when every block of 32 has that exact form, 1 where one has
 * not (out is then partly written), -2 for a bad K or width. */
int gemm_f32_lowbit_pack(const float* w, int64_t N, int64_t K, int bits, uint8_t* out) {
    if (K % LB_K || !lowbit_form(bits)) return -2;
    const int64_t bb = lowbit_block_bytes(bits), kb = K / LB_K;
    int bad = 0;
    #pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < kb && !bad; b++)
            bad |= pack_column(w + n * K + b * LB_K, bits, n % NR, out + ((n / NR) * kb + b) * bb);
    return bad;
}

#endif
