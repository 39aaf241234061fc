/* A stand-alone check of the fp32 CPU kernels (inflight/kernels/cpu/csrc) against
 * plain scalar C references with double accumulation, for one ISA level: built with
 * that level's flags (build.py's compile_flags, minus -shared/-fPIC) together with the
 * kernel sources, linked into one executable (static for aarch64, so it runs under
 * qemu-user without a sysroot). tests/test_kernels_aarch64.py builds and runs it
 * natively for every x86 level the CPU runs and under qemu-aarch64 for neon and
 * aarch64 scalar.
 *
 * Output: one line per check ("ok" / "FAIL" / "SKIP" with the worst error seen),
 * then "N passed, M failed, K skipped"; the exit status is 1 when anything failed.
 * A kernel whose source is not linked is a weak NULL symbol (kernels.h): skipped.
 *
 * Usage: kernel_check [-v]   (-v: print the passing checks too)
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "vec.h"

static int n_pass, n_fail, n_skip, verbose;

static void result(int ok, const char* name, const char* fmt, ...) {
    ok ? n_pass++ : n_fail++;
    if (ok && !verbose) return;
    printf("%s %s: ", ok ? "ok  " : "FAIL", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static int present(const void* fn, const char* name) {
    if (fn) return 1;
    n_skip++;
    printf("SKIP %s: not in the linked kernel sources\n", name);
    return 0;
}

/* ---- deterministic inputs ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* uniform in [-1, 1) */
static float rnd(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

static int rnd_int(int lo, int hi) { return lo + (int)(rnd_u32() % (uint32_t)(hi - lo + 1)); }

static float* frand(int64_t n, float amp) {
    float* p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = amp * rnd();
    return p;
}

/* max |got - want| / (atol + rtol |want|) over n values: <= 1 passes */
static double err_ratio(const float* got, const double* want, int64_t n, double atol, double rtol, double* worst_abs) {
    if (worst_abs) *worst_abs = INFINITY;
    double r = 0, wa = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        if (!(d == d)) return INFINITY; /* NaN */
        const double q = d / (atol + rtol * fabs(want[i]));
        r = q > r ? q : r;
        wa = d > wa ? d : wa;
    }
    if (worst_abs) *worst_abs = wa;
    return r;
}

/* ---- vec.h primitives ---- */

static double exp_err(float x, float got) {
    /* relative error for normal results; results below FLT_MIN are subnormal, where
     * the spacing is 2^-149 and one rounding costs up to half of it */
    const double want = exp((double)x);
    const double d = fabs((double)got - want);
    return want >= FLT_MIN ? d / want : d / (want * 1e-6 + ldexp(1.0, -149));
}

static void check_vec_exp(void) {
    float in[VL], out[VL];
    double worst = 0, worst_sub = 0;
    float worst_x = 0;
    /* a dense sweep of [-103.9, 88], then random points */
    for (int64_t i = 0; i < 400000; i += VL) {
        for (int l = 0; l < VL; l++) {
            const int64_t k = i + l;
            in[l] = k < 200000 ? -103.9f + (float)k * (191.9f / 200000.f) : 191.9f * (rnd() + 1.f) / 2.f - 103.9f;
        }
        vf_store(out, vf_exp(vf_load(in)));
        for (int l = 0; l < VL; l++) {
            const double e = exp_err(in[l], out[l]);
            if (exp((double)in[l]) >= FLT_MIN) {
                if (e > worst) { worst = e; worst_x = in[l]; }
            } else if (e > worst_sub) {
                worst_sub = e;
            }
        }
    }
    result(worst < 3e-7, "vf_exp relative error on [-87.3, 88]", "max %.3g at x=%.6g (limit 3e-7)", worst, worst_x);
    result(worst_sub <= 1.0, "vf_exp subnormal results on [-103.9, -87.3]",
           "max err / (2^-149 + 1e-6 |exp|) = %.3g (limit 1)", worst_sub);
    /* documented edges: below -104 (and -inf) 0, e^0 = 1 exactly, above 88 saturates, finite */
    const float edge[8] = {-INFINITY, -1000.f, -104.5f, 0.f, 88.f, 100.f, INFINITY, 1.f};
    float ein[VL], eout[VL];
    int ok = 1;
    for (int i = 0; i < 8; i += VL < 8 ? VL : 8) {
        const int n = 8 - i < VL ? 8 - i : VL;
        for (int l = 0; l < VL; l++) ein[l] = edge[i + (l < n ? l : 0)];
        vf_store(eout, vf_exp(vf_load(ein)));
        for (int l = 0; l < n; l++) {
            const float x = ein[l], y = eout[l];
            if (x < -104.f) ok &= y == 0.f;
            else if (x == 0.f) ok &= y == 1.f;
            else if (x >= 88.f) ok &= isfinite(y) && y > 1e38f;
            if (!ok) {
                result(0, "vf_exp edges", "vf_exp(%g) = %g", x, y);
                return;
            }
        }
    }
    result(1, "vf_exp edges", "-inf, < -104 -> 0; 0 -> 1; >= 88 finite and saturated");
}

static void check_vec_silu(void) {
    float in[VL], out[VL];
    double worst = 0;
    for (int i = 0; i < 20000; i += VL) {
        for (int l = 0; l < VL; l++) in[l] = 80.f * rnd();
        vf_store(out, vf_silu(vf_load(in)));
        for (int l = 0; l < VL; l++) {
            const double x = in[l], want = x / (1.0 + exp(-x));
            const double e = fabs(out[l] - want) / (fabs(want) + 1e-30);
            worst = e > worst ? e : worst;
        }
    }
    result(worst < 1e-6, "vf_silu relative error on [-80, 80]", "max %.3g (limit 1e-6)", worst);
}

static void check_vec_reductions(void) {
    float a[VL];
    /* exact on integers; within log2(VL) roundings of the double sum otherwise */
    int exact = 1;
    double worst = 0;
    for (int it = 0; it < 2000; it++) {
        double want = 0, mag = 0;
        for (int l = 0; l < VL; l++) {
            a[l] = (float)rnd_int(-1000, 1000);
            want += a[l];
        }
        exact &= (double)vf_reduce_add(vf_load(a)) == want;
        want = 0;
        for (int l = 0; l < VL; l++) {
            a[l] = ldexpf(rnd(), rnd_int(-8, 8));
            want += a[l];
            mag += fabs(a[l]);
        }
        const double e = fabs(vf_reduce_add(vf_load(a)) - want) / (mag * FLT_EPSILON * 4);
        worst = e > worst ? e : worst;
    }
    result(exact, "vf_reduce_add exact on integers", "VL=%d", VL);
    result(worst <= 1.0, "vf_reduce_add rounding", "max err / (4 eps sum|a|) = %.3g (limit 1)", worst);
    /* the max at every lane, all-negative vectors, -inf lanes */
    int ok = 1;
    for (int pos = 0; pos < VL; pos++)
        for (int sign = 0; sign < 2; sign++) {
            for (int l = 0; l < VL; l++) a[l] = sign ? -100.f - (float)l : (l % 2 ? -INFINITY : (float)l - 50.f);
            a[pos] = sign ? -1.5f : 77.f;
            ok &= vf_reduce_max(vf_load(a)) == (sign ? -1.5f : 77.f);
        }
    result(ok, "vf_reduce_max", "max at each lane, negative, -inf lanes");
}

