"""The float32 CPU kernels (fused element-wise ops, paged decode and paged prefill
attention, all written against csrc/vec.h) on every ISA level this machine runs,
against torch's float32 ops and the torch reference attention backend."""
import math

import pytest
import torch
import torch.nn.functional as F

from inflight.attention.base import AttentionMetadata
from inflight.attention.cpu_paged import CpuPagedAttentionBackend
from inflight.attention.torch_ref import TorchAttentionBackend
from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.fused import CpuFusedOps
from inflight.kernels.cpu.isa import machine_arch, supported_levels
from inflight.layers.layernorm import QKNorm, RMSNorm

LEVELS = supported_levels()
F32 = torch.float32


def test_every_x86_level_up_to_avx2_is_here():
    """On an x86-64 machine with AVX2 none of these tests may skip: both levels build."""
    names = [lv.name for lv in LEVELS]
    assert names, "no ISA level on this machine"
    if machine_arch() == "x86_64":
        assert names[:2] == ["scalar", "avx2"] or names == ["scalar"]


def _lib(name, level):
    lib = load_library(name, level)
    assert lib is not None, f"{name} did not build for {level.name}"
    return lib


@pytest.fixture(params=LEVELS, ids=lambda lv: lv.name)
def ops(request):
    return CpuFusedOps(_lib("fused_ops", request.param))


@pytest.fixture(params=LEVELS, ids=lambda lv: lv.name)
def backend(request):
    return CpuPagedAttentionBackend(_lib("paged_decode", request.param), _lib("paged_prefill", request.param))


def rmsnorm_ref(x, residual, weight, eps):
    """The model's RMSNorm (forward_native) in float32: (norm(x + residual), x + residual)."""
    if residual is not None:
        x = x + residual
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)), x


def apply_rope(q, k, cos, sin):
    """The model's rotate-half RoPE."""
    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def close(got, want, tol=1e-6):
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


# ---- fused element-wise ops ----

@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("dim", [576, 100])  # 100: not a multiple of 8 or 16, a tail per row
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rmsnorm_f32_matches_torch(ops, rows, dim, with_residual):
    torch.manual_seed(rows + dim)
    weight = torch.empty(dim).uniform_(0.5, 1.5)
    x = torch.randn(rows, dim) * 3
    res = torch.randn(rows, dim) if with_residual else None
    want_out, want_res = rmsnorm_ref(x, res, weight, 1e-5)
    got_res_in = None if res is None else res.clone()
    got_out, got_res = ops.add_rmsnorm(x.clone(), got_res_in, weight, 1e-5)
    assert got_out.dtype == F32
    close(got_out, want_out)
    assert torch.equal(got_res, want_res)  # the float32 sum is the same operation
    if res is not None:
        assert got_res.data_ptr() == got_res_in.data_ptr()  # written into the residual in place


@pytest.mark.parametrize("rows", [1, 7, 100])
@pytest.mark.parametrize("d", [64, 80, 36])  # 80: half 40, a tail on AVX-512; 36: half 18, tails everywhere
def test_rope_f32_in_place_matches_torch(ops, rows, d):
    torch.manual_seed(rows + d)
    nh, nkv = 9, 3
    qkv = torch.randn(rows, (nh + 2 * nkv) * d)
    ang = torch.rand(rows, 1, d) * 6
    cos, sin = ang.cos(), ang.sin()
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    want_q, want_k = apply_rope(q.reshape(rows, nh, d), k.reshape(rows, nkv, d), cos, sin)
    got = qkv.clone()
    ops.rope_(got, nh, nkv, d, cos, sin)
    gq, gk, gv = got.split([nh * d, nkv * d, nkv * d], dim=-1)
    close(gq.reshape(rows, nh, d), want_q)
    close(gk.reshape(rows, nkv, d), want_k)
    assert torch.equal(gv, v)  # values are not rotated


def test_rope_f32_strided_rows(ops):
    """Rows of a wider buffer (the fused qkv output inside a larger allocation)."""
    torch.manual_seed(1)
    nh, nkv, d, rows = 4, 2, 64, 9
    buf = torch.randn(rows, (nh + 2 * nkv) * d + 40)
    qkv = buf[:, :(nh + 2 * nkv) * d]
    ang = torch.rand(rows, 1, d) * 6
    q, k = qkv[:, :nh * d].reshape(rows, nh, d), qkv[:, nh * d:(nh + nkv) * d].reshape(rows, nkv, d)
    want_q, want_k = apply_rope(q, k, ang.cos(), ang.sin())
    tail = buf[:, (nh + 2 * nkv) * d:].clone()
    ops.rope_(qkv, nh, nkv, d, ang.cos(), ang.sin())
    close(qkv[:, :nh * d].reshape(rows, nh, d), want_q)
    close(qkv[:, nh * d:(nh + nkv) * d].reshape(rows, nkv, d), want_k)
    assert torch.equal(buf[:, (nh + 2 * nkv) * d:], tail)


