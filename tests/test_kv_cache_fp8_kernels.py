"""kv_cache_dtype="fp8" on the CPU's C kernels: each (token, kv head) row of a pool holds its
e4m3 codes and its bf16 scale (attention/kv_quant.py), the C K/V write quantizes as
``quantize_fp8`` does, bit for bit, and the float32 kernels dequantize each row as they copy it
into their tiles, for float32 and (widened, then rounded back) bfloat16 queries; at the
AVX-512-BF16 levels a bf16 decode of many sequences dequantizes each one's rows to bf16 for the
bf16 kernel instead.

Every ISA level this CPU runs is checked against the torch reference over the same pools:
a float32 reference sees exactly the dequantized values the kernels compute, so float32
queries agree to float32 rounding and bfloat16 ones as the bf16 kernels' tests ask. The engine
runs its C layer loop over fp8 pools, bit-identical to its Python loop over the same kernels,
with greedy text close to the torch reference backend's over fp8 pools."""
import pytest
import torch

from inflight import LLM
from inflight.attention.base import AttentionMetadata
from inflight.attention.cpu_paged import CpuPagedAttentionBackend, kv_suffix
from inflight.attention.kv_quant import FP8_DTYPE, FP8KVCache, dequantize_fp8, quantize_fp8
from inflight.attention.torch_ref import TorchAttentionBackend
from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import supported_levels
from inflight.kernels.cpu.layer_loop import CpuLayerLoop
from test_attention import assert_bf16_close
from test_cpu_fp32_kernels import MIXED, make_step, no_fallback
from test_kv_cache_bf16 import _greedy

BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture(params=supported_levels(), ids=lambda lv: lv.name)
def backend(request):
    libs = [load_library(name, request.param) for name in ("paged_decode", "paged_prefill")]
    assert None not in libs, f"the attention kernels did not build for {request.param.name}"
    backend = CpuPagedAttentionBackend(*libs)
    backend.level = request.param
    return backend


def fp8_pool(pool: torch.Tensor, out_dtype: torch.dtype) -> FP8KVCache:
    """A float32 pool [blocks, block_size, kv heads, D] quantized row by row (unused slots too)."""
    cache = FP8KVCache.zeros(tuple(pool.shape), out_dtype, pool.device)
    flat = pool.flatten(0, 1)
    cache.write(flat, torch.arange(flat.shape[0]))
    return cache


def roundtrip(x: torch.Tensor) -> torch.Tensor:
    return dequantize_fp8(*quantize_fp8(x), F32)


def test_fp8_pools_have_kernels_for_both_dtypes():
    assert kv_suffix(F32, FP8_DTYPE) == "_kvfp8" and kv_suffix(BF16, FP8_DTYPE) == "_kvfp8"
    assert kv_suffix(torch.float16, FP8_DTYPE) is None


# (9, 3, 64): whole rows in one item; (8, 8, 64): more than a tile buffer's row, a kv head an
# item; (16, 1, 36, 5): head_dim past whole vectors and blocks of 5; (6, 2, 80, 5): 80 = 5 x 16
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(9, 3, 64, 16), (8, 8, 64, 16), (16, 1, 36, 5),
                                                           (6, 2, 80, 5)])