static void check_vec_lanes(void) {
    float a[VL], b[VL], c[VL], r[VL];
    int ok_fma = 1, ok_mm = 1;
    for (int it = 0; it < 1000; it++) {
        for (int l = 0; l < VL; l++) { a[l] = rnd(); b[l] = rnd(); c[l] = rnd(); }
        vf_store(r, vf_fma(vf_load(a), vf_load(b), vf_load(c)));
        for (int l = 0; l < VL; l++)  /* fused or not: within one rounding of the exact value */
            ok_fma &= fabs(r[l] - ((double)a[l] * b[l] + c[l])) <= 2 * FLT_EPSILON;
        vf_store(r, vf_max(vf_load(a), vf_load(b)));
        for (int l = 0; l < VL; l++) ok_mm &= r[l] == (a[l] > b[l] ? a[l] : b[l]);
        vf_store(r, vf_min(vf_load(a), vf_load(b)));
        for (int l = 0; l < VL; l++) ok_mm &= r[l] == (a[l] < b[l] ? a[l] : b[l]);
    }
    result(ok_fma, "vf_fma", "a*b+c within 2 eps");
    result(ok_mm, "vf_max / vf_min", "per lane");
    /* round: ties to even */
    const float rin[8] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.49f, 3.7f, -1e6f - 0.5f};
    const float rout[8] = {0.f, 2.f, 2.f, 0.f, -2.f, -2.f, 4.f, -1e6f};
    int ok_round = 1;
    for (int i = 0; i < 8; i += VL < 8 ? VL : 8) {
        const int n = 8 - i < VL ? 8 - i : VL;
        for (int l = 0; l < VL; l++) a[l] = rin[i + (l < n ? l : 0)];
        vf_store(r, vf_round(vf_load(a)));
        for (int l = 0; l < n; l++) ok_round &= r[l] == rout[i + l];
    }
    result(ok_round, "vf_round", "to nearest, ties to even");
    /* partial loads and stores: lanes past n are 0 on load and untouched on store */
    float src[2 * VL], dst[2 * VL];
    int ok_tail = 1;
    for (int i = 0; i < 2 * VL; i++) src[i] = (float)(i + 1);
    for (int n = 0; n <= VL; n++) {
        vf_store(r, vf_load_n(src, n));
        for (int l = 0; l < VL; l++) ok_tail &= r[l] == (l < n ? src[l] : 0.f);
        for (int i = 0; i < 2 * VL; i++) dst[i] = -7.f;
        vf_store_n(dst, vf_load(src), n);
        for (int i = 0; i < 2 * VL; i++) ok_tail &= dst[i] == (i < n ? src[i] : -7.f);
    }
    result(ok_tail, "vf_load_n / vf_store_n", "n = 0..VL");
    /* bf16 widening is exact */
    uint16_t h[VL];
    int ok_bf16 = 1;
    for (int it = 0; it < 100; it++) {
        for (int l = 0; l < VL; l++) h[l] = (uint16_t)(rnd_u32() & 0x7F7F) | (uint16_t)(rnd_u32() & 0x8000);
        vf_store(r, vf_load_bf16(h));
        for (int l = 0; l < VL; l++) {
            uint32_t u;
            memcpy(&u, &r[l], sizeof u);
            ok_bf16 &= u == (uint32_t)h[l] << 16;
        }
    }
    result(ok_bf16, "vf_load_bf16", "exact widening");
}

/* ---- paged attention ---- */

/* A block pool with each sequence's blocks at shuffled places. */
struct pool {
    int num_blocks, block_size, nkv, hd;
    int64_t bt_stride;
    float *k, *v;
    int64_t* bt;
};

