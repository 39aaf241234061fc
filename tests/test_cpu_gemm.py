"""The panel GEMM (csrc/gemm_bf16.c) computes a bf16 linear layer: float32
accumulation rounded once, like oneDNN, at every row count and odd shapes, at every
ISA level this CPU runs and at AVX-512-BF16 emulated where it lacks it (isa_levels.py):
AMX tiles at amx_bf16 (K a multiple of 32), the bf16 dot product at avx512_bf16, bf16
widened to fp32 in registers below it. The
CPU's own level runs every case, the others a smaller set."""
import ctypes

import pytest
import torch
from torch import nn

from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.fused import load_fused_ops
from inflight.kernels.cpu.gemm_bf16 import PanelLinear, load_gemm, pack_panels
from inflight.kernels.cpu.isa import current_level
from isa_levels import kernel_test_levels, level_id

pytestmark = pytest.mark.skipif(load_gemm() is None, reason="no C compiler")

TOP = current_level()
LEVELS = kernel_test_levels() if load_gemm() is not None else []
LEVEL_PARAMS = [pytest.param(lv, id=level_id(lv)) for lv in LEVELS]
_i64, _p = ctypes.c_int64, ctypes.c_void_p


def gemm_lib(level) -> ctypes.CDLL:
    """gemm_bf16 built for ``level``, with the entry points' signatures set."""
    lib = load_library("gemm_bf16", level)
    assert lib is not None and lib.gemm_bf16_supported() == 1 and lib.gemm_bf16_panel() == 32
    lib.gemm_bf16.argtypes = [_p, _i64, _i64, _i64, _p, _i64, _p, _p, _i64]
    lib.gemm_bf16_silu.argtypes = [_p, _i64, _i64, _i64, _p, _i64, _p, _i64]
    lib.gemm_bf16_argmax.argtypes = [_p, _i64, _i64, _i64, _p, _i64, _p]
    return lib


def panel_linear(weight, bias, level) -> PanelLinear:
    """A PanelLinear whose calls go to the kernel built for ``level`` (the packing is the same)."""
    lin = PanelLinear(weight, bias)
    lin.lib = gemm_lib(level)
    return lin


def reference(x, weight, bias):
    out = x.float() @ weight.float().t()
    return out if bias is None else out + bias.float()


def _matmul_cases():
    """Every case at the CPU's own level; rows on both sides of the 8-row block that
    widens panels once, odd K and ragged N at the others."""
    for lv in LEVELS:
        top = lv == TOP
        for rows in [1, 5, 6, 7, 13, 96, 97, 300] if top else [1, 13] if lv.emulated else [1, 7, 13, 97]:
            for shape in [(160, 96), (576, 576), (100, 33), (32, 2), (70, 1)] if top else \
                    [(160, 96), (100, 33), (70, 1)] if lv.emulated else [(160, 96), (100, 33), (32, 2), (70, 1)]:
                for bias in (False, True):
                    yield pytest.param(lv, rows, shape, bias, id=f"{level_id(lv)}-{rows}-{shape[0]}x{shape[1]}-{bias}")


@pytest.mark.parametrize("level,rows,shape,bias", list(_matmul_cases()))
def test_panel_linear_matches_a_float32_matmul(level, rows, shape, bias):
    """Row counts around the 6-row register block and 96-row L2 block; N not a
    multiple of the 32-column panel; odd K (a last pair with one value)."""
    torch.manual_seed(rows * 1000 + shape[0])
    n, k = shape
    w = torch.randn(n, k, dtype=torch.bfloat16)
    b = torch.randn(n, dtype=torch.bfloat16) if bias else None
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    got = panel_linear(w, b, level)(x)
    want = reference(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    # one bf16 rounding of a float32 sum: within half an ulp (2^-8 relative) plus summation order
    torch.testing.assert_close(got.float(), want, rtol=2 ** -8, atol=1e-3 * k ** 0.5)


@pytest.mark.parametrize("level", LEVEL_PARAMS)
def test_odd_k_never_reads_past_the_row(level):
    """With K odd the last pair holds one x value: the element after it (here a NaN
    in a wider buffer, rows lda apart) must not leak into the output."""
    torch.manual_seed(0)
    w = torch.randn(64, 7, dtype=torch.bfloat16)
    buf = torch.full((9, 8), float("nan"), dtype=torch.bfloat16)
    buf[:, :7] = torch.randn(9, 7, dtype=torch.bfloat16)
    x = buf[:, :7]  # rows 8 apart, not contiguous
    got = panel_linear(w, None, level)(x)
    assert torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.float(), reference(x, w, None), rtol=2 ** -8, atol=1e-2)


