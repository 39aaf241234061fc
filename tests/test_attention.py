"""Attention backends against a dense reference on random paged layouts; the C kernels
at every ISA level this CPU runs and at AVX-512-BF16 emulated where it lacks it
(isa_levels.py), each library built for its level."""
import ctypes
import math

import pytest
import torch

from inflight.attention.base import AttentionMetadata
from inflight.attention.cpu_paged import CpuPagedAttentionBackend
from inflight.kernels.cpu.build import load_library
from isa_levels import kernel_test_levels, level_id
from inflight.attention.torch_ref import TorchAttentionBackend


def dense_reference(q, keys, vals, scale):
    """q [H, D] over keys/vals [L, KVH, D]; plain softmax attention in float64."""
    h, kvh = q.shape[0], keys.shape[1]
    k = keys.double().repeat_interleave(h // kvh, dim=1)  # [L, H, D]
    v = vals.double().repeat_interleave(h // kvh, dim=1)
    s = torch.einsum("hd,lhd->hl", q.double(), k) * scale
    return torch.einsum("hl,lhd->hd", torch.softmax(s, -1), v)


def causal_reference(q, keys, vals, scale, cached):
    """dense_reference for a chunk's queries q [T, H, D] at once: query i sees keys
    [0, cached + i] of keys/vals [cached + T, KVH, D] (the cache plus the chunk up to itself)."""
    t, h, kvh = q.shape[0], q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(h // kvh, dim=1)  # [L, H, D]
    v = vals.double().repeat_interleave(h // kvh, dim=1)
    s = torch.einsum("thd,lhd->thl", q.double(), k) * scale
    visible = torch.arange(keys.shape[0])[None, :] <= cached + torch.arange(t)[:, None]  # [T, L]
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("thl,lhd->thd", torch.softmax(s, -1), v)


def assert_bf16_close(got, want):
    """A bf16 attention output against the float64 reference: each element within 3e-2
    (bf16 inputs, products and the output's rounding), and the whole output's relative
    RMS error under 0.6%. Rounding the exact result to bf16 alone gives about 0.17% (the C
    kernels 0.17-0.23%, torch's bf16 attention 0.43%), so a kernel that puts every output
    1% off fails, where the element check alone passes."""
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel < 6e-3, f"relative RMS error {rel:.2e} over {want.numel()} outputs (bf16 rounding alone: ~1.7e-3)"


def assert_close_for(dtype, got, want):
    """A kernel's output against the float64 reference: assert_bf16_close in bf16, 1e-5 in float32."""
    if dtype == torch.bfloat16:
        assert_bf16_close(got, want)
    else:
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def make_case(seed, num_seqs, heads, kv_heads, dim, block_size, dtype, max_len=300):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len, (num_seqs,), generator=g)
    max_blocks = math.ceil(int(lens.max()) / block_size)
    num_blocks = num_seqs * max_blocks + 3
    kc = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    vc = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)[:num_seqs * max_blocks].view(num_seqs, max_blocks)
    q = torch.randn(num_seqs, heads, dim, generator=g).to(dtype)
    md = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.int64), block_tables=perm, seq_lens=lens,
                           query_start_loc_list=list(range(num_seqs + 1)), seq_lens_list=lens.tolist(),
                           num_decodes=num_seqs, block_size=block_size, max_decode_seq_len=int(lens.max()))
    return q, kc, vc, md


def expected_decode(q, kc, vc, md, scale):
    out = []
    for i, n in enumerate(md.seq_lens_list):
        nb = math.ceil(n / md.block_size)
        keys = kc[md.block_tables[i, :nb]].flatten(0, 1)[:n]
        vals = vc[md.block_tables[i, :nb]].flatten(0, 1)[:n]
        out.append(dense_reference(q[i], keys, vals, scale))
    return torch.stack(out)


# the ISA levels whose kernels build here (none without a C compiler)
LEVELS = [lv for lv in kernel_test_levels() if load_library("paged_decode", lv) is not None]
LEVEL_PARAMS = [pytest.param(lv, id=level_id(lv)) for lv in LEVELS]
needs_c = pytest.mark.skipif(not LEVELS, reason="no C compiler")


