"""The fp32 panel GEMM (csrc/gemm_f32.c), built for every ISA level this CPU runs:
plain with and without bias, the silu(gate) * up epilogue and the argmax epilogue
against torch, at odd shapes and row counts around every blocking boundary."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

from inflight.kernels.cpu import isa
from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32, load_gemm_f32, pack_panels_f32

LEVELS = isa.supported_levels()
AVX2_X86 = isa.machine_arch() == "x86_64" and "avx2" in isa.cpu_flags()


def _buildable(level) -> bool:
    return load_library("gemm_f32", level) is not None


# On an x86-64 CPU with AVX2 nothing here may skip: a missing compiler is a failure.
pytestmark = pytest.mark.skipif(not AVX2_X86 and not (LEVELS and _buildable(LEVELS[0])),
                                reason="no fp32 GEMM build on this machine")
level_params = [pytest.param(lv, id=lv.name) for lv in LEVELS]


def test_every_level_builds_and_names_itself():
    if AVX2_X86:
        assert {"scalar", "avx2"} <= {lv.name for lv in LEVELS}
    for lv in LEVELS:
        lib = load_gemm_f32(lv)
        assert lib is not None, f"gemm_f32 does not build for {lv.name}"
        assert lib.gemm_f32_isa().decode() == lv.name
        panel = lib.gemm_f32_panel()
        assert panel % max(lv.lanes, 4) == 0 and panel >= 8


def check_close(got, x, w, bias=None):
    """Within fp32 rounding of a sum in another order: relative to sum |x||w| per output."""
    want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    scale = x.abs().double() @ w.abs().double().t() + (0 if bias is None else bias.abs().double())
    err = ((got.double() - want).abs() / (scale + 1e-30)).max().item() if got.numel() else 0.0
    assert err < 1e-5, err


# rows around the register blocks (4, 6, 8, 12) and the L2 row block; N around the
# panels (8, 12, 16, 32) and below one; K = 1, odd, and past one L1 chunk (>= 128)
ROWS = [1, 3, 5, 7, 13, 97, 200]
SHAPES = [(1, 1), (7, 1), (37, 5), (100, 33), (33, 300), (960, 96), (50, 1100)]


@pytest.mark.parametrize("level", level_params)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_linear_matches_torch(level, shape):
    n, k = shape
    torch.manual_seed(n * 7 + k)
    w, b = torch.randn(n, k), torch.randn(n)
    lin, lin_b = PanelLinearF32(w, None, level), PanelLinearF32(w, b, level)
    for m in ROWS:
        x = torch.randn(m, k)
        got = lin(x)
        assert got.shape == (m, n) and got.dtype == torch.float32
        check_close(got, x, w)
        check_close(lin_b(x), x, w, b)


@pytest.mark.parametrize("level", level_params)
def test_rows_do_not_depend_on_the_batch(level):
    """Same sums in the same order at any M, blocking or thread split: bit-identical rows."""
    torch.manual_seed(1)
    w, b = torch.randn(200, 700), torch.randn(200)
    x = torch.randn(150, 700)
    lin = PanelLinearF32(w, b, level)
    full = lin(x)
    for lo, hi in [(0, 1), (3, 4), (5, 11), (17, 150), (149, 150)]:
        assert torch.equal(lin(x[lo:hi]), full[lo:hi])


@pytest.mark.parametrize("level", level_params)
def test_strided_rows_and_leading_dims(level):
    """x rows lda apart (a view of a wider buffer, NaN past the row) and [B, T, K] input."""
    torch.manual_seed(2)
    w = torch.randn(40, 7)
    buf = torch.full((9, 8), float("nan"))
    buf[:, :7] = torch.randn(9, 7)
    lin = PanelLinearF32(w, None, level)
    got = lin(buf[:, :7])
    assert torch.isfinite(got).all()
    check_close(got, buf[:, :7], w)
    x3 = torch.randn(2, 3, 7)
    assert lin(x3).shape == (2, 3, 40)
    check_close(lin(x3).reshape(6, 40), x3.reshape(6, 7), w)
    assert lin(torch.empty(0, 7)).shape == (0, 40)
    with pytest.raises(TypeError):
        lin(torch.randn(2, 7, dtype=torch.float64))


def test_pack_layout():
    """Panel p, k, column c holds W[NR p + c, k], zero past N."""
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    packed = pack_panels_f32(w, 16)
    assert packed.shape == (2, 3, 16)
    assert packed[1, 2, 3] == w[19, 2] and packed[0, 1, 7] == w[7, 1]
    assert (packed[1, :, 4:] == 0).all()


@pytest.mark.parametrize("level", level_params)
@pytest.mark.parametrize("rows", [1, 6, 13, 100])
def test_silu_epilogue_matches_torch(level, rows):
    torch.manual_seed(rows)
    lib = load_gemm_f32(level)
    panel = lib.gemm_f32_panel()
    for inter, k in [(2 * panel, 64), (3 * panel, 300)]:
        w = torch.randn(2 * inter, k) * 0.2
        x = torch.randn(rows, k)
        lin = PanelLinearF32(w, None, level)
        # the kernel's own path, not the fallback
        out = torch.empty(rows, inter)
        assert lib.gemm_f32_silu(x.data_ptr(), rows, k, k, lin.packed.data_ptr(), 2 * inter, out.data_ptr(),
                                 inter) == 0
        gate_up = F.linear(x.double(), w.double())
        want = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lin.silu_mul(x.view(rows, 1, k)).view(rows, inter), out, rtol=0, atol=0)


@pytest.mark.parametrize("level", level_params)
def test_silu_off_the_panel_boundary_falls_back(level):
    torch.manual_seed(3)
    w, x = torch.randn(2 * 5, 16), torch.randn(4, 16)  # 5 columns a half: not a panel multiple
    lin = PanelLinearF32(w, None, level)
    assert lin.lib.gemm_f32_silu(x.data_ptr(), 4, 16, 16, lin.packed.data_ptr(), 10, x.data_ptr(), 5) == -2
    gu = F.linear(x, w)
    torch.testing.assert_close(lin.silu_mul(x), F.silu(gu[:, :5]) * gu[:, 5:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("level", level_params)
@pytest.mark.parametrize("shape", [(1, 3), (37, 5), (1000, 64), (3000, 40)], ids=str)
def test_argmax_matches_torch(level, shape):
    n, k = shape
    torch.manual_seed(n + k)
    # small integers: exact sums, so the argmax is comparable bit for bit, with many ties
    w = torch.randint(-2, 3, (n, k)).float()
    lin = PanelLinearF32(w, None, level)
    for m in [1, 5, 13, 70]:
        x = torch.randint(-2, 3, (m, k)).float()
        assert torch.equal(lin.argmax(x), F.linear(x, w).argmax(-1)), (m, n, k)
    # real-valued: the kernel's own logits, reduced by torch, against its argmax
    x = torch.randn(9, k)
    wr = torch.randn(n, k)
    lin = PanelLinearF32(wr, None, level)
    assert torch.equal(lin.argmax(x), lin(x).argmax(-1))


@pytest.mark.parametrize("level", level_params)
def test_argmax_ties_take_the_first_index(level):
    """Duplicate rows of W give equal logits: the first column wins, across panels and
    across the threads' column ranges; an all-zero x ties every column (index 0)."""
    torch.manual_seed(4)
    w = torch.randn(300, 16)
    w[250] = w[3]
    w[120] = w[3] * 1.0
    x = w[3:4] * 5  # column 3's logit is the largest
    lin = PanelLinearF32(w, None, level)
    logits = lin(x)
    assert logits[0, 3] == logits[0, 120] == logits[0, 250]
    assert lin.argmax(x).item() == 3 and logits.argmax(-1).item() == 3
    assert lin.argmax(torch.zeros(2, 16)).tolist() == [0, 0]
    with pytest.raises(ValueError):
        PanelLinearF32(w, torch.zeros(300), level).argmax(x)