static struct pool make_pool(int num_seqs, const int64_t* lens, int block_size, int nkv, int hd) {
    struct pool p = {0, block_size, nkv, hd, 0, NULL, NULL, NULL};
    int64_t maxb = 1;
    for (int s = 0; s < num_seqs; s++) {
        const int64_t b = (lens[s] + block_size - 1) / block_size;
        p.num_blocks += (int)b;
        maxb = b > maxb ? b : maxb;
    }
    p.num_blocks += 3;  /* a few blocks nobody owns */
    p.bt_stride = maxb + 1;
    const int64_t elems = (int64_t)p.num_blocks * block_size * nkv * hd;
    p.k = frand(elems, 1.f);
    p.v = frand(elems, 1.f);
    int* perm = malloc(sizeof(int) * (size_t)p.num_blocks);
    for (int i = 0; i < p.num_blocks; i++) perm[i] = i;
    for (int i = p.num_blocks - 1; i > 0; i--) {
        const int j = (int)(rnd_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    p.bt = malloc(sizeof(int64_t) * (size_t)(num_seqs * p.bt_stride));
    for (int64_t i = 0; i < num_seqs * p.bt_stride; i++) p.bt[i] = -1;  /* unused entries */
    for (int s = 0, next = 0; s < num_seqs; s++)
        for (int64_t b = 0; b < (lens[s] + block_size - 1) / block_size; b++) p.bt[s * p.bt_stride + b] = perm[next++];
    free(perm);
    return p;
}

static void free_pool(struct pool* p) {
    free(p->k);
    free(p->v);
    free(p->bt);
}

static const float* pool_row(const struct pool* p, const float* cache, int s, int64_t t, int kh) {
    const int64_t blk = p->bt[s * p->bt_stride + t / p->block_size];
    return cache + ((blk * p->block_size + t % p->block_size) * p->nkv + kh) * p->hd;
}

/* out[hd] = softmax(scale q . K[lo:n]) V[lo:n] over sequence s's cache, in double */
static void ref_attend_from(const struct pool* p, int s, int kh, const float* q, int64_t lo, int64_t n, float scale,
                            double* out) {
    double* sc = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double mx = -INFINITY, sum = 0;
    for (int64_t t = lo; t < n; t++) {
        const float* k = pool_row(p, p->k, s, t, kh);
        double d = 0;
        for (int i = 0; i < p->hd; i++) d += (double)q[i] * k[i];
        sc[t] = d * scale;
        mx = sc[t] > mx ? sc[t] : mx;
    }
    for (int i = 0; i < p->hd; i++) out[i] = 0;
    for (int64_t t = lo; t < n; t++) {
        const double w = exp(sc[t] - mx);
        sum += w;
        const float* v = pool_row(p, p->v, s, t, kh);
        for (int i = 0; i < p->hd; i++) out[i] += w * v[i];
    }
    for (int i = 0; i < p->hd; i++) out[i] /= sum;
    free(sc);
}

static void ref_attend(const struct pool* p, int s, int kh, const float* q, int64_t n, float scale, double* out) {
    ref_attend_from(p, s, kh, q, 0, n, scale, out);
}

struct attn_case {
    int num_seqs, nh, nkv, hd, block_size, max_len;
    float q_amp;  /* larger: peakier softmax */
};

/* paged_decode_f32 on pool p (one query row per sequence, lens[s] keys each) against
 * ref_attend in double; reports under `name` */
static void decode_against_reference(const struct pool* p, const int64_t* lens, int num_seqs, int nh, float q_amp,
                                     int max_len, const char* name) {
    const int nkv = p->nkv, hd = p->hd;
    const int64_t row = (int64_t)nh * hd, q_stride = row + 2 * (int64_t)nkv * hd;  /* a qkv view */
    float* q = frand(num_seqs * q_stride, q_amp);
    float* out = malloc(sizeof(float) * (size_t)(num_seqs * row));
    double* want = malloc(sizeof(double) * (size_t)(num_seqs * row));
    const float scale = 1.f / sqrtf((float)hd);
    for (int s = 0; s < num_seqs; s++)
        for (int h = 0; h < nh; h++)
            ref_attend(p, s, h / (nh / nkv), q + s * q_stride + (int64_t)h * hd, lens[s], scale,
                       want + s * row + (int64_t)h * hd);
    paged_decode_f32(q, q_stride, p->k, p->v, p->bt, p->bt_stride, lens, out, num_seqs, nh, nkv, hd, p->block_size,
                     scale, max_len);
    double wa;
    const double r = err_ratio(out, want, num_seqs * row, 2e-6, 2e-5, &wa);
    result(r <= 1, name, "max abs err %.3g (atol 2e-6 + rtol 2e-5)", wa);
    free(q);
    free(out);
    free(want);
}

static void check_paged_decode(void) {
    if (!present((const void*)paged_decode_f32, "paged_decode_f32")) return;
    const struct attn_case cases[] = {
        {3, 4, 4, 64, 16, 70, 1.f},     /* MHA */
        {5, 8, 2, 128, 16, 300, 2.f},   /* GQA, G = 4 */
        {4, 12, 4, 64, 32, 200, 4.f},   /* G = 3, larger blocks */
        {2, 16, 1, 96, 16, 90, 1.f},    /* G = 16 (MQA), head_dim not a power of two */
        {1, 2, 1, 256, 8, 520, 8.f},    /* head_dim 256, one long sequence */
        {7, 6, 6, 32, 16, 40, 1.f},     /* many short sequences */
        {2, 4, 2, 80, 16, 33, 1.f},     /* head_dim 80: not a multiple of 16 lanes */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct attn_case k = cases[c];
        int64_t* lens = malloc(sizeof(int64_t) * (size_t)k.num_seqs);
        for (int s = 0; s < k.num_seqs; s++) lens[s] = rnd_int(1, k.max_len);
        lens[0] = k.max_len;
        if (k.num_seqs > 1) lens[1] = 1;
        if (k.num_seqs > 2) lens[2] = k.block_size;  /* exactly one full block */
        struct pool p = make_pool(k.num_seqs, lens, k.block_size, k.nkv, k.hd);
        char name[128];
        snprintf(name, sizeof name, "paged_decode_f32 seqs=%d heads=%d/%d d=%d bs=%d max_len=%d", k.num_seqs, k.nh,
                 k.nkv, k.hd, k.block_size, k.max_len);
        decode_against_reference(&p, lens, k.num_seqs, k.nh, k.q_amp, k.max_len, name);
        free(lens);
        free_pool(&p);
    }
}

/* Decode steps whose requests share cached prefix blocks (the same block ids at the start
 * of their tables, as prefix caching hands them out): the kernel then scores the shared
 * keys once for the whole group (cascade attention) and merges each request's own keys. */
static void check_paged_decode_shared_prefix(void) {
    if (!present((const void*)paged_decode_f32, "paged_decode_f32")) return;
    struct scase {
        int num_seqs, n_shared, nh, nkv, hd, block_size, shared_blocks, short_member;
    };
    const struct scase cases[] = {
        {26, 24, 9, 3, 64, 16, 6, 1},    /* G = 3: two chunks, two requests outside the group, one member
                                            shorter than the shared blocks (the group shares less) */
        {34, 34, 4, 4, 32, 16, 5, 0},    /* G = 1 (MHA): 32 requests at least */
        {20, 20, 16, 2, 80, 32, 3, 0},   /* G = 8: three chunks of <= 8 requests, (request, kv head) items;
                                            head_dim 80 */
        {10, 10, 9, 3, 64, 16, 5, 0},    /* too few requests for a wide item: no cascade */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct scase k = cases[c];
        const int64_t shared_len = (int64_t)k.shared_blocks * k.block_size;
        int64_t* lens = malloc(sizeof(int64_t) * (size_t)k.num_seqs);
        for (int s = 0; s < k.num_seqs; s++) lens[s] = shared_len + rnd_int(1, 3 * k.block_size);
        lens[1] = shared_len + 1;  /* only the new token past the prefix */
        if (k.short_member) lens[2] = shared_len - k.block_size - 5;
        struct pool p = make_pool(k.num_seqs, lens, k.block_size, k.nkv, k.hd);
        for (int s = 1; s < k.n_shared; s++)  /* the group's first blocks are request 0's */
            for (int64_t b = 0; b < k.shared_blocks && b * k.block_size < lens[s]; b++)
                p.bt[s * p.bt_stride + b] = p.bt[b];
        char name[160];
        snprintf(name, sizeof name, "paged_decode_f32 shared prefix seqs=%d/%d heads=%d/%d d=%d bs=%d blocks=%d%s",
                 k.n_shared, k.num_seqs, k.nh, k.nkv, k.hd, k.block_size, k.shared_blocks,
                 k.short_member ? " (a short member)" : "");
        decode_against_reference(&p, lens, k.num_seqs, k.nh, 2.f, (int)(shared_len + 3 * k.block_size), name);
        free(lens);
        free_pool(&p);
    }
}

/* e4m3 (the fp8 KV pools' codes, kv_fp8.h) decoded by its definition, in double */
static double fp8_value(uint8_t b) {
    const int e = b >> 3 & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return b & 0x80 ? -v : v;
}

#define FP8_ROW(D) ((D) + ((D) & 1) + 2)  /* a (token, kv head) row: codes, then a bf16 scale */

/* The rows of a float32 pool quantized by write_kv_rows_f32_fp8 into *kq / *vq, and the
 * values they hold decoded into q (a pool of the same tables): every value within 2^-4 of
 * its row's largest magnitude (3 mantissa bits) */
static int quantize_pool(const struct pool* p, struct pool* q, uint8_t** kq, uint8_t** vq) {
    const int64_t slots = (int64_t)p->num_blocks * p->block_size, row = (int64_t)p->nkv * p->hd;
    const int64_t qrow = (int64_t)p->nkv * FP8_ROW(p->hd);
    int64_t* ids = malloc(sizeof(int64_t) * (size_t)slots);
    for (int64_t i = 0; i < slots; i++) ids[i] = i;
    *kq = malloc((size_t)(slots * qrow));
    *vq = malloc((size_t)(slots * qrow));
    write_kv_rows_f32_fp8((const char*)p->k, row * 4, (const char*)p->v, row * 4, (char*)*kq, (char*)*vq, ids, slots,
                          row * 4, p->hd);
    *q = *p;
    q->k = malloc(sizeof(float) * (size_t)(slots * row));
    q->v = malloc(sizeof(float) * (size_t)(slots * row));
    int ok = 1;
    for (int w = 0; w < 2; w++) {
        const float* src = w ? p->v : p->k;
        const uint8_t* codes = w ? *vq : *kq;
        float* dst = w ? q->v : q->k;
        for (int64_t r = 0; r < slots * p->nkv; r++) {
            const uint8_t* c = codes + r * FP8_ROW(p->hd);
            uint16_t s16;
            memcpy(&s16, c + FP8_ROW(p->hd) - 2, 2);
            const uint32_t bits = (uint32_t)s16 << 16;
            float scale, amax = 0;
            memcpy(&scale, &bits, 4);
            for (int d = 0; d < p->hd; d++) amax = fmaxf(amax, fabsf(src[r * p->hd + d]));
            for (int d = 0; d < p->hd; d++) {
                dst[r * p->hd + d] = (float)(fp8_value(c[d]) * scale);
                ok &= fabs(dst[r * p->hd + d] - src[r * p->hd + d]) <= amax / 16;
            }
        }
    }
    free(ids);
    return ok;
}

/* paged_decode_f32_kvfp8 over pools that write_kv_rows_f32_fp8 quantized, against the
 * reference over the values those pools hold */
static void check_paged_decode_fp8(void) {
    if (!present((const void*)paged_decode_f32_kvfp8, "paged_decode_f32_kvfp8")
        || !present((const void*)write_kv_rows_f32_fp8, "write_kv_rows_f32_fp8")) return;
    const struct attn_case cases[] = {
        {5, 9, 3, 64, 16, 300, 2.f},    /* SmolLM2's heads: whole rows an item */
        {3, 8, 8, 64, 16, 90, 1.f},     /* rows past the tile buffers: a kv head an item */
        {2, 4, 1, 36, 5, 70, 1.f},      /* head_dim 36: codes past whole vectors */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct attn_case k = cases[c];
        int64_t* lens = malloc(sizeof(int64_t) * (size_t)k.num_seqs);
        for (int s = 0; s < k.num_seqs; s++) lens[s] = rnd_int(1, k.max_len);
        lens[0] = k.max_len;
        struct pool p = make_pool(k.num_seqs, lens, k.block_size, k.nkv, k.hd), deq;
        uint8_t* kq, * vq;
        char name[128];
        snprintf(name, sizeof name, "write_kv_rows_f32_fp8 heads=%d d=%d within 2^-4 of each row's largest", k.nkv,
                 k.hd);
        result(quantize_pool(&p, &deq, &kq, &vq), name, "quantized");
        /* the reference reads deq's values; the kernel the codes behind them */
        float* fk = deq.k, * fv = deq.v;
        deq.k = (float*)(void*)kq;
        deq.v = (float*)(void*)vq;
        const int nkv = k.nkv, hd = k.hd;
        const int64_t row = (int64_t)k.nh * hd;
        float* q = frand(k.num_seqs * row, k.q_amp);
        float* out = malloc(sizeof(float) * (size_t)(k.num_seqs * row));
        double* want = malloc(sizeof(double) * (size_t)(k.num_seqs * row));
        const float scale = 1.f / sqrtf((float)hd);
        struct pool ref = deq;
        ref.k = fk;
        ref.v = fv;
        for (int s = 0; s < k.num_seqs; s++)
            for (int h = 0; h < k.nh; h++)
                ref_attend(&ref, s, h / (k.nh / nkv), q + s * row + (int64_t)h * hd, lens[s], scale,
                           want + s * row + (int64_t)h * hd);
        paged_decode_f32_kvfp8(q, row, deq.k, deq.v, p.bt, p.bt_stride, lens, out, k.num_seqs, k.nh, nkv, hd,
                               k.block_size, scale, k.max_len);
        double wa;
        const double r = err_ratio(out, want, k.num_seqs * row, 2e-6, 2e-5, &wa);
        snprintf(name, sizeof name, "paged_decode_f32_kvfp8 seqs=%d heads=%d/%d d=%d bs=%d", k.num_seqs, k.nh, nkv,
                 hd, k.block_size);
        result(r <= 1, name, "max abs err %.3g (atol 2e-6 + rtol 2e-5)", wa);
        free(q);
        free(out);
        free(want);
        free(fk);
        free(fv);
        free(kq);
        free(vq);
        free(lens);
        free_pool(&p);
    }
}

static void check_paged_prefill(void) {
    if (!present((const void*)paged_prefill_f32, "paged_prefill_f32")) return;
    struct pcase {
        int num_reqs, nh, nkv, hd, block_size;
        int64_t q_len[4], ctx[4];  /* ctx: cached tokens before the chunk */
        float q_amp;
    };
    const struct pcase cases[] = {
        {3, 4, 4, 64, 16, {5, 70, 1}, {0, 30, 100}, 1.f},             /* MHA: a fresh prompt, chunks after a cache */
        {2, 8, 2, 128, 16, {40, 17}, {0, 64}, 2.f},                   /* GQA, G = 4: 16 tokens per work item */
        {4, 12, 4, 64, 32, {9, 1, 33, 100}, {50, 7, 0, 20}, 4.f},    /* G = 3 */
        {1, 16, 2, 80, 16, {20}, {45}, 1.f},                          /* G = 8, head_dim 80 */
        {2, 2, 1, 256, 8, {12, 3}, {150, 0}, 8.f},                    /* head_dim 256 */
        {2, 6, 6, 32, 16, {130, 2}, {0, 300}, 1.f},                   /* > AF_MAX_ROWS tokens in one request */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct pcase k = cases[c];
        int64_t q_start[4], q_len[4], seq_len[4], tokens = 0;
        for (int r = 0; r < k.num_reqs; r++) {
            q_start[r] = tokens;
            q_len[r] = k.q_len[r];
            seq_len[r] = k.ctx[r] + k.q_len[r];
            tokens += q_len[r];
        }
        struct pool p = make_pool(k.num_reqs, seq_len, k.block_size, k.nkv, k.hd);
        const int G = k.nh / k.nkv;
        const int64_t row = (int64_t)k.nh * k.hd, q_stride = row + 2 * (int64_t)k.nkv * k.hd;
        float* q = frand(tokens * q_stride, k.q_amp);
        float* out = malloc(sizeof(float) * (size_t)(tokens * row));
        double* want = malloc(sizeof(double) * (size_t)(tokens * row));
        const float scale = 1.f / sqrtf((float)k.hd);
        for (int r = 0; r < k.num_reqs; r++)
            for (int64_t i = 0; i < q_len[r]; i++)
                for (int h = 0; h < k.nh; h++)  /* token i sits at ctx + i and sees keys [0, ctx + i] */
                    ref_attend(&p, r, h / G, q + (q_start[r] + i) * q_stride + (int64_t)h * k.hd, k.ctx[r] + i + 1,
                               scale, want + (q_start[r] + i) * row + (int64_t)h * k.hd);
        char name[160];
        snprintf(name, sizeof name, "paged_prefill_f32 reqs=%d heads=%d/%d d=%d bs=%d tokens=%lld", k.num_reqs, k.nh,
                 k.nkv, k.hd, k.block_size, (long long)tokens);
        if (paged_prefill_f32_supported && !paged_prefill_f32_supported(k.hd, G)) {
            result(0, name, "paged_prefill_f32_supported(%d, %d) = 0", k.hd, G);
        } else {
            const int rc = paged_prefill_f32(q, q_stride, p.k, p.v, p.bt, p.bt_stride, q_start, q_len, seq_len, out,
                                             k.num_reqs, k.nh, k.nkv, k.hd, k.block_size, scale, NULL);
            double wa = 0;
            const double e = rc == 0 ? err_ratio(out, want, tokens * row, 2e-6, 2e-5, &wa) : INFINITY;
            result(rc == 0 && e <= 1, name, "rc %d, max abs err %.3g (atol 2e-6 + rtol 2e-5)", rc, wa);
        }
        free(q);
        free(out);
        free(want);
        free_pool(&p);
    }
    if (paged_prefill_f32_supported)
        result(!paged_prefill_f32_supported(300, 1) && paged_prefill_f32_supported(128, 8),
               "paged_prefill_f32_supported", "head_dim 300 refused, 128 x G 8 taken");
}

/* Sliding window W: the token at position t sees keys (t - W, t]. The blocks wholly before
 * each request's first window are filled with NaN: a kernel that reads them fails. */
static void check_sliding_window(void) {
    if (!present((const void*)paged_prefill_f32_sw, "paged_prefill_f32_sw")
        || !present((const void*)paged_decode_f32_sw, "paged_decode_f32_sw")) return;
    const int nh = 8, nkv = 2, hd = 80, bs = 16, G = nh / nkv, nreq = 4;
    const int64_t ctx[4] = {0, 100, 300, 64}, qn[4] = {90, 40, 1, 3};
    const int windows[3] = {1, 37, 100};
    for (int w = 0; w < 3; w++) {
        const int W = windows[w];
        int64_t q_start[4], seq_len[4], tokens = 0;
        for (int r = 0; r < nreq; r++) {
            q_start[r] = tokens;
            seq_len[r] = ctx[r] + qn[r];
            tokens += qn[r];
        }
        struct pool p = make_pool(nreq, seq_len, bs, nkv, hd);
        for (int r = 0; r < nreq; r++) {
            const int64_t skip = (ctx[r] - W + 1 > 0 ? ctx[r] - W + 1 : 0) / bs;
            for (int64_t b = 0; b < skip; b++) {
                const int64_t off = p.bt[r * p.bt_stride + b] * bs * nkv * hd;
                for (int64_t i = 0; i < (int64_t)bs * nkv * hd; i++) p.k[off + i] = p.v[off + i] = NAN;
            }
        }
        const int64_t row = (int64_t)nh * hd, q_stride = row + 2 * (int64_t)nkv * hd;
        float* q = frand(tokens * q_stride, 2.f);
        float* out = malloc(sizeof(float) * (size_t)(tokens * row));
        double* want = malloc(sizeof(double) * (size_t)(tokens * row));
        const float scale = 1.f / sqrtf((float)hd);
        for (int r = 0; r < nreq; r++)
            for (int64_t i = 0; i < qn[r]; i++)
                for (int h = 0; h < nh; h++) {
                    const int64_t t = ctx[r] + i;
                    ref_attend_from(&p, r, h / G, q + (q_start[r] + i) * q_stride + (int64_t)h * hd,
                                    t - W + 1 > 0 ? t - W + 1 : 0, t + 1, scale, want + (q_start[r] + i) * row + (int64_t)h * hd);
                }
        char name[96];
        const int rc = paged_prefill_f32_sw(q, q_stride, p.k, p.v, p.bt, p.bt_stride, q_start, qn, seq_len, out, nreq,
                                            nh, nkv, hd, bs, scale, NULL, W);
        double wa = 0;
        double e = rc == 0 ? err_ratio(out, want, tokens * row, 2e-6, 2e-5, &wa) : INFINITY;
        snprintf(name, sizeof name, "paged_prefill_f32_sw window=%d", W);
        result(rc == 0 && e <= 1, name, "rc %d, max abs err %.3g (atol 2e-6 + rtol 2e-5)", rc, wa);
        /* one decode row per request: its last token, over the same pool */
        float* dq = malloc(sizeof(float) * (size_t)(nreq * q_stride));
        double* dwant = malloc(sizeof(double) * (size_t)(nreq * row));
        for (int r = 0; r < nreq; r++) {
            memcpy(dq + r * q_stride, q + (q_start[r] + qn[r] - 1) * q_stride, sizeof(float) * (size_t)q_stride);
            memcpy(dwant + r * row, want + (q_start[r] + qn[r] - 1) * row, sizeof(double) * (size_t)row);
        }
        paged_decode_f32_sw(dq, q_stride, p.k, p.v, p.bt, p.bt_stride, seq_len, out, nreq, nh, nkv, hd, bs, scale,
                            400, W);
        e = err_ratio(out, dwant, nreq * row, 2e-6, 2e-5, &wa);
        snprintf(name, sizeof name, "paged_decode_f32_sw window=%d", W);
        result(e <= 1, name, "max abs err %.3g (atol 2e-6 + rtol 2e-5)", wa);
        free(dq);
        free(dwant);
        free(q);
        free(out);
        free(want);
        free_pool(&p);
    }
}

/* ---- fused element-wise ops ---- */

/* The verdict of a kernel that works in place on the q and k heads of fused qkv rows
 * (stride floats apart): within atol 1e-6 + rtol of want, and the v heads and the gap
 * after each row, where want holds the input, unchanged to the bit. */
static void report_qk_heads(const char* kernel, const float* qkv, const double* want, int rows, int64_t stride,
                            int nh, int nkv, int d, double rtol) {
    int untouched = 1;
    for (int r = 0; r < rows; r++)
        for (int64_t i = (int64_t)(nh + nkv) * d; i < stride; i++)
            untouched &= qkv[r * stride + i] == (float)want[r * stride + i];
    double wa = 0;
    const double e = err_ratio(qkv, want, rows * stride, 1e-6, rtol, &wa);
    char name[96];
    snprintf(name, sizeof name, "%s rows=%d heads=%d+%d d=%d", kernel, rows, nh, nkv, d);
    result(e <= 1 && untouched, name, "max abs err %.3g (atol 1e-6 + rtol %g), v heads %s", wa, rtol,
           untouched ? "untouched" : "CHANGED");
}

static void check_fused(void) {
    const int64_t dims[] = {7, 64, 100, 2048};
    if (present((const void*)add_rmsnorm_f32, "add_rmsnorm_f32")) {
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int add = 0; add < 2; add++)
                for (int alias = 0; alias < 2; alias++) {
                    const int64_t D = dims[di], rows = di % 2 ? 5 : 1, n = rows * D;
                    const float eps = 1e-6f;
                    float* x = frand(n, 3.f);
                    float* res = frand(n, 3.f);
                    float* w = frand(D, 1.f);
                    float* x0 = malloc(sizeof(float) * (size_t)n);
                    float* res0 = malloc(sizeof(float) * (size_t)n);
                    memcpy(x0, x, sizeof(float) * (size_t)n);
                    memcpy(res0, res, sizeof(float) * (size_t)n);
                    float* out = alias ? x : malloc(sizeof(float) * (size_t)n);
                    double* want = malloc(sizeof(double) * (size_t)n);
                    int res_ok = 1;
                    for (int64_t r = 0; r < rows; r++) {
                        double ss = 0;
                        for (int64_t i = 0; i < D; i++) {
                            const float h = add ? x0[r * D + i] + res0[r * D + i] : x0[r * D + i];
                            ss += (double)h * h;
                        }
                        const double inv = 1.0 / sqrt(ss / (double)D + eps);
                        for (int64_t i = 0; i < D; i++) {
                            const float h = add ? x0[r * D + i] + res0[r * D + i] : x0[r * D + i];
                            want[r * D + i] = (double)w[i] * h * inv;
                        }
                    }
                    add_rmsnorm_f32(x, res, w, out, rows, D, eps, add);
                    for (int64_t i = 0; i < n; i++)  /* residual: x + residual exactly, or untouched */
                        res_ok &= res[i] == (add ? x0[i] + res0[i] : res0[i]);
                    double wa = 0;
                    const double e = err_ratio(out, want, n, 1e-6, 2e-6, &wa);
                    char name[128];
                    snprintf(name, sizeof name, "add_rmsnorm_f32 rows=%lld dim=%lld add=%d out=%s", (long long)rows,
                             (long long)D, add, alias ? "x" : "separate");
                    result(e <= 1 && res_ok, name, "max abs err %.3g (atol 1e-6 + rtol 2e-6), residual %s", wa,
                           res_ok ? "right" : "WRONG");
                    free(x);
                    free(res);
                    free(w);
                    free(x0);
                    free(res0);
                    if (!alias) free(out);
                    free(want);
                }
    }
    if (present((const void*)rope_f32, "rope_f32")) {
        const int ds[] = {6, 64, 80, 128};
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
            const int d = ds[di], half = d / 2, nh = 4, nkv = 2, rows = 3;
            const int64_t stride = (int64_t)(nh + 2 * nkv) * d + 5;  /* q, k, v heads and a gap */
            float* qkv = frand(rows * stride, 2.f);
            float* orig = malloc(sizeof(float) * (size_t)(rows * stride));
            memcpy(orig, qkv, sizeof(float) * (size_t)(rows * stride));
            float* cs = malloc(sizeof(float) * (size_t)(rows * d));
            float* sn = malloc(sizeof(float) * (size_t)(rows * d));
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < d; i++) {
                    const double th = (r + 3) * pow(10000.0, -2.0 * (i % half) / d);
                    cs[r * d + i] = (float)cos(th);
                    sn[r * d + i] = (float)sin(th);
                }
            double* want = malloc(sizeof(double) * (size_t)(rows * stride));
            for (int64_t i = 0; i < rows * stride; i++) want[i] = orig[i];
            for (int r = 0; r < rows; r++)
                for (int h = 0; h < nh + nkv; h++)
                    for (int i = 0; i < half; i++) {
                        const int64_t o = r * stride + (int64_t)h * d;
                        const double a = orig[o + i], b = orig[o + i + half];
                        want[o + i] = a * cs[r * d + i] - b * sn[r * d + i];
                        want[o + i + half] = b * cs[r * d + i + half] + a * sn[r * d + i + half];
                    }
            rope_f32(qkv, rows, stride, nh, nkv, d, cs, sn);
            report_qk_heads("rope_f32", qkv, want, rows, stride, nh, nkv, d, 1e-6);
            free(qkv);
            free(orig);
            free(cs);
            free(sn);
            free(want);
        }
    }
    if (present((const void*)silu_mul_f32, "silu_mul_f32")) {
        const int64_t inters[] = {1, 7, 100, 1024};
        for (size_t ii = 0; ii < sizeof inters / sizeof inters[0]; ii++) {
            const int64_t I = inters[ii], rows = ii % 2 ? 3 : 1;
            float* gu = frand(rows * 2 * I, 8.f);
            float* out = malloc(sizeof(float) * (size_t)(rows * I + 1));
            out[rows * I] = -7.f;  /* a guard past the end */
            double* want = malloc(sizeof(double) * (size_t)(rows * I));
            for (int64_t r = 0; r < rows; r++)
                for (int64_t i = 0; i < I; i++) {
                    const double g = gu[r * 2 * I + i];
                    want[r * I + i] = g / (1.0 + exp(-g)) * gu[r * 2 * I + I + i];
                }
            silu_mul_f32(gu, out, rows, I);
            double wa = 0;
            const double e = err_ratio(out, want, rows * I, 1e-6, 1e-6, &wa);
            char name[96];
            snprintf(name, sizeof name, "silu_mul_f32 rows=%lld inter=%lld", (long long)rows, (long long)I);
            result(e <= 1 && out[rows * I] == -7.f, name, "max abs err %.3g (atol 1e-6 + rtol 1e-6)", wa);
            free(gu);
            free(out);
            free(want);
        }
    }
}