def cpu_backend(level) -> CpuPagedAttentionBackend:
    """The C backend with both kernel libraries built for ``level``."""
    return CpuPagedAttentionBackend(load_library("paged_decode", level), load_library("paged_prefill", level))


# the emulated level runs the tests below, not this larger grid
BACKENDS = [pytest.param(None, id="torch"), *(pytest.param(lv, id=f"cpu-{lv.name}") for lv in LEVELS if not lv.emulated)]


@pytest.mark.parametrize("level", BACKENDS)
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 8), (8, 1), (4, 2)])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_decode_matches_dense(level, heads, kv_heads, block_size, dtype):
    q, kc, vc, md = make_case(heads * 31 + block_size, 7, heads, kv_heads, 64, block_size, dtype)
    scale = 64 ** -0.5
    backend = TorchAttentionBackend() if level is None else cpu_backend(level)
    got = backend._decode(q, kc, vc, md, scale)
    want = expected_decode(q, kc, vc, md, scale)
    assert got.shape == q.shape and got.dtype == dtype
    assert_close_for(dtype, got, want)


@needs_c
@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("dim", [32, 48, 128])  # 48: not a multiple of 32, the generic C path
@pytest.mark.parametrize("num_seqs", [1, 3, 12])  # few sequences cut into parts of keys, many run whole
@pytest.mark.parametrize("block_size", [16, 5])  # 5: parts start at block boundaries, not at whole tiles
def test_cpu_decode_bf16_head_dims_and_long_contexts(level, dim, num_seqs, block_size):
    """Contexts up to 1,200 tokens cross many 16-token chunks and several parts of the keys."""
    q, kc, vc, md = make_case(dim * 7 + num_seqs, num_seqs, 8, 2, dim, block_size, torch.bfloat16, max_len=1200)
    got = cpu_backend(level)._decode(q, kc, vc, md, dim ** -0.5)
    assert_bf16_close(got, expected_decode(q, kc, vc, md, dim ** -0.5))


def shared_prefix_case(heads, kv_heads, dim, dtype, group, block_size=16, shared=12):
    """40 decoding requests, the first ``group`` of them sharing their first ``shared`` blocks,
    with one only a token past the prefix and one sharing the last of those blocks in part."""
    q = make_case(heads, 40, heads, kv_heads, dim, block_size, dtype, max_len=100)[0]
    lens = torch.randint(1, 100, (40,), generator=torch.Generator().manual_seed(3))
    lens[:group] = shared * block_size + torch.randint(1, 90, (group,), generator=torch.Generator().manual_seed(1))
    lens[1] = shared * block_size + 1
    lens[2] = shared * block_size - 3  # the group shares one block less
    blocks = 1 + (int(lens.max()) - 1) // block_size
    num_blocks = 40 * blocks + 3
    g = torch.Generator().manual_seed(2)
    kc = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    vc = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[:40 * blocks].view(40, blocks)
    tables[1:group, :shared] = tables[0, :shared]
    md = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.int64), block_tables=tables, seq_lens=lens,
                           query_start_loc_list=list(range(41)), seq_lens_list=lens.tolist(),
                           num_decodes=40, block_size=block_size, max_decode_seq_len=int(lens.max()))
    return q, kc, vc, md


@needs_c
@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 8), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [36, 6])
def test_cpu_decode_with_requests_sharing_prefix_blocks(level, heads, kv_heads, dtype, group):
    """Requests whose tables start with the same blocks (prefix caching) are scored over the
    shared keys together: the same answer as each request alone, with requests outside the
    group, one only a token past the prefix, and one sharing part of a block. 36 requests
    take several passes over the prefix (a bf16 pass holds 32 query rows); 6 are a group
    only where a pass runs on AMX tiles (one tile of rows)."""
    q, kc, vc, md = shared_prefix_case(heads, kv_heads, 64, dtype, group)
    got = cpu_backend(level)._decode(q, kc, vc, md, 64 ** -0.5)
    want = expected_decode(q, kc, vc, md, 64 ** -0.5)
    assert_close_for(dtype, got, want)


