"""The Triton attention kernels against dense float64 attention and the torch reference backend.

Without a GPU the kernels run on CPU tensors through Triton's interpreter
(``TRITON_INTERPRET=1``, set here before the kernel modules are imported); on a
CUDA machine the same tests run the compiled kernels. Shapes stay small so the
interpreter finishes the file in well under a minute on two cores.
"""
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the @triton.jit decorations

pytest.importorskip("triton")

from inflight.attention.base import AttentionMetadata  # noqa: E402
from inflight.attention.torch_ref import TorchAttentionBackend  # noqa: E402
from inflight.attention.torch_ref import write_kv as torch_write_kv  # noqa: E402
from inflight.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from inflight.attention.triton.decode import choose_num_splits, paged_decode  # noqa: E402
from inflight.attention.triton.write_kv import write_kv  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GQA = [(4, 4), (6, 2), (8, 1)]  # query heads per KV head: 1, 3, 8
DTYPES = [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)]


def dense(q, keys, vals, scale, causal_offset=None):
    """q [M, H, D] over keys/vals [L, KVH, D] in float64; row i sees keys <= causal_offset + i."""
    h, kvh = q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(h // kvh, dim=1)
    v = vals.double().repeat_interleave(h // kvh, dim=1)
    s = torch.einsum("mhd,lhd->hml", q.double(), k) * scale
    if causal_offset is not None:
        pos = torch.arange(q.shape[0])[:, None] + causal_offset
        s = s.masked_fill(torch.arange(keys.shape[0])[None, :] > pos, float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, -1), v)


def paged_layout(g, lens, block_size, kvh, dim, dtype, spare=3):
    """Random caches and block tables (blocks scattered over the pool) for contexts ``lens``."""
    max_blocks = max(math.ceil(n / block_size) for n in lens)
    num_blocks = len(lens) * max_blocks + spare
    kc = torch.randn(num_blocks, block_size, kvh, dim, generator=g).to(dtype)
    vc = torch.randn(num_blocks, block_size, kvh, dim, generator=g).to(dtype)
    bt = torch.randperm(num_blocks, generator=g)[:len(lens) * max_blocks].view(len(lens), max_blocks)
    return kc, vc, bt


def context(cache, bt_row, n):
    return cache[bt_row[:math.ceil(n / cache.shape[1])]].flatten(0, 1)[:n]


def to_dev(*ts):
    return [t.to(DEV) for t in ts]


def test_write_kv_matches_torch_reference_and_skips_padding():
    g = torch.Generator().manual_seed(0)
    kvh, dim, bs, nb = 3, 32, 16, 6
    for dtype in (torch.float32, torch.bfloat16):
        k, v = torch.randn(9, kvh, dim, generator=g).to(dtype), torch.randn(9, kvh, dim, generator=g).to(dtype)
        slots = torch.randperm(nb * bs, generator=g)[:9]
        slots[4] = -1  # a CUDA-graph padding row
        kc, vc = torch.randn(nb, bs, kvh, dim, generator=g).to(dtype), torch.randn(nb, bs, kvh, dim).to(dtype)
        want_k, want_v = kc.clone(), vc.clone()
        keep = slots >= 0
        torch_write_kv(k[keep], v[keep], want_k, want_v, slots[keep])
        got_k, got_v, dk, dv, ds = to_dev(kc, vc, k, v, slots)
        write_kv(dk, dv, got_k, got_v, ds)
        assert torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)