/* Qwen3's per-head q/k RMSNorm in place on strided qkv rows: q heads with q_w, k heads with k_w,
 * v heads and the gap after each row keep their bits. */
static void check_rmsnorm_heads(void) {
    if (!present((const void*)rmsnorm_heads_f32, "rmsnorm_heads_f32")) return;
    const int ds[] = {7, 64, 128};
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++) {
        const int d = ds[di], nh = 4, nkv = 2, rows = 3;
        const int64_t stride = (int64_t)(nh + 2 * nkv) * d + 5, n = rows * stride;
        const float eps = 1e-6f;
        float* qkv = frand(n, 3.f);
        float* qw = frand(d, 1.f);
        float* kw = frand(d, 1.f);
        double* want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) want[i] = qkv[i];
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < nh + nkv; h++) {
                const int64_t o = r * stride + (int64_t)h * d;
                double ss = 0;
                for (int i = 0; i < d; i++) ss += (double)qkv[o + i] * qkv[o + i];
                const double inv = 1.0 / sqrt(ss / d + eps);
                for (int i = 0; i < d; i++) want[o + i] = (double)(h < nh ? qw : kw)[i] * qkv[o + i] * inv;
            }
        rmsnorm_heads_f32(qkv, rows, stride, nh, nkv, d, qw, kw, eps);
        report_qk_heads("rmsnorm_heads_f32", qkv, want, rows, stride, nh, nkv, d, 2e-6);
        free(qkv);
        free(qw);
        free(kw);
        free(want);
    }
}

