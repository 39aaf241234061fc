"""The fused bf16 CPU element-wise ops against the torch ops they replace; the direct
kernel calls at every ISA level this CPU runs, and at AVX-512-BF16 emulated where it lacks
it (isa_levels.py), each library built for its level."""
import pytest
import torch
import torch.nn.functional as F

from inflight.kernels.cpu.fused import load_fused_ops
from isa_levels import kernel_test_levels, level_id
from inflight.layers.layernorm import LayerNorm, QKNorm, RMSNorm
from inflight.layers.rotary import apply_rope

OPS = load_fused_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason="no C compiler")
BF16 = torch.bfloat16
LEVELS = [pytest.param(lv, id=level_id(lv)) for lv in kernel_test_levels()] if OPS is not None else []


def close(a: torch.Tensor, b: torch.Tensor, max_mismatch: float) -> None:
    """Equal to bf16 rounding: at most ``max_mismatch`` of elements differ, by one bf16 ulp-ish."""
    torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=1.6e-2)
    assert (a != b).float().mean() <= max_mismatch


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rmsnorm_matches_torch(rows, with_residual):
    torch.manual_seed(rows)
    norm = RMSNorm(576, 1e-5).to(BF16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(rows, 576, dtype=BF16) * 3
    res = torch.randn(rows, 576, dtype=BF16) if with_residual else None
    want_out, want_res = norm(x, None if res is None else res.clone())
    norm.dispatch_to("cpu")  # the C kernel, as the CPU platform sets it
    got_out, got_res = norm(x.clone(), None if res is None else res.clone())
    close(got_out, want_out, 0.01)
    assert torch.equal(got_res, want_res)  # the bf16 sum is exact either way


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 7, 100])
@pytest.mark.parametrize("d", [64, 48])  # 48: a 16-wide vector then a scalar tail per half
def test_rope_in_place_matches_torch(level, rows, d):
    torch.manual_seed(rows)
    nh, nkv = 9, 3
    qkv = torch.randn(rows, (nh + 2 * nkv) * d, dtype=BF16)
    ang = torch.rand(rows, 1, d, dtype=torch.float32) * 6
    cos, sin = ang.cos().to(BF16), ang.sin().to(BF16)
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    want_q, want_k = apply_rope(q.reshape(rows, nh, d), k.reshape(rows, nkv, d), cos, sin)
    got = qkv.clone()
    load_fused_ops(level).rope_(got, nh, nkv, d, cos, sin)
    gq, gk, gv = got.split([nh * d, nkv * d, nkv * d], dim=-1)
    close(gq.reshape(rows, nh, d), want_q, 0.01)
    close(gk.reshape(rows, nkv, d), want_k, 0.01)
    assert torch.equal(gv, v)  # values are not rotated


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 33])
def test_silu_mul_matches_torch(level, rows):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 1536, dtype=BF16) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate.float()).to(BF16) * up
    close(load_fused_ops(level).silu_mul(gate_up), want, 0.01)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rmsnorm_kernel_at_every_level(level, rows, with_residual):
    """add_rmsnorm_bf16 called directly, against the torch RMSNorm (as test_add_rmsnorm_matches_torch)."""
    torch.manual_seed(rows + 10)
    norm = RMSNorm(576, 1e-5).to(BF16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(rows, 576, dtype=BF16) * 3
    res = torch.randn(rows, 576, dtype=BF16) if with_residual else None
    want_out, want_res = norm(x, None if res is None else res.clone())
    got_out, got_res = load_fused_ops(level).add_rmsnorm(x.clone(), None if res is None else res.clone(),
                                                         norm.weight.detach(), 1e-5)
    close(got_out, want_out, 0.01)
    assert torch.equal(got_res, want_res)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows", [1, 7])
def test_rmsnorm_heads_kernel_matches_torch(level, rows):
    """Qwen3's per-head q/k norm in place: the model's torch op (QKNorm natively) to bf16
    rounding, each head bit for bit as add_rmsnorm_bf16 of that head alone; v untouched."""
    torch.manual_seed(rows + 20)
    nh, nkv, d = 6, 2, 128
    qkv = torch.randn(rows, (nh + 2 * nkv) * d, dtype=BF16) * 3
    q_norm, k_norm = RMSNorm(d, 1e-6).to(BF16), RMSNorm(d, 1e-6).to(BF16)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    want = QKNorm(nh, nkv, d)(qkv, q_norm, k_norm)  # forward_native: plain torch
    ops = load_fused_ops(level)
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    per_head = torch.cat([ops.add_rmsnorm(q.reshape(-1, d), None, q_norm.weight.detach(), 1e-6)[0].view(rows, -1),
                          ops.add_rmsnorm(k.reshape(-1, d), None, k_norm.weight.detach(), 1e-6)[0].view(rows, -1),
                          v], dim=-1)
    got = qkv.clone()
    ops.rmsnorm_heads_(got, nh, nkv, d, q_norm.weight.detach(), k_norm.weight.detach(), 1e-6)
    close(got, want, 0.01)
    assert torch.equal(got, per_head)
    assert torch.equal(got[:, (nh + nkv) * d:], v)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rows,dim", [(1, 768), (5, 384), (7, 100)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_layernorm_kernel_at_every_level(level, rows, dim, with_residual):
    """add_layernorm_bf16 (BERT's post-norm, StableLM's norms) against the torch LayerNorm in
    float32 cast back: the bf16 sum exactly, the normed rows to bf16 rounding; a row whose mean
    is far from zero (the variance is taken about the mean, not as E[x^2] - mean^2)."""
    torch.manual_seed(rows + dim)
    norm = LayerNorm(dim, 1e-12).to(BF16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    x = torch.randn(rows, dim, dtype=BF16) * 3 + 40
    res = torch.randn(rows, dim, dtype=BF16) if with_residual else None
    want_out, want_res = norm(x, None if res is None else res.clone())
    got_out, got_res = load_fused_ops(level).add_layernorm_bf16(
        x.clone(), None if res is None else res.clone(), norm.weight.detach(), norm.bias.detach(), 1e-12)
    close(got_out, want_out, 0.02)
    assert torch.equal(got_res, want_res)
    norm.dispatch_to("cpu")  # the layer takes the kernel on the CPU in bf16
    layer_out, _ = norm(x.clone(), None if res is None else res.clone())
    close(layer_out, want_out, 0.02)
