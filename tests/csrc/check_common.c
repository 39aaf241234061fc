/* The driver's verdicts, its deterministic inputs and its error measure. */
#include <stdarg.h>

#include "check.h"

static int n_pass, n_fail, n_skip;
int verbose;

void result(int ok, const char* name, const char* fmt, ...) {
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

int present(const void* fn, const char* name) {
    if (fn) return 1;
    n_skip++;
    printf("SKIP %s: not in the linked kernel sources\n", name);
    return 0;
}

/* ---- deterministic inputs ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* uniform in [-1, 1) */
float rnd(void) { return (float)((double)rnd_u32() / 2147483648.0 - 1.0); }

int rnd_int(int lo, int hi) { return lo + (int)(rnd_u32() % (uint32_t)(hi - lo + 1)); }

float* frand(int64_t n, float amp) {
    float* p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = amp * rnd();
    return p;
}

/* max |got - want| / (atol + rtol |want|) over n values: <= 1 passes */
double err_ratio(const float* got, const double* want, int64_t n, double atol, double rtol, double* worst_abs) {
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

int check_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", n_pass, n_fail, n_skip);
    return n_fail ? 1 : 0;
}