@needs_c
@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("heads,kv_heads,group,on_tiles,elsewhere", [(9, 3, 36, 2, 2), (9, 3, 6, 1, 0),
                                                                     (8, 8, 36, 1, 1), (8, 8, 6, 0, 0)])
def test_cpu_decode_bf16_groups_the_requests_sharing_a_prefix(level, heads, kv_heads, group, on_tiles, elsewhere):
    """The bf16 kernel's plan: a group of 36 requests is cut into chunks of at most 64 query rows (two of
    3 query heads, one of 1) at both bf16 levels; 6 requests of 3 query heads fill the one A tile a group
    needs on AMX tiles and form no group at the dot-product level (32 rows), nor with 1 query head."""
    _, _, _, md = shared_prefix_case(heads, kv_heads, 64, torch.bfloat16, group)
    lib = load_library("paged_decode", level)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    n = lib.paged_decode_bf16_groups(p(md.block_tables.data_ptr()), i64(md.block_tables.stride(0)),
                                     p(md.seq_lens.data_ptr()), 40, heads, kv_heads, 16)
    want = {"amx_bf16": on_tiles, "avx512_bf16": elsewhere}.get(level.name, 0)
    assert n == want


@needs_c
@pytest.mark.parametrize("level", LEVEL_PARAMS)
def test_cpu_decode_bf16_sharing_a_prefix_with_wide_heads_and_odd_blocks(level):
    """head_dim 128 (two K tiles a key tile on AMX, eight V tiles) and blocks of 5 tokens: a
    prefix of 100 keys, not a whole number of 16-key tiles."""
    q, kc, vc, md = shared_prefix_case(8, 2, 128, torch.bfloat16, 12, block_size=5, shared=20)
    got = cpu_backend(level)._decode(q, kc, vc, md, 128 ** -0.5)
    assert_bf16_close(got, expected_decode(q, kc, vc, md, 128 ** -0.5))