@pytest.mark.parametrize("level", LEVEL_PARAMS)
def test_leading_dims_and_empty_input(level):
    lin = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    packed = panel_linear(lin.weight, None, level)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert packed(x).shape == (2, 3, 48)
        torch.testing.assert_close(packed(x).float(), lin(x).float(), rtol=2e-2, atol=2e-2)
        assert packed(torch.empty(0, 64, dtype=torch.bfloat16)).shape == (0, 48)


def test_pack_panels_layout():
    """Panel p, pair j, column c, half h holds W[32p + c, 2j + h], zero-padded."""
    w = torch.arange(40 * 5, dtype=torch.float32).view(40, 5).to(torch.bfloat16)
    packed = pack_panels(w, 32)
    assert packed.shape == (2, 3, 32, 2)
    assert packed[1, 2, 3, 0] == w[35, 4] and packed[1, 2, 3, 1] == 0  # odd K padded
    assert packed[0, 1, 7, 1] == w[7, 3]
    assert (packed[1, :, 8:] == 0).all()  # columns 40-63 do not exist


@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("rows", [1, 5, 7, 13, 100])
@pytest.mark.parametrize("inter", [32, 96])
def test_gate_up_with_silu_epilogue_is_bit_identical_to_gemm_then_silu_mul(level, rows, inter):
    """The fused gate_up + SiLU (the C layer loop's MLP) against the two separate kernels,
    both built for the same level."""
    fused = load_fused_ops(level)
    assert fused is not None
    torch.manual_seed(rows + inter)
    w = torch.randn(2 * inter, 64, dtype=torch.bfloat16) * 0.3
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    lin = panel_linear(w, None, level)
    want = fused.silu_mul(lin(x))
    got = lin.silu_mul(x)
    assert got.shape == (rows, inter)
    assert torch.equal(got, want)


@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("rows", [1, 6, 7, 13, 100])
@pytest.mark.parametrize("n", [49, 64, 1000])
@pytest.mark.parametrize("k", [40, 64])
def test_argmax_matches_argmax_of_the_bf16_outputs(level, rows, n, k):
    """Greedy sampling's fused argmax: the first index of the largest bf16-rounded
    output, as rounding the logits and calling argmax gives (ties included)."""
    torch.manual_seed(rows * 7 + n)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    if rows > 1:  # the first row: plain argmax; the others: two identical, largest outputs
        w[n // 3] = w[n // 2] = 3.0
        x[1:] = x[1:].abs() + 0.1
    lin = panel_linear(w, None, level)
    want = lin(x).float().argmax(dim=-1)
    got = lin.argmax(x)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    if rows > 1:
        assert (got[1:] == n // 3).all()  # ties resolved to the first index


@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("rows", [1, 13])
@pytest.mark.parametrize("nan_cols", [(990,), (40, 990)], ids=str)
def test_argmax_takes_the_first_nan_as_torch_argmax_does(level, rows, nan_cols):
    """A NaN output ranks above every number, as in torch.argmax: the first NaN column wins
    over a larger finite output before it and over a later NaN."""
    torch.manual_seed(6)
    w = torch.randn(1000, 64, dtype=torch.bfloat16)
    x = (torch.randn(rows, 64).abs() + 0.1).to(torch.bfloat16)
    w[5] = 8.0
    for c in nan_cols:
        w[c, 3] = float("nan")
    lin = panel_linear(w, None, level)
    want = lin(x).float().argmax(dim=-1)
    assert (want == nan_cols[0]).all()
    assert torch.equal(lin.argmax(x), want)


@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("k", [77, 96])
def test_a_row_does_not_depend_on_the_rows_beside_it(level, k):
    """Every register block (1 to 12 rows, panels widened once or in the inner loop; at
    amx_bf16 with K a multiple of 32, tiles of 16 rows, partly zero padding) runs the same
    products in the same order per output: a row's result is bit-identical whatever the
    batch it is computed in."""
    torch.manual_seed(3)
    w = torch.randn(200, k, dtype=torch.bfloat16)
    b = torch.randn(200, dtype=torch.bfloat16)
    x = torch.randn(97, k, dtype=torch.bfloat16)
    lin = panel_linear(w, b, level)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
    for rows in (2, 5, 7, 8, 13, 97):
        assert torch.equal(lin(x[:rows]), alone[:rows]), rows