@pytest.mark.parametrize("level", level_params)
@pytest.mark.parametrize("rows", [1, 7, 70])
@pytest.mark.parametrize("nan_cols", [(2900,), (37, 2900), (2900, 2950)], ids=str)
def test_argmax_takes_the_first_nan_as_torch_argmax_does(level, rows, nan_cols):
    """torch.argmax ranks NaN above every number: the first NaN column wins over a larger
    finite output before it and over a later NaN, in any panel and either thread's columns."""
    torch.manual_seed(5)
    w = torch.randn(3000, 16)
    x = torch.randn(rows, 16).abs() + 0.1
    w[5] = 50.0  # far the largest finite output of every row
    for c in nan_cols:
        w[c, 3] = float("nan")
    lin = PanelLinearF32(w, None, level)
    want = F.linear(x, w).argmax(-1)
    assert (want == nan_cols[0]).all()  # torch's own rule, which the kernel follows
    assert torch.equal(lin.argmax(x), want)


def test_kernel_raw_entry_points_take_null_bias():
    lib = load_gemm_f32()
    w, x = torch.randn(16, 4), torch.randn(3, 4)
    packed = pack_panels_f32(w, lib.gemm_f32_panel())
    out = torch.empty(3, 16)
    assert lib.gemm_f32(x.data_ptr(), 3, 4, 4, packed.data_ptr(), 16, None, out.data_ptr(), 16) == 0
    check_close(out, x, w)
    assert lib.gemm_f32(ctypes.c_void_p(0), 0, 4, 4, packed.data_ptr(), 16, None, out.data_ptr(), 16) == 0



def test_one_thread_gives_the_same_bits():
    """The split follows the team's real size (one thread here, as inside another
    parallel region): every panel is still computed, to the same bits."""
    torch.manual_seed(5)
    w, x = torch.randn(300, 64), torch.randn(20, 64)
    lin = PanelLinearF32(w, torch.randn(300))
    plain, gate_up = PanelLinearF32(w, None), PanelLinearF32(w[:2 * 16 * 6], None)
    want, want_tok, want_silu = lin(x), plain.argmax(x), gate_up.silu_mul(x)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(lin(x), want)
        assert torch.equal(plain.argmax(x), want_tok)
        assert torch.equal(gate_up.silu_mul(x), want_silu)
    finally:
        torch.set_num_threads(n)