def test_prefill_with_cached_prefix_is_causal_over_the_prefix():
    torch.manual_seed(0)
    heads, kv_heads, dim, bs = 4, 2, 32, 4
    prefix, chunk = 9, 5
    total = prefix + chunk
    kc = torch.zeros(8, bs, kv_heads, dim)
    vc = torch.zeros(8, bs, kv_heads, dim)
    keys, vals = torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    q = torch.randn(chunk, heads, dim)
    blocks = torch.tensor([5, 2, 7, 0])
    slots = torch.tensor([int(blocks[p // bs]) * bs + p % bs for p in range(total)])
    kc.view(-1, kv_heads, dim)[slots[:prefix]] = keys[:prefix]
    vc.view(-1, kv_heads, dim)[slots[:prefix]] = vals[:prefix]
    md = AttentionMetadata(slot_mapping=slots[prefix:], block_tables=blocks[None], seq_lens=torch.tensor([total]),
                           query_start_loc_list=[0, chunk], seq_lens_list=[total], num_decodes=0, block_size=bs)
    out = TorchAttentionBackend().forward(q, keys[prefix:], vals[prefix:], kc, vc, md, dim ** -0.5)
    for i in range(chunk):
        n = prefix + i + 1  # query i sees the prefix and the chunk up to itself
        torch.testing.assert_close(out[i].double(), dense_reference(q[i], keys[:n], vals[:n], dim ** -0.5),
                                   atol=1e-5, rtol=1e-5)


def make_mixed_step(seed, heads, kv_heads, dim, block_size, dtype, chunks):
    """A step of decodes then prefill chunks over a random paged pool.

    ``chunks``: (cached tokens, new tokens) per request; new == 1 rows come first.
    Returns q, k, v (new tokens only), caches holding the cached prefixes, metadata,
    and each request's full keys/values for the dense reference."""
    g = torch.Generator().manual_seed(seed)
    totals = [c + n for c, n in chunks]
    max_blocks = max(math.ceil(t / block_size) for t in totals)
    num_blocks = len(chunks) * max_blocks + 2
    kc = torch.zeros(num_blocks, block_size, kv_heads, dim, dtype=dtype)
    vc = torch.zeros_like(kc)
    tables = torch.randperm(num_blocks, generator=g)[:len(chunks) * max_blocks].view(len(chunks), max_blocks)
    full_k, full_v, qs, ks, vs, slots, qsl = [], [], [], [], [], [], [0]
    for i, (cached, new) in enumerate(chunks):
        keys = torch.randn(cached + new, kv_heads, dim, generator=g).to(dtype)
        vals = torch.randn(cached + new, kv_heads, dim, generator=g).to(dtype)
        full_k.append(keys), full_v.append(vals)
        pos = torch.arange(cached + new)
        slot = tables[i, pos // block_size] * block_size + pos % block_size
        kc.view(-1, kv_heads, dim)[slot[:cached]] = keys[:cached]
        vc.view(-1, kv_heads, dim)[slot[:cached]] = vals[:cached]
        slots.append(slot[cached:])
        qs.append(torch.randn(new, heads, dim, generator=g).to(dtype))
        ks.append(keys[cached:]), vs.append(vals[cached:])
        qsl.append(qsl[-1] + new)
    md = AttentionMetadata(slot_mapping=torch.cat(slots), block_tables=tables, seq_lens=torch.tensor(totals),
                           query_start_loc_list=qsl, seq_lens_list=totals,
                           num_decodes=sum(1 for _, n in chunks if n == 1), block_size=block_size,
                           max_decode_seq_len=max([t for t, (_, n) in zip(totals, chunks) if n == 1], default=0))
    return torch.cat(qs), torch.cat(ks), torch.cat(vs), kc, vc, md, full_k, full_v


@needs_c
@pytest.mark.parametrize("level", LEVEL_PARAMS)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 8, 64), (8, 1, 128), (4, 2, 32), (6, 2, 96)])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("fused_qkv", [False, True])
def test_cpu_mixed_step_prefill_chunks_match_dense(level, heads, kv_heads, dim, block_size, fused_qkv):
    """Decodes plus prefill chunks with and without a cached prefix, ragged lengths
    that straddle the kernels' 64-key tiles and 192-row query tiles, and short chunks
    over long prefixes (speculative decoding's draft rows, which skip the repack). With
    ``fused_qkv`` q, k and v are strided views into one [T, (H + 2 KVH) D] tensor,
    as the model passes them: the C K/V write and decode read them in place."""
    chunks = [(40, 1), (7, 1), (0, 5), (0, 77), (33, 31), (100, 1 + 64), (0, 1 + 200), (513, 40),
              (300, 5), (61, 3), (90, 8), (17, 2), (45, 4)]
    chunks = sorted(chunks, key=lambda c: c[1] != 1)
    q, k, v, kc, vc, md, full_k, full_v = make_mixed_step(heads + dim + block_size, heads, kv_heads, dim,
                                                          block_size, torch.bfloat16, chunks)
    scale = dim ** -0.5
    if fused_qkv:
        qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)
        q, k, v = (t.view(-1, n, dim) for t, n in zip(qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], 1),
                                                       (heads, kv_heads, kv_heads)))
        assert not q.is_contiguous() and not k.is_contiguous()
    backend = cpu_backend(level)
    assert backend.prefill_lib.paged_prefill_supported(dim)  # the C prefill kernel, not the torch fallback
    out = backend.forward(q, k, v, kc, vc, md, scale)
    qsl = md.query_start_loc_list
    want = [causal_reference(q[qsl[r]:qsl[r] + new], full_k[r], full_v[r], scale, cached)
            for r, (cached, new) in enumerate(chunks)]
    assert_bf16_close(out, torch.cat(want))


@needs_c
@pytest.mark.parametrize("level", LEVEL_PARAMS)
def test_bf16_prefill_kernel_runs_at_every_level(level):
    """Every level takes every head dim up to 256 (the portable path widens bf16 to fp32;
    the bf16 dot-product path takes multiples of 32), so no bf16 prefill falls back to torch."""
    lib = load_library("paged_prefill", level)
    dims = [d for d in (32, 64, 96, 128, 256) if lib.paged_prefill_supported(d)]
    assert dims == [32, 64, 96, 128, 256]
    if not level.has_bf16_dot:
        assert lib.paged_prefill_supported(48) and lib.paged_prefill_supported(80)