/* ---- fp32 GEMM ---- */

/* W [N, K] into panels of NR columns, K-major: packed[N/NR][K][NR], zero past N */
static float* pack_f32(const float* w, int64_t N, int64_t K, int NR) {
    const int64_t panels = (N + NR - 1) / NR;
    float* p = calloc((size_t)(panels * (K > 0 ? K : 1) * NR), sizeof(float));
    for (int64_t q = 0; q < panels; q++)
        for (int64_t k = 0; k < K; k++)
            for (int j = 0; j < NR; j++)
                if (q * NR + j < N) p[(q * K + k) * NR + j] = w[(q * NR + j) * K + k];
    return p;
}

/* out = x . W^T (+ bias) in double, and sum |x_k w_k| per output (the rounding scale) */
static void ref_gemm(const float* x, int64_t M, int64_t K, int64_t lda, const float* w, int64_t N, const float* bias,
                     double* out, double* mag) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0, a = bias ? fabs(bias[n]) : 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = (double)x[m * lda + k] * w[n * K + k];
                s += t;
                a += fabs(t);
            }
            out[m * N + n] = s;
            mag[m * N + n] = a;
        }
}

/* max |got - want| / (1e-7 + 2e-7 sqrt(K) mag) over an M x N output (got rows ldc apart) */
static double gemm_err(const float* got, int64_t ldc, const double* want, const double* mag, int64_t M, int64_t N,
                       int64_t K) {
    double r = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const double d = fabs(got[m * ldc + n] - want[m * N + n]);
            const double q = d / (1e-7 + 2e-7 * sqrt((double)(K > 0 ? K : 1)) * mag[m * N + n]);
            if (!(q <= r)) r = q;  /* NaN too */
        }
    return r;
}

