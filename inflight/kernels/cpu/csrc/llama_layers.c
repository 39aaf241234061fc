/*
 * Every decoder layer of a Llama-family model (bf16 or fp32) in one call: the same kernels,
 * in the same order and on the same buffers, as the Python layer loop of
 * models/llama.py drives through ctypes on the CPU fast path, without its ~25
 * Python dispatches per layer. The kernels live in their
 * own libraries; Python hands their addresses in (struct kernels), so this file
 * only sequences them.
 *
 * Buffers (row-major, the model's dtype): res [T, hidden] holds the residual stream (the
 * embeddings on entry), y [T, hidden] each layer's output (the MLP's; on entry
 * ignored when has_residual is 0). On return, the final norm of y + res is left
 * to the caller, as in the Python loop.
 */
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t now_ticks(void) { return __rdtsc(); }
#else
#include <time.h>
static inline uint64_t now_ticks(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
#endif

/* Kernel signatures: the bf16 and fp32 kernels take the same arguments; element
 * pointers are void* here, and the element size comes in struct dims. */
typedef int (*gemm_fn)(const void*, int64_t, int64_t, int64_t, const void*, int64_t, const void*, void*, int64_t);
typedef void (*rmsnorm_fn)(void*, void*, const void*, void*, int64_t, int64_t, float, int);
typedef void (*rope_fn)(void*, int64_t, int64_t, int, int, int, const void*, const void*);
typedef void (*heads_norm_fn)(void*, int64_t, int64_t, int, int, int, const void*, const void*, float);
typedef void (*silu_fn)(const void*, void*, int64_t, int64_t);
typedef void (*write_fn)(const char*, int64_t, const char*, int64_t, char*, char*, const int64_t*, int64_t,
                         int64_t, int);
typedef void (*decode_fn)(const void*, int64_t, const void*, const void*, const int64_t*, int64_t,
                          const int64_t*, void*, int, int, int, int, int, float, int);
typedef int (*gemm_silu_fn)(const void*, int64_t, int64_t, int64_t, const void*, int64_t, void*, int64_t);
typedef int (*prefill_fn)(const void*, int64_t, const void*, const void*, const int64_t*, int64_t,
                          const int64_t*, const int64_t*, const int64_t*, void*, int, int, int, int, int,
                          float, void*);
/* the same with a trailing sliding window (paged_decode_f32_sw, paged_prefill_f32_sw) */
typedef void (*decode_sw_fn)(const void*, int64_t, const void*, const void*, const int64_t*, int64_t,
                             const int64_t*, void*, int, int, int, int, int, float, int, int);
typedef int (*prefill_sw_fn)(const void*, int64_t, const void*, const void*, const int64_t*, int64_t,
                             const int64_t*, const int64_t*, const int64_t*, void*, int, int, int, int, int,
                             float, void*, int);

struct kernels {
    gemm_fn gemm;
    rmsnorm_fn add_rmsnorm;
    rope_fn rope;
    silu_fn silu_mul;
    write_fn write_kv;
    decode_fn decode;
    prefill_fn prefill;
    gemm_silu_fn gemm_silu;  /* gate_up and SiLU in one pass; NULL: gemm then silu_mul */
    decode_sw_fn decode_sw;    /* for layers with a sliding window; NULL when none has one */
    prefill_sw_fn prefill_sw;
    heads_norm_fn rmsnorm_heads;  /* per-head q/k RMSNorm (rmsnorm_heads_*); NULL when no layer has one */
    gemm_fn gemm_q4, gemm_q8, gemm_q6;  /* gemm and gemm_silu over low-bit panels (gemm_f32_q4*, _q8*, _q6*); */
    gemm_silu_fn gemm_q4_silu, gemm_q8_silu, gemm_q6_silu;  /* NULL: none */
};

struct dims {
    int64_t hidden, inter, num_heads, num_kv_heads, head_dim, block_size, elem_size;
    int64_t lowbit_max_rows;  /* steps of at most this many tokens use a layer's low-bit panels */
    float eps, scale;
};

/* one layer: packed projection panels (gemm_*.py), norm weights (q_norm, k_norm [head_dim]:
 * Qwen3's per-head norms before RoPE, NULL: none), its KV pool, its sliding window
 * (0: global attention), and the projections' low-bit panels (panel_lowbit.py; NULL: none)
 * with their forms (4, 8 or 6: panel_lowbit.h) */
struct layer {
    const void *input_norm, *qkv, *qkv_bias, *q_norm, *k_norm, *o, *post_norm, *gate_up, *down;
    void *k_cache, *v_cache;
    int64_t window;
    const void *qkv_lb, *o_lb, *gate_up_lb, *down_lb;
    int64_t qkv_bits, o_bits, gate_up_bits, down_bits;
    int64_t no_rope;  /* a layer without positions (SmolLM3's every fourth) */
};

/* LoRA: one adapter's weights for one projection of one layer, packed as the projection is
 * (a: [k, in], the shrink; b: [out, k], the expand); a NULL: the adapter leaves it alone */
struct lora_proj { const void *a, *b; int64_t k; };
enum lora_which { L_QKV, L_O, L_GATE_UP, L_DOWN };
struct lora_layer { struct lora_proj p[4]; };  /* by enum lora_which */
/* rows [start, end) of the step run with the adapter whose weights per layer are `layers` */
struct lora_run { int64_t start, end; const struct lora_layer* layers; };

/* one step: decodes are rows [0, num_decodes), one token each; prefill request i
 * has q_start[i], q_len[i], seq_len[i] and block table row num_decodes + i */
struct step {
    int64_t T, num_decodes, num_prefills, bt_stride, max_decode_len;
    const int64_t *slots, *block_tables, *seq_lens, *q_start, *q_len, *pf_seq_len;
    void* workspace;
    const void *cos, *sin;                    /* [T, head_dim] each */
    void *res, *y, *h, *qkv, *attn, *gate_up, *act;
    uint64_t* ticks;  /* NULL, or per-kernel time-stamp counter totals (enum tick) to add to */
    /* LoRA runs (none: num_lora_runs 0); lora_mid [T, largest k] and lora_out [T, widest
     * projection] are their scratch rows */
    const struct lora_run* lora_runs;
    int64_t num_lora_runs;
    void *lora_mid, *lora_out;
};

/* where the time of a step goes: kernel kinds in the order of struct step's ticks */
enum tick { T_NORM, T_QKV, T_QK_NORM, T_ROPE, T_WRITE, T_DECODE, T_PREFILL, T_O, T_GATE_UP, T_SILU, T_DOWN, T_COUNT };

static inline void tick(uint64_t* ticks, int kind, uint64_t* last) {
    if (!ticks) return;
    const uint64_t now = now_ticks();
    ticks[kind] += now - *last;
    *last = now;
}

int llama_layers_ticks(void) { return T_COUNT; }

/* the kernel over a projection's low-bit panels (bits wide) for a step of T tokens, NULL:
 * its fp32 panels (none, or too many rows) */
static gemm_fn lowbit_gemm(const struct kernels* k, const struct dims* d, const void* lb, int64_t bits, int64_t T) {
    if (!lb || T > d->lowbit_max_rows) return NULL;
    return bits == 4 ? k->gemm_q4 : bits == 8 ? k->gemm_q8 : bits == 6 ? k->gemm_q6 : NULL;
}

static gemm_silu_fn lowbit_silu(const struct kernels* k, const struct dims* d, const void* lb, int64_t bits,
                                int64_t T) {
    if (!lowbit_gemm(k, d, lb, bits, T)) return NULL;
    return bits == 4 ? k->gemm_q4_silu : bits == 8 ? k->gemm_q8_silu : k->gemm_q6_silu;
}

/* out[T, N] = x[T, K] . W^T (+ bias) */
static int proj(const struct kernels* k, const struct dims* d, const void* x, int64_t T, int64_t K,
                const void* packed, const void* lb, int64_t bits, int64_t N, const void* bias, void* out) {
    const gemm_fn low = lowbit_gemm(k, d, lb, bits, T);
    return low ? low(x, T, K, K, lb, N, bias, out, N) : k->gemm(x, T, K, K, packed, N, bias, out, N);
}

static inline float bf16_f32(uint16_t v) {
    union { uint32_t u; float f; } c = {(uint32_t)v << 16};
    return c.f;
}

static inline uint16_t f32_bf16(float f) {  /* round to nearest even, as torch (no NaN payloads here) */
    union { float f; uint32_t u; } c = {f};
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

/* out[r, :n] += add[r, :n] for rows r < rows; out's row stride ldo, add's n */
static void add_rows(void* out, int64_t ldo, const void* add, int64_t rows, int64_t n, int64_t es) {
    for (int64_t r = 0; r < rows; r++) {
        if (es == 4) {
            float* o = (float*)out + r * ldo;
            const float* a = (const float*)add + r * n;
            for (int64_t i = 0; i < n; i++) o[i] += a[i];
        } else {
            uint16_t* o = (uint16_t*)out + r * ldo;
            const uint16_t* a = (const uint16_t*)add + r * n;
            for (int64_t i = 0; i < n; i++) o[i] = f32_bf16(bf16_f32(o[i]) + bf16_f32(a[i]));
        }
    }
}

static int lora_adapts(const struct step* s, int l, int which) {
    for (int64_t r = 0; r < s->num_lora_runs; r++)
        if (s->lora_runs[r].layers[l].p[which].a) return 1;
    return 0;
}

/* out[rows, :N] += (x[rows, :K] . A^T) . B^T for each LoRA run that adapts this projection:
 * the same two GEMMs and the same rounding as the Python LoRA layer (lora/layers.py) */
static int add_lora(const struct kernels* k, const struct dims* d, const struct step* s, int l, int which,
                    const void* x, int64_t K, int64_t N, void* out) {
    const int64_t es = d->elem_size;
    for (int64_t r = 0; r < s->num_lora_runs; r++) {
        const struct lora_run* run = &s->lora_runs[r];
        const struct lora_proj* p = &run->layers[l].p[which];
        const int64_t n = run->end - run->start;
        if (!p->a || n <= 0) continue;
        int rc = k->gemm((const char*)x + run->start * K * es, n, K, K, p->a, p->k, NULL, s->lora_mid, p->k);
        if (!rc) rc = k->gemm(s->lora_mid, n, p->k, p->k, p->b, N, NULL, s->lora_out, N);
        if (rc) return rc;
        add_rows((char*)out + run->start * N * es, N, s->lora_out, n, N, es);
    }
    return 0;
}

int llama_layers(const struct kernels* k, const struct dims* d, const struct layer* layers, int num_layers,
                      const struct step* s, int has_residual) {
    const int64_t T = s->T, hd = d->head_dim, nh = d->num_heads, nkv = d->num_kv_heads;
    const int64_t qkv_dim = (nh + 2 * nkv) * hd, attn_dim = nh * hd, es = d->elem_size, row_bytes = nkv * hd * es;
    uint64_t* tk = s->ticks;
    uint64_t last = tk ? now_ticks() : 0;
    for (int l = 0; l < num_layers; l++) {
        const struct layer* w = &layers[l];
        const int add = l > 0 || has_residual;
        /* add=0: the norm of res itself (the embeddings) */
        k->add_rmsnorm(add ? s->y : s->res, s->res, w->input_norm, s->h, T, d->hidden, d->eps, add);
        tick(tk, T_NORM, &last);
        int rc = proj(k, d, s->h, T, d->hidden, w->qkv, w->qkv_lb, w->qkv_bits, qkv_dim, w->qkv_bias, s->qkv);
        if (!rc) rc = add_lora(k, d, s, l, L_QKV, s->h, d->hidden, qkv_dim, s->qkv);
        if (rc) return rc;
        tick(tk, T_QKV, &last);
        if (w->q_norm) {  /* after the bias, before RoPE, as the Python loop's _norm_qk */
            if (!k->rmsnorm_heads || !w->k_norm) return -3;  /* the caller declines such stacks */
            k->rmsnorm_heads(s->qkv, T, qkv_dim, (int)nh, (int)nkv, (int)hd, w->q_norm, w->k_norm, d->eps);
            tick(tk, T_QK_NORM, &last);
        }
        if (!w->no_rope) k->rope(s->qkv, T, qkv_dim, (int)nh, (int)nkv, (int)hd, s->cos, s->sin);
        tick(tk, T_ROPE, &last);
        k->write_kv((const char*)s->qkv + attn_dim * es, qkv_dim * es, (const char*)s->qkv + (attn_dim + nkv * hd) * es,
                    qkv_dim * es, (char*)w->k_cache, (char*)w->v_cache, s->slots, T, row_bytes, (int)hd);
        tick(tk, T_WRITE, &last);
        if (w->window && !(k->decode_sw && k->prefill_sw)) return -2;  /* the caller declines such stacks */
        if (s->num_decodes && w->window)
            k->decode_sw(s->qkv, qkv_dim, w->k_cache, w->v_cache, s->block_tables, s->bt_stride, s->seq_lens,
                         s->attn, (int)s->num_decodes, (int)nh, (int)nkv, (int)hd, (int)d->block_size, d->scale,
                         (int)s->max_decode_len, (int)w->window);
        else if (s->num_decodes)
            k->decode(s->qkv, qkv_dim, w->k_cache, w->v_cache, s->block_tables, s->bt_stride, s->seq_lens, s->attn,
                      (int)s->num_decodes, (int)nh, (int)nkv, (int)hd, (int)d->block_size, d->scale,
                      (int)s->max_decode_len);
        tick(tk, T_DECODE, &last);
        if (s->num_prefills) {
            const int64_t* bt = s->block_tables + s->num_decodes * s->bt_stride;
            if (w->window)
                rc = k->prefill_sw(s->qkv, qkv_dim, w->k_cache, w->v_cache, bt, s->bt_stride, s->q_start, s->q_len,
                                   s->pf_seq_len, s->attn, (int)s->num_prefills, (int)nh, (int)nkv, (int)hd,
                                   (int)d->block_size, d->scale, s->workspace, (int)w->window);
            else
                rc = k->prefill(s->qkv, qkv_dim, w->k_cache, w->v_cache, bt, s->bt_stride, s->q_start, s->q_len,
                                s->pf_seq_len, s->attn, (int)s->num_prefills, (int)nh, (int)nkv, (int)hd,
                                (int)d->block_size, d->scale, s->workspace);
            if (rc) return rc;
        }
        tick(tk, T_PREFILL, &last);
        rc = proj(k, d, s->attn, T, attn_dim, w->o, w->o_lb, w->o_bits, d->hidden, NULL, s->y);
        if (!rc) rc = add_lora(k, d, s, l, L_O, s->attn, attn_dim, d->hidden, s->y);
        if (rc) return rc;
        tick(tk, T_O, &last);
        k->add_rmsnorm(s->y, s->res, w->post_norm, s->h, T, d->hidden, d->eps, 1);
        tick(tk, T_NORM, &last);
        if (k->gemm_silu && !lora_adapts(s, l, L_GATE_UP)) {  /* the SiLU counts as gate_up's */
            const gemm_silu_fn low = lowbit_silu(k, d, w->gate_up_lb, w->gate_up_bits, T);
            rc = low ? low(s->h, T, d->hidden, d->hidden, w->gate_up_lb, 2 * d->inter, s->act, d->inter)
                     : k->gemm_silu(s->h, T, d->hidden, d->hidden, w->gate_up, 2 * d->inter, s->act, d->inter);
            if (rc) return rc;
            tick(tk, T_GATE_UP, &last);
        } else {
            rc = proj(k, d, s->h, T, d->hidden, w->gate_up, w->gate_up_lb, w->gate_up_bits, 2 * d->inter, NULL,
                      s->gate_up);
            if (!rc) rc = add_lora(k, d, s, l, L_GATE_UP, s->h, d->hidden, 2 * d->inter, s->gate_up);
            if (rc) return rc;
            tick(tk, T_GATE_UP, &last);
            k->silu_mul(s->gate_up, s->act, T, d->inter);
            tick(tk, T_SILU, &last);
        }
        rc = proj(k, d, s->act, T, d->inter, w->down, w->down_lb, w->down_bits, d->hidden, NULL, s->y);
        if (!rc) rc = add_lora(k, d, s, l, L_DOWN, s->act, d->inter, d->hidden, s->y);
        if (rc) return rc;
        tick(tk, T_DOWN, &last);
    }
    return 0;
}
