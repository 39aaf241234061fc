/* Block pools for the paged attention checks, and the reference attention over them in double. */
#include "check.h"

struct pool make_pool(int num_seqs, const int64_t* lens, int block_size, int nkv, int hd) {
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

void free_pool(struct pool* p) {
    free(p->k);
    free(p->v);
    free(p->bt);
}

const float* pool_row(const struct pool* p, const float* cache, int s, int64_t t, int kh) {
    const int64_t blk = p->bt[s * p->bt_stride + t / p->block_size];
    return cache + ((blk * p->block_size + t % p->block_size) * p->nkv + kh) * p->hd;
}

/* out[hd] = softmax(scale q . K[lo:n]) V[lo:n] over sequence s's cache, in double */
void ref_attend_from(const struct pool* p, int s, int kh, const float* q, int64_t lo, int64_t n, float scale,
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

void ref_attend(const struct pool* p, int s, int kh, const float* q, int64_t n, float scale, double* out) {
    ref_attend_from(p, s, kh, q, 0, n, scale, out);
}