def test_write_kv_strided_input_and_dtype_cast():
    """K/V arrive as strided views of the fused qkv projection; the cache may be narrower."""
    g = torch.Generator().manual_seed(1)
    kvh, dim = 2, 32
    qkv = torch.randn(5, (4 + 2 * kvh) * dim, generator=g)
    v = qkv[:, (4 + kvh) * dim:].view(5, kvh, dim)  # non-contiguous in tokens
    kc = torch.zeros(2, 16, kvh, dim, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([3, 17, 0, 30, 8])
    want = vc.clone()
    torch_write_kv(v, v, want.clone(), want, slots)
    dv, dkc, dvc, ds = to_dev(v, kc, vc, slots)
    write_kv(dv, dv, dkc, dvc, ds)
    # One bfloat16 ulp: the interpreter rounds float32 -> bfloat16 toward zero, the GPU to nearest.
    torch.testing.assert_close(dvc.cpu().float(), want.float(), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("heads,kv_heads", GQA)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_paged_decode_matches_dense(heads, kv_heads, block_size, dtype, tol):
    g = torch.Generator().manual_seed(heads * 7 + block_size)
    dim = 64 if kv_heads > 1 else 32
    lens = [1, 37, 90, 16 * 3]  # ragged, incl. a one-token context and an exact block multiple
    kc, vc, bt = paged_layout(g, lens, block_size, kv_heads, dim, dtype)
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
    scale = dim ** -0.5
    want = torch.stack([dense(q[i:i + 1], context(kc, bt[i], n), context(vc, bt[i], n), scale)[0]
                        for i, n in enumerate(lens)])
    dq, dkc, dvc, dbt, dlens = to_dev(q, kc, vc, bt, torch.tensor(lens))
    for splits in (1, 3):  # direct write, and split-K with an empty trailing split for short rows
        got = paged_decode(dq, dkc, dvc, dbt, dlens, scale, num_splits=splits)
        assert got.dtype == dtype and got.shape == q.shape
        torch.testing.assert_close(got.cpu().double(), want, atol=tol, rtol=tol)


def test_paged_decode_padding_rows_give_zeros():
    g = torch.Generator().manual_seed(3)
    kc, vc, bt = paged_layout(g, [20, 20], 16, 2, 32, torch.float32)
    q = torch.randn(2, 4, 32, generator=g)
    dq, dkc, dvc, dbt, dlens = to_dev(q, kc, vc, bt, torch.tensor([20, 0]))
    for splits in (1, 2):
        got = paged_decode(dq, dkc, dvc, dbt, dlens, 0.2, num_splits=splits).cpu()
        assert torch.isfinite(got).all() and torch.equal(got[1], torch.zeros(4, 32))


def make_mixed_batch(g, decode_lens, chunks, heads, kvh, dim, bs, dtype):
    """Decodes (context lens) then prefill chunks (prefix, chunk) with their K/V not yet cached."""
    reqs = [(n - 1, 1) for n in decode_lens] + list(chunks)
    seq_lens = [p + c for p, c in reqs]
    kc, vc, bt = paged_layout(g, seq_lens, bs, kvh, dim, dtype)
    qsl = [0]
    for _, c in reqs:
        qsl.append(qsl[-1] + c)
    slots = []
    for i, (p, c) in enumerate(reqs):
        slots += [int(bt[i, pos // bs]) * bs + pos % bs for pos in range(p, p + c)]
    T = qsl[-1]
    q, k, v = (torch.randn(T, h, dim, generator=g).to(dtype) for h in (heads, kvh, kvh))
    md = AttentionMetadata(slot_mapping=torch.tensor(slots), block_tables=bt, seq_lens=torch.tensor(seq_lens),
                           query_start_loc_list=qsl, seq_lens_list=seq_lens, num_decodes=len(decode_lens),
                           block_size=bs, max_decode_seq_len=max(decode_lens, default=0))
    return q, k, v, kc, vc, md


def md_to(md, dev):
    return AttentionMetadata(md.slot_mapping.to(dev), md.block_tables.to(dev), md.seq_lens.to(dev),
                             md.query_start_loc_list, md.seq_lens_list, md.num_decodes, md.block_size,
                             md.max_decode_seq_len)


@pytest.mark.parametrize("heads,kv_heads", GQA)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_prefill_over_cached_prefix_matches_dense(heads, kv_heads, block_size, dtype, tol):
    """Chunks with no prefix, a prefix ending mid-block, and one longer than a query tile."""
    g = torch.Generator().manual_seed(heads * 13 + block_size)
    dim = 32
    q, k, v, kc, vc, md = make_mixed_batch(g, [], [(0, 21), (19, 7), (40, 35)], heads, kv_heads, dim,
                                           block_size, dtype)
    scale = dim ** -0.5
    # Expected: the caches after the write, dense causal attention over each request's context.
    kc_after, vc_after = kc.clone(), vc.clone()
    torch_write_kv(k, v, kc_after, vc_after, md.slot_mapping)
    got = TritonAttentionBackend().forward(*to_dev(q, k, v, kc, vc), md_to(md, DEV), scale).cpu()
    qsl = md.query_start_loc_list
    for i, n in enumerate(md.seq_lens_list):
        s, e = qsl[i], qsl[i + 1]
        want = dense(q[s:e], context(kc_after, md.block_tables[i], n), context(vc_after, md.block_tables[i], n),
                     scale, causal_offset=n - (e - s))
        torch.testing.assert_close(got[s:e].double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_mixed_step_matches_torch_backend(dtype, tol):
    """A whole step (decodes first, then chunks) through both backends: same outputs, same caches."""
    g = torch.Generator().manual_seed(5)
    q, k, v, kc, vc, md = make_mixed_batch(g, [5, 300, 17], [(0, 9), (33, 12)], 6, 2, 64, 16, dtype)
    want_kc, want_vc = kc.clone(), vc.clone()
    want = TorchAttentionBackend().forward(q, k, v, want_kc, want_vc, md, 0.125)
    dkc, dvc = to_dev(kc, vc)
    backend = TritonAttentionBackend()
    got = backend.forward(*to_dev(q, k, v), dkc, dvc, md_to(md, DEV), 0.125)
    assert backend.num_splits_for(q, 3, 2, 300) > 1  # the 300-token decode took the split-K path
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=tol, rtol=tol)
    assert torch.equal(dkc.cpu(), want_kc) and torch.equal(dvc.cpu(), want_vc)


def test_choose_num_splits():
    assert choose_num_splits(256, 8, 4096) == 1  # a full batch fills the GPU without splitting
    assert choose_num_splits(1, 8, 100) == 1  # short context: not worth a second pass
    assert choose_num_splits(1, 8, 8192) == 16  # one long request: split up to the cap
    assert choose_num_splits(4, 8, 1024) == 4  # at least 256 tokens per split


def test_backend_falls_back_where_kernels_do_not_apply():
    from inflight.attention.kv_quant import FP8KVCache

    backend = TritonAttentionBackend()
    q = torch.zeros(1, 4, 32, device=DEV)
    assert backend.supports(q, torch.zeros(2, 16, 2, 32, device=DEV))
    assert not backend.supports(q, FP8KVCache.zeros((2, 16, 2, 32), torch.float32, DEV))
    assert not backend.supports(q, torch.zeros(2, 16, 3, 32, device=DEV))  # 4 heads over 3 KV heads


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile the kernels for real")
def test_kernels_compile_for_hopper_without_a_gpu():
    """The interpreter accepts things the compiler rejects (tile shapes, dtypes): compile every
    bf16 variant for sm_90 ahead of time, in a process without TRITON_INTERPRET."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    res = subprocess.run([sys.executable, "-m", "inflight.attention.triton.compile_check", "--dtypes", "bf16"],
                         env=env, capture_output=True, text=True, timeout=300)
    if res.returncode == 3:
        pytest.skip(f"no ahead-of-time compilation here: {res.stderr.strip()[:200]}")
    assert res.returncode == 0, res.stdout + res.stderr
