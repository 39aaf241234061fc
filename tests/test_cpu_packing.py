"""Prepacked bf16 linears give what nn.Linear gives, at every row count: our panel
GEMM at every ISA level this CPU runs, and oneDNN's prepacked linear where its bf16
path runs (AVX-512 or AVX-NE-CONVERT CPUs)."""
import pytest
import torch
from torch import nn

from inflight.kernels.cpu.isa import supported_levels
from inflight.kernels.cpu.packing import PackedLinear, can_pack, pack_linears

from test_cpu_gemm import panel_linear

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="no C compiler and no oneDNN bf16 support")


def _onednn_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


KINDS = [pytest.param(lv, id=f"panel-{lv.name}") for lv in supported_levels()]
if _onednn_bf16():
    KINDS.append(pytest.param(None, id="onednn"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(kind, rows, bias):
    """kind: the ISA level of our panel GEMM, or None for oneDNN's PackedLinear."""
    torch.manual_seed(rows)
    lin = nn.Linear(96, 160, bias=bias).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    packed = PackedLinear(lin.weight, lin.bias) if kind is None else panel_linear(lin.weight, lin.bias, kind)
    with torch.inference_mode():
        want, got = lin(x).float(), packed(x).float()
        got3 = packed(x.view(1, rows, 96)).float()  # leading dims are kept
    assert got.shape == want.shape and got3.shape == (1, rows, 160)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got3[0], got)


def test_pack_linears_replaces_every_linear_and_keeps_the_output():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Sequential(nn.Linear(64, 16, bias=False))).to(torch.bfloat16)
    x = torch.randn(5, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = model(x).float()
        assert pack_linears(model) == 2
        got = model(x).float()
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