/* a weight that is 4- or 8-bit underneath: per row n and block of 32 k, w = d * q + m
 * (d a half float's worth of bits, q in 0..15; 8-bit: w = d * q, q in -128..127), packed
 * both as fp32 panels and as the low-bit panels of panel_lowbit.h; the GEMMs over the
 * two must agree bit for bit */
static void check_gemm_lowbit(int NR, int bits) {
    typedef int (*lb_gemm)(const float*, int64_t, int64_t, int64_t, const uint8_t*, int64_t, const float*, float*,
                           int64_t);
    typedef int (*lb_silu)(const float*, int64_t, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t);
    const lb_gemm gemm = bits == 4 ? gemm_f32_q4 : gemm_f32_q8;
    const lb_silu silu = bits == 4 ? gemm_f32_q4_silu : gemm_f32_q8_silu;
    if (!present((const void*)gemm, bits == 4 ? "gemm_f32_q4" : "gemm_f32_q8") ||
        !present((const void*)silu, bits == 4 ? "gemm_f32_q4_silu" : "gemm_f32_q8_silu") ||
        !present((const void*)gemm_f32_lowbit_dequant, "gemm_f32_lowbit_dequant"))
        return;
    const int64_t K = 96, N = 4 * NR, panels = N / NR, kb = K / 32;
    const int64_t block = bits == 4 ? 8 * NR + 16 * NR : 4 * NR + 32 * NR;
    float* w = malloc(sizeof(float) * (size_t)(N * K));
    uint8_t* qp = calloc((size_t)(panels * kb * block), 1);
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < kb; b++) {
            const float d = (float)rnd_int(1, 2047) / 4096.f, m = bits == 4 ? (float)rnd_int(-2047, 2047) / 1024.f : 0;
            uint8_t* blk = qp + ((n / NR) * kb + b) * block;
            memcpy(blk + 4 * (n % NR), &d, 4);
            if (bits == 4) memcpy(blk + 4 * NR + 4 * (n % NR), &m, 4);
            for (int k = 0; k < 32; k++) {
                const int q = bits == 4 ? rnd_int(0, 15) : rnd_int(-128, 127);
                w[n * K + b * 32 + k] = bits == 4 ? d * (float)q + m : d * (float)q;
                if (bits == 4) blk[8 * NR + (k / 2) * NR + n % NR] |= (uint8_t)(q << (k % 2 ? 4 : 0));
                else blk[4 * NR + k * NR + n % NR] = (uint8_t)(int8_t)q;
            }
        }
    float* packed = pack_f32(w, N, K, NR);
    float* back = malloc(sizeof(float) * (size_t)(N * K));
    const int rcd = gemm_f32_lowbit_dequant(qp, bits, panels, K, back);
    char name[96];
    snprintf(name, sizeof name, "gemm_f32_lowbit_dequant bits=%d", bits);
    result(rcd == 0 && memcmp(back, packed, sizeof(float) * (size_t)(N * K)) == 0, name,
           "rc %d; the fp32 panels bit for bit", rcd);
    const int64_t rows[] = {1, 7, 33};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const int64_t M = rows[r];
        float* x = frand(M * K, 1.f);
        float* bias = frand(N, 1.f);
        float *a = malloc(sizeof(float) * (size_t)(M * N)), *c = malloc(sizeof(float) * (size_t)(M * N));
        const int rc = gemm(x, M, K, K, qp, N, bias, a, N);
        gemm_f32(x, M, K, K, packed, N, bias, c, N);
        snprintf(name, sizeof name, "gemm_f32_q%d M=%lld K=%lld N=%lld", bits, (long long)M, (long long)K,
                 (long long)N);
        result(rc == 0 && memcmp(a, c, sizeof(float) * (size_t)(M * N)) == 0, name, "rc %d; gemm_f32's bits", rc);
        const int rcs = silu(x, M, K, K, qp, N, a, N / 2);
        gemm_f32_silu(x, M, K, K, packed, N, c, N / 2);
        snprintf(name, sizeof name, "gemm_f32_q%d_silu M=%lld", bits, (long long)M);
        result(rcs == 0 && memcmp(a, c, sizeof(float) * (size_t)(M * N / 2)) == 0, name,
               "rc %d; gemm_f32_silu's bits", rcs);
        free(x);
        free(bias);
        free(a);
        free(c);
    }
    free(w);
    free(qp);
    free(packed);
    free(back);
}