@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("inter", [1536, 100])
def test_silu_mul_f32_matches_torch(ops, rows, inter):
    torch.manual_seed(rows + inter)
    gate_up = torch.randn(rows, 2 * inter) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    close(ops.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("d", [128, 36])  # 36: a tail on every level
def test_rmsnorm_heads_f32_matches_torch(ops, rows, d):
    """Qwen3's per-head q/k norm in place on strided qkv rows: the model's torch op (QKNorm
    natively), and bit for bit each head as add_rmsnorm of that head alone (the C RMSNorm the
    Python loop ran per head before), v and the gap after the row untouched."""
    torch.manual_seed(rows + d)
    nh, nkv = 6, 2
    width = (nh + 2 * nkv) * d
    buf = torch.randn(rows, width + 5) * 3
    qkv = buf[:, :width]
    q_norm, k_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    want = QKNorm(nh, nkv, d)(qkv, q_norm, k_norm)  # forward_native: plain torch
    q, k, v = qkv.split([nh * d, nkv * d, nkv * d], dim=-1)
    per_head = torch.cat([ops.add_rmsnorm(q.reshape(-1, d), None, q_norm.weight.detach(), 1e-6)[0].view(rows, -1),
                          ops.add_rmsnorm(k.reshape(-1, d), None, k_norm.weight.detach(), 1e-6)[0].view(rows, -1),
                          v], dim=-1)
    got = buf.clone()
    ops.rmsnorm_heads_(got[:, :width], nh, nkv, d, q_norm.weight.detach(), k_norm.weight.detach(), 1e-6)
    close(got[:, :width], want)
    assert torch.equal(got[:, :width], per_head)
    assert torch.equal(got[:, (nh + nkv) * d:], buf[:, (nh + nkv) * d:])


# ---- paged attention ----

def make_step(seed, heads, kv_heads, dim, block_size, chunks):
    """A step of decodes then prefill chunks over a random paged pool: ``chunks`` is
    (cached tokens, new tokens) per request, decodes (new == 1) first. Returns q, k, v of
    the new tokens, the pool with the cached prefixes written, and the metadata."""
    g = torch.Generator().manual_seed(seed)
    totals = [c + n for c, n in chunks]
    max_blocks = max(math.ceil(t / block_size) for t in totals)
    num_blocks = len(chunks) * max_blocks + 3
    kc = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)  # garbage in unused slots
    vc = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[:len(chunks) * max_blocks].view(len(chunks), max_blocks)
    qs, ks, vs, slots, qsl = [], [], [], [], [0]
    for i, (cached, new) in enumerate(chunks):
        keys = torch.randn(cached + new, kv_heads, dim, generator=g)
        vals = torch.randn(cached + new, kv_heads, dim, generator=g)
        pos = torch.arange(cached + new)
        slot = tables[i, pos // block_size] * block_size + pos % block_size
        kc.view(-1, kv_heads, dim)[slot[:cached]] = keys[:cached]
        vc.view(-1, kv_heads, dim)[slot[:cached]] = vals[:cached]
        slots.append(slot[cached:])
        qs.append(torch.randn(new, heads, dim, generator=g) * 2)
        ks.append(keys[cached:]), vs.append(vals[cached:])
        qsl.append(qsl[-1] + new)
    md = AttentionMetadata(slot_mapping=torch.cat(slots), block_tables=tables, seq_lens=torch.tensor(totals),
                           query_start_loc_list=qsl, seq_lens_list=totals,
                           num_decodes=sum(1 for _, n in chunks if n == 1), block_size=block_size,
                           max_decode_seq_len=max([t for t, (_, n) in zip(totals, chunks) if n == 1], default=0))
    return torch.cat(qs), torch.cat(ks), torch.cat(vs), kc, vc, md


def no_fallback(monkeypatch):
    """Make the torch reference paths raise: the C backend must not use them for float32."""
    def boom(*a, **k):
        raise AssertionError("fell back to the torch reference")
    monkeypatch.setattr(TorchAttentionBackend, "_prefill", staticmethod(boom))
    monkeypatch.setattr(TorchAttentionBackend, "_decode", staticmethod(boom))


# decodes (contexts of 1, below and across 64-key tiles), chunks with no cache, chunks
# over a cached prefix (chunked prefill) of ragged lengths around the 64-row work items
# and 64-key tiles, and short chunks (speculative draft rows) over long prefixes
MIXED = [(0, 1), (40, 1), (63, 1), (64, 1), (300, 1), (0, 5), (0, 77), (33, 31), (100, 65), (0, 130), (513, 40),
         (300, 5), (61, 3), (127, 2)]


@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(9, 3, 64, 16), (8, 8, 64, 5), (8, 1, 128, 16),
                                                           (6, 2, 80, 5), (4, 2, 96, 16), (16, 1, 36, 5)])