@pytest.mark.parametrize("dtype,window", [(F32, None), (F32, 37), (BF16, None)])
def test_mixed_step_over_fp8_pools_matches_torch_reference(backend, monkeypatch, heads, kv_heads, dim,
                                                           block_size, dtype, window):
    q, k, v, kc, vc, md = make_step(heads * 7 + dim + block_size, heads, kv_heads, dim, block_size, MIXED)
    kc[0, 0, 0, :4] = torch.tensor([0.0, -0.0, 1e-4, -3e-3])  # codes of zero, and denormal codes
    scale = dim ** -0.5
    ref_k, ref_v = fp8_pool(kc, F32), fp8_pool(vc, F32)
    got_k, got_v = fp8_pool(kc, dtype), fp8_pool(vc, dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))  # a bf16 model's rows are rounded before anything
    # the kernels read every key from the pool, the chunk's own as quantized there
    want = TorchAttentionBackend().forward(q.float(), roundtrip(k.float()), roundtrip(v.float()), ref_k, ref_v, md,
                                           scale, sliding_window=window)
    assert backend.supports(q, got_k, window)
    no_fallback(monkeypatch)
    got = backend.forward(q, k, v, got_k, got_v, md, scale, sliding_window=window)
    assert got.dtype == dtype
    if dtype == F32:
        assert torch.equal(got_k.buf, ref_k.buf) and torch.equal(got_v.buf, ref_v.buf)  # the C write's bytes
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:  # bf16 probabilities, and K/V rounded to bf16 on the AVX-512-BF16 levels' decode
        assert_bf16_close(got, want.double())


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("shared", [True, False], ids=["shared_prefix", "own_blocks"])
def test_decode_of_many_sequences_over_fp8_pools(backend, monkeypatch, dtype, shared):
    """Forty decodes up to 1,200 tokens: whole-sequence work items, and (shared_prefix) requests
    whose tables start with the same blocks (prefix caching), scored over the shared keys
    together first."""
    heads, kv_heads = 9, 3
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(1, 1200, (40,), generator=g)
    lens[:30] = 12 * 16 + torch.randint(1, 900, (30,), generator=g)  # past 12 blocks (192 keys) to share
    lens[1] = 12 * 16 + 1  # one key of its own
    q, _, _, kc, vc, md = make_step(11, heads, kv_heads, 64, 16, [(n - 1, 1) for n in lens.tolist()])
    tables = md.block_tables.clone()
    if shared:
        tables[1:30, :12] = tables[0, :12]
    md = AttentionMetadata(slot_mapping=md.slot_mapping, block_tables=tables, seq_lens=lens,
                           query_start_loc_list=md.query_start_loc_list, seq_lens_list=lens.tolist(),
                           num_decodes=40, block_size=16, max_decode_seq_len=int(lens.max()))
    q = (q * 4).to(dtype)  # the running max moves between tiles
    want = TorchAttentionBackend()._decode(q.float(), fp8_pool(kc, F32), fp8_pool(vc, F32), md, 0.125)
    no_fallback(monkeypatch)
    got = backend._decode(q, fp8_pool(kc, dtype), fp8_pool(vc, dtype), md, 0.125)
    if dtype == F32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    elif backend.level.has_bf16_dot:  # the bf16 kernel (its cascade too) over the rows dequantized to bf16
        bf16_pools = [p[torch.arange(p.shape[0])].contiguous() for p in (fp8_pool(kc, BF16), fp8_pool(vc, BF16))]
        assert torch.equal(got, backend._decode(q, *bf16_pools, md, 0.125))
    else:
        assert_bf16_close(got, want.double())


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_write_quantizes_as_torch_does(backend, dtype):
    """Ties of the 3-bit mantissa, denormal codes and their ties, the largest code, rows of
    zeros and of values too small for a bf16 scale, through the C write: the same bytes as
    kv_quant.quantize_fp8, scales included."""
    kv_heads, dim = 2, 64
    rows = torch.randn(8, kv_heads, dim) * torch.logspace(-6, 3, 8)[:, None, None]
    unit = torch.tensor([448.0, 1.0625, 1.1875, -1.0625, 2 ** -9 * 2.5, -(2 ** -9) * 1.5, 2 ** -9 * 0.5, 2 ** -6])
    rows[0, 0, :8] = unit  # amax 448: the scale is 1, each value its own code
    rows[1] = 0.0
    rows[2, 1] = 1e-38
    rows = rows.to(dtype)
    shape = (4, 4, kv_heads, dim)
    got_k, got_v = FP8KVCache.zeros(shape, dtype, rows.device), FP8KVCache.zeros(shape, dtype, rows.device)
    want_k, want_v = FP8KVCache.zeros(shape, dtype, rows.device), FP8KVCache.zeros(shape, dtype, rows.device)
    slots = torch.tensor([13, 2, 7, 0, 9, 4, 15, 11])
    backend._write_kv(rows, rows * -3, got_k, got_v, slots)
    want_k.write(rows, slots)
    want_v.write(rows * -3, slots)
    assert torch.equal(got_k.scale, want_k.scale) and torch.equal(got_v.scale, want_v.scale)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        codes, ref = got.data.view(torch.uint8), want.data.view(torch.uint8)
        # a zero's sign aside (0x80 is -0.0), every byte as torch's
        assert torch.equal(codes & torch.where(ref & 0x7F == 0, 0x7F, 0xFF).to(torch.uint8), ref & torch.where(
            ref & 0x7F == 0, 0x7F, 0xFF).to(torch.uint8))
    first = got_k.data.view(torch.uint8).flatten(0, 1)[13, 0, :8].tolist()
    assert first == [0x7E, 0x38, 0x3A, 0xB8, 0x02, 0x82, 0x00, 0x08]  # ties to even, by hand


def _agreement(got, ref):
    """Prompts with identical greedy tokens, and the largest logprob gap over common prefixes."""
    identical, max_dlp = 0, 0.0
    for (gt, gl), (rt, rl) in zip(got, ref):
        k = next((i for i, (a, b) in enumerate(zip(gt, rt)) if a != b), len(gt))
        identical += gt == rt
        max_dlp = max([max_dlp] + [abs(a - b) for a, b in zip(gl[:k], rl[:k])])
    return identical, max_dlp


PROMPTS = ["The capital of France is", "Here is a long story about a lighthouse keeper. " * 10,
           "List three colours:", "def fibonacci(n):"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_runs_its_c_layer_loop_over_fp8_pools(dtype):
    """The C layer loop runs over fp8 pools (for float32, bit-identical to the Python loop over
    the same kernels; a bf16 loop fuses the SiLU into its GEMM, the Python loop does not); greedy
    text close to the torch reference backend's over fp8 pools."""
    kw = dict(dtype=dtype, kv_cache_dtype="fp8", kv_cache_memory=16 * 2**20, max_num_batched_tokens=64,
              enable_prefix_caching=False)
    llm = LLM(**kw)
    eng = llm.llm_engine
    assert isinstance(eng.runner.kv_caches[0][0], FP8KVCache)
    model = eng.runner.model
    assert isinstance(model.layer_loop, CpuLayerLoop)
    assert model.layer_loop.can_run(torch.zeros(1, 1, dtype=getattr(torch, dtype)), eng.runner.kv_caches)
    with_loop = _greedy(llm, PROMPTS, 12)
    if dtype == "float32":
        model.layer_loop, loop = None, model.layer_loop
        try:
            assert _greedy(llm, PROMPTS, 12) == with_loop  # the same kernels, one call or many
        finally:
            model.layer_loop = loop
    identical, max_dlp = _agreement(with_loop, _greedy(LLM(attention_backend="torch", **kw), PROMPTS, 12))
    print(dtype, "C kernels vs torch reference over fp8 pools: identical", identical, "max |dlogprob|", max_dlp)
    assert identical >= len(PROMPTS) - 1, f"only {identical} of {len(PROMPTS)} prompts agree"
    assert max_dlp < 0.5, max_dlp