static void check_gemm(void) {
    if (!present((const void*)gemm_f32, "gemm_f32")) return;
    const int NR = gemm_f32_panel ? gemm_f32_panel() : 0;
#if defined(INFLIGHT_ISA_AMX_BF16)
    const char* level = "amx_bf16";
#elif defined(INFLIGHT_ISA_AVX512_BF16)
    const char* level = "avx512_bf16";  /* the ISA level's name, not vec.h's (avx512 for both) */
#else
    const char* level = VEC_ISA_NAME;
#endif
    if (gemm_f32_isa)
        result(strcmp(gemm_f32_isa(), level) == 0, "gemm_f32_isa", "\"%s\" (driver built for \"%s\")",
               gemm_f32_isa(), level);
    result(NR > 0 && NR % VL == 0, "gemm_f32_panel", "NR %d, VL %d", NR, VL);
    if (NR <= 0 || NR % VL) return;
    check_gemm_lowbit(NR, 4);
    check_gemm_lowbit(NR, 8);
    const int nt = omp_get_max_threads();
    const int have_argmax = present((const void*)gemm_f32_argmax, "gemm_f32_argmax");
    struct gcase {
        int64_t M, K, N, lda_pad, ldc_pad;
        int bias;
    };
    const struct gcase cases[] = {
        {1, 64, 64, 0, 0, 0},     /* decode: one row */
        {7, 100, 37, 3, 5, 1},    /* ragged N, strided x and out, bias */
        {3, 1, 20, 0, 0, 1},      /* K = 1 */
        {2, 0, 9, 0, 0, 1},       /* K = 0: out = bias */
        {33, 700, 70, 0, 0, 0},   /* K past one L1 chunk */
        {100, 300, 96, 1, 0, 1},  /* many row blocks */
        {5, 2000, 16, 0, 0, 0},   /* long K, few panels */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct gcase g = cases[c];
        const int64_t lda = g.K + g.lda_pad, ldc = g.N + g.ldc_pad;
        float* x = frand(g.M * lda, 1.f);
        float* w = frand(g.N * g.K, 1.f);
        float* bias = g.bias ? frand(g.N, 1.f) : NULL;
        float* packed = pack_f32(w, g.N, g.K, NR);
        float* out = malloc(sizeof(float) * (size_t)(g.M * ldc));
        float* out1 = malloc(sizeof(float) * (size_t)(g.M * ldc));
        for (int64_t i = 0; i < g.M * ldc; i++) out[i] = out1[i] = -7.f;
        double* want = malloc(sizeof(double) * (size_t)(g.M * g.N));
        double* mag = malloc(sizeof(double) * (size_t)(g.M * g.N));
        ref_gemm(x, g.M, g.K, lda, w, g.N, bias, want, mag);
        const int rc = gemm_f32(x, g.M, g.K, lda, packed, g.N, bias, out, ldc);
        const double e = gemm_err(out, ldc, want, mag, g.M, g.N, g.K);
        int gaps = 1;  /* the columns between N and ldc stay untouched */
        for (int64_t m = 0; m < g.M; m++)
            for (int64_t n = g.N; n < ldc; n++) gaps &= out[m * ldc + n] == -7.f;
        char name[128];
        snprintf(name, sizeof name, "gemm_f32 M=%lld K=%lld N=%lld lda=%lld ldc=%lld bias=%d", (long long)g.M,
                 (long long)g.K, (long long)g.N, (long long)lda, (long long)ldc, g.bias);
        result(rc == 0 && e <= 1 && gaps, name, "rc %d, err / (1e-7 + 2e-7 sqrt(K) sum|xw|) = %.3g (limit 1)%s", rc,
               e, gaps ? "" : ", wrote past N");
        /* the same bits with one thread, and row by row (a row's result does not depend on its batch) */
        omp_set_num_threads(1);
        gemm_f32(x, g.M, g.K, lda, packed, g.N, bias, out1, ldc);
        omp_set_num_threads(nt);
        int same = 1;
        for (int64_t m = 0; m < g.M; m++)
            for (int64_t n = 0; n < g.N; n++) same &= memcmp(&out[m * ldc + n], &out1[m * ldc + n], 4) == 0;
        for (int64_t m = 0; m < g.M; m += 1 + g.M / 5) {
            gemm_f32(x + m * lda, 1, g.K, lda, packed, g.N, bias, out1, ldc);
            same &= memcmp(out1, out + m * ldc, sizeof(float) * (size_t)g.N) == 0;
        }
        snprintf(name, sizeof name, "gemm_f32 M=%lld K=%lld N=%lld bit-identical", (long long)g.M, (long long)g.K,
                 (long long)g.N);
        result(same, name, "1 vs %d threads, a row alone vs in the batch", nt);
        /* argmax over the plain outputs (no bias): the first column of the largest */
        if (have_argmax && g.K > 0 && !g.bias) {
            int64_t* tok = malloc(sizeof(int64_t) * (size_t)g.M);
            const int rca = gemm_f32_argmax(x, g.M, g.K, lda, packed, g.N, tok);
            int ok = rca == 0;
            for (int64_t m = 0; m < g.M && ok; m++) {
                int64_t b = 0;
                for (int64_t n = 1; n < g.N; n++) b = out[m * ldc + n] > out[m * ldc + b] ? n : b;
                ok &= tok[m] == b;
            }
            snprintf(name, sizeof name, "gemm_f32_argmax M=%lld K=%lld N=%lld", (long long)g.M, (long long)g.K,
                     (long long)g.N);
            result(ok, name, "rc %d; the first largest of gemm_f32's outputs", rca);
            free(tok);
        }
        free(x);
        free(w);
        free(bias);
        free(packed);
        free(out);
        free(out1);
        free(want);
        free(mag);
    }
    if (have_argmax) {
        /* ties: equal weight rows in different panels and lanes give equal outputs; the first wins */
        const int64_t M = 4, K = 50, N = 3 * NR + 5;
        float* x = frand(M * K, 1.f);
        for (int64_t i = 0; i < M * K; i++) x[i] = fabsf(x[i]);
        float* w = frand(N * K, 0.1f);
        const int64_t cols[3] = {NR + 1, 2 * NR + 3, N - 1};
        for (int j = 0; j < 3; j++)
            for (int64_t k = 0; k < K; k++) w[cols[j] * K + k] = 1.f;
        float* packed = pack_f32(w, N, K, NR);
        int64_t tok[4];
        const int rc = gemm_f32_argmax(x, M, K, K, packed, N, tok);
        result(rc == 0 && tok[0] == cols[0] && tok[1] == cols[0] && tok[2] == cols[0] && tok[3] == cols[0],
               "gemm_f32_argmax ties", "columns %lld, %lld, %lld tie: got %lld (want %lld)", (long long)cols[0],
               (long long)cols[1], (long long)cols[2], (long long)tok[0], (long long)cols[0]);
        free(x);
        free(w);
        free(packed);
    }
    if (present((const void*)gemm_f32_silu, "gemm_f32_silu")) {
        const int64_t shapes[][3] = {{1, 64, 2 * NR}, {9, 130, 6 * NR}, {40, 300, 4 * NR}};
        for (int c = 0; c < 3; c++) {
            const int64_t M = shapes[c][0], K = shapes[c][1], N = shapes[c][2], H = N / 2, ldc = H + 3;
            float* x = frand(M * K, 1.f);
            float* w = frand(N * K, 1.f);
            float* packed = pack_f32(w, N, K, NR);
            float* out = malloc(sizeof(float) * (size_t)(M * ldc));
            double* gu = malloc(sizeof(double) * (size_t)(M * N));
            double* mag = malloc(sizeof(double) * (size_t)(M * N));
            double* want = malloc(sizeof(double) * (size_t)(M * H));
            double* wmag = malloc(sizeof(double) * (size_t)(M * H));
            ref_gemm(x, M, K, K, w, N, NULL, gu, mag);
            for (int64_t m = 0; m < M; m++)
                for (int64_t j = 0; j < H; j++) {
                    const double g = gu[m * N + j], u = gu[m * N + H + j], sg = 1.0 / (1.0 + exp(-g));
                    want[m * H + j] = g * sg * u;
                    /* the rounding of gate and up carries through: d(silu(g) u) = silu'(g) u dg + silu(g) du */
                    wmag[m * H + j] = fabs((sg * (1 + g * (1 - sg))) * u) * mag[m * N + j] + fabs(g * sg) * mag[m * N + H + j];
                }
            const int rc = gemm_f32_silu(x, M, K, K, packed, N, out, ldc);
            const double e = gemm_err(out, ldc, want, wmag, M, H, K);
            char name[96];
            snprintf(name, sizeof name, "gemm_f32_silu M=%lld K=%lld N=%lld", (long long)M, (long long)K, (long long)N);
            result(rc == 0 && e <= 1, name, "rc %d, err / (1e-7 + 2e-7 sqrt(K) scale) = %.3g (limit 1)", rc, e);
            free(x);
            free(w);
            free(packed);
            free(out);
            free(gu);
            free(mag);
            free(want);
            free(wmag);
        }
        float one = 1.f, o;
        result(gemm_f32_silu(&one, 1, 1, 1, &one, NR, &o, 1) == -2, "gemm_f32_silu refuses N % 2NR != 0", "-2");
    }
}

int main(int argc, char** argv) {
    verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    printf("kernel_check: ISA %s, VL %d\n", VEC_ISA_NAME, VL);
    check_vec_exp();
    check_vec_silu();
    check_vec_reductions();
    check_vec_lanes();
    check_paged_decode();
    check_paged_decode_shared_prefix();
    check_paged_decode_fp8();
    check_paged_prefill();
    check_sliding_window();
    check_fused();
    check_rmsnorm_heads();
    check_gemm();
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
