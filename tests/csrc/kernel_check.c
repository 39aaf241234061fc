/* A stand-alone check of the fp32 CPU kernels (inflight/kernels/cpu/csrc) against
 * plain scalar C references with double accumulation, for one ISA level: built with
 * that level's flags (build.py's compile_flags) and linked against the kernel libraries
 * the engine loads for the level (for aarch64, run under qemu-user with the cross
 * sysroot's libc). tests/test_kernels_aarch64.py builds and runs it
 * natively for every x86 level the CPU runs and under qemu-aarch64 for neon and
 * aarch64 scalar.
 *
 * Output: one line per check ("ok" / "FAIL" / "SKIP" with the worst error seen),
 * then "N passed, M failed, K skipped"; the exit status is 1 when anything failed.
 * A kernel whose source is not linked is a weak NULL symbol (kernels.h): skipped.
 * The checks live in check_<part>.c (check.h); main runs them in one order, since their
 * inputs come from one random sequence.
 *
 * Usage: kernel_check [-v]   (-v: print the passing checks too)
 */
#include <string.h>

#include "check.h"

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
    return check_summary();
}