def test_mixed_step_matches_torch_reference(backend, monkeypatch, heads, kv_heads, dim, block_size):
    q, k, v, kc, vc, md = make_step(heads * 7 + dim + block_size, heads, kv_heads, dim, block_size, MIXED)
    scale = dim ** -0.5
    kc2, vc2 = kc.clone(), vc.clone()
    want = TorchAttentionBackend().forward(q, k, v, kc2, vc2, md, scale)
    no_fallback(monkeypatch)
    got = backend.forward(q, k, v, kc, vc, md, scale)
    assert got.dtype == F32 and got.shape == q.shape
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the C K/V write put the same rows in the same slots
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_qkv_views(backend, monkeypatch):
    """q, k, v as strided views into one [T, (H + 2 KVH) D] tensor, as the model passes them."""
    heads, kv_heads, dim = 9, 3, 64
    chunks = [(20, 1), (200, 1), (0, 70), (90, 33)]
    q, k, v, kc, vc, md = make_step(5, heads, kv_heads, dim, 16, chunks)
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
    qv, kv_, vv = (t.view(-1, n, dim) for t, n in zip(qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], 1),
                                                      (heads, kv_heads, kv_heads)))
    assert not qv.is_contiguous()
    want = TorchAttentionBackend().forward(q, k, v, kc.clone(), vc.clone(), md, 0.125)
    no_fallback(monkeypatch)
    torch.testing.assert_close(backend.forward(qv, kv_, vv, kc, vc, md, 0.125), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_seqs", [1, 3, 32])
def test_decode_long_contexts(backend, monkeypatch, num_seqs):
    """Decode only, contexts up to 1,500 tokens (many 64-key tiles of the online softmax),
    queries scaled up so the running max moves a lot between tiles."""
    g = torch.Generator().manual_seed(num_seqs)
    lens = torch.randint(1, 1500, (num_seqs,), generator=g).tolist()
    q, k, v, kc, vc, md = make_step(num_seqs, 8, 2, 64, 16, [(n - 1, 1) for n in lens])
    q = q * 4
    want = TorchAttentionBackend()._decode(q, kc, vc, md, 0.125)
    no_fallback(monkeypatch)
    torch.testing.assert_close(backend._decode(q, kc, vc, md, 0.125), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 200])
@pytest.mark.parametrize("lens", [[129], [2, 128, 129, 257], [700, 64, 1]])
def test_decode_parts_of_few_sequences(backend, monkeypatch, lens, window):
    """Few decodes: each sequence's keys (those in its window) are cut into parts of at least
    128 keys whose softmax states merge after; contexts one key past a part, a part of one
    key, a single part."""
    q, k, v, kc, vc, md = make_step(sum(lens), 9, 3, 64, 16, [(n - 1, 1) for n in lens])
    q = q * 4
    want = TorchAttentionBackend()._decode(q, kc, vc, md, 0.125, sliding_window=window)
    no_fallback(monkeypatch)
    got = backend._decode(q, kc, vc, md, 0.125, sliding_window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,dim,block_size,window", [(9, 3, 64, 16, None), (9, 3, 64, 16, 37),
                                                                  (16, 1, 36, 5, None), (6, 2, 80, 5, 9)])
def test_decode_items_of_whole_sequences(backend, monkeypatch, heads, kv_heads, dim, block_size, window):
    """Twelve decodes: with up to three threads a work item is then a whole sequence (every
    kv head in one pass over its keys); the single decodes above take one kv head each."""
    lens = [1, 2, 17, 64, 65, 130, 200, 301, 9, 44, 128, 7]
    q, k, v, kc, vc, md = make_step(len(lens) + heads, heads, kv_heads, dim, block_size, [(n - 1, 1) for n in lens])
    want = TorchAttentionBackend()._decode(q, kc, vc, md, dim ** -0.5, sliding_window=window)
    no_fallback(monkeypatch)
    got = backend._decode(q, kc, vc, md, dim ** -0.5, sliding_window=window)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_prefill_over_long_cached_prefix(backend, monkeypatch):
    """One 300-token chunk over 700 cached tokens, GQA 4:1, and a lone short chunk."""
    q, k, v, kc, vc, md = make_step(11, 8, 2, 64, 16, [(700, 300), (1000, 4)])
    want = TorchAttentionBackend().forward(q, k, v, kc.clone(), vc.clone(), md, 0.125)
    no_fallback(monkeypatch)
    torch.testing.assert_close(backend.forward(q, k, v, kc, vc, md, 0.125), want, atol=1e-5, rtol=1e-5)
