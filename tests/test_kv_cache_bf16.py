"""kv_cache_dtype="bfloat16" under a float32 model (vLLM's setting): the pools hold bf16, half
the bytes per token, and the float32 kernels widen each cached value as they read it.

The C kernels' ``_kvbf16`` entry points run at every ISA level this CPU runs, against the
torch reference over the same bf16 pools (which widens exactly as they do, so the answers
agree to float32 rounding); the C K/V write rounds as torch's ``.to(torch.bfloat16)`` does;
and the engine runs its C layer loop over such pools, with greedy outputs close to those of
float32 pools."""
import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.attention.base import AttentionMetadata
from inflight.attention.cpu_paged import CpuPagedAttentionBackend, kv_suffix
from inflight.attention.torch_ref import TorchAttentionBackend
from inflight.config import EngineConfig
from inflight.core.scheduler import Scheduler
from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import supported_levels
from inflight.kernels.cpu.layer_loop import CpuLayerLoop
from inflight.worker.kv_cache import allocate_kv_cache, num_blocks_for_memory
from test_cpu_fp32_kernels import MIXED, make_step, no_fallback

BF16, F32 = torch.bfloat16, torch.float32
MEMORY = 16 * 2**20


@pytest.fixture(params=supported_levels(), ids=lambda lv: lv.name)
def backend(request):
    libs = [load_library(name, request.param) for name in ("paged_decode", "paged_prefill")]
    assert None not in libs, f"the attention kernels did not build for {request.param.name}"
    return CpuPagedAttentionBackend(*libs)


def bf16_step(seed, heads, kv_heads, dim, block_size, chunks):
    """make_step with its pools (garbage in the unused slots included) rounded to bf16."""
    q, k, v, kc, vc, md = make_step(seed, heads, kv_heads, dim, block_size, chunks)
    return q, k, v, kc.to(BF16), vc.to(BF16), md


def test_only_float32_over_bf16_has_kernels():
    assert kv_suffix(F32, F32) == "" and kv_suffix(BF16, BF16) == ""
    assert kv_suffix(F32, BF16) == "_kvbf16"
    assert kv_suffix(BF16, F32) is None and kv_suffix(F32, torch.float16) is None


# (9, 3, 64): whole-sequence rows of 192 floats; (8, 8, 64): 512 floats, more than a tile
# buffer's row, so such pools always take one kv head per item; (16, 1, 36): tails everywhere
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(9, 3, 64, 16), (8, 8, 64, 16), (16, 1, 36, 5),
                                                           (6, 2, 80, 5)])
@pytest.mark.parametrize("window", [None, 37])
def test_mixed_step_over_bf16_pools_matches_torch_reference(backend, monkeypatch, heads, kv_heads, dim,
                                                            block_size, window):
    q, k, v, kc, vc, md = bf16_step(heads * 7 + dim + block_size, heads, kv_heads, dim, block_size, MIXED)
    scale = dim ** -0.5
    assert backend.supports(q, kc, window)
    kc2, vc2 = kc.clone(), vc.clone()
    # the kernels read every key from the pool, the chunk's own as stored: rounded to bf16
    kr, vr = k.to(BF16).to(F32), v.to(BF16).to(F32)
    want = TorchAttentionBackend().forward(q, kr, vr, kc2, vc2, md, scale, sliding_window=window)
    no_fallback(monkeypatch)
    got = backend.forward(q, k, v, kc, vc, md, scale, sliding_window=window)
    assert got.dtype == F32 and kc.dtype == BF16
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the C write rounded each row as torch does
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (8, 8)])
def test_decode_of_many_sequences_over_bf16_pools(backend, monkeypatch, heads, kv_heads):
    """Forty decodes up to 1,200 tokens: whole-sequence work items where a row fits the tile
    buffers, and requests whose tables start with the same blocks (prefix caching) scored over
    the shared keys together first."""
    g = torch.Generator().manual_seed(heads)
    shared = 12  # blocks: 192 keys
    lens = torch.randint(1, 1200, (40,), generator=g)
    lens[:30] = shared * 16 + torch.randint(1, 900, (30,), generator=g)
    lens[1] = shared * 16 + 1  # one key of its own
    q, _, _, kc, vc, md = bf16_step(heads + kv_heads, heads, kv_heads, 64, 16, [(n - 1, 1) for n in lens.tolist()])
    tables = md.block_tables.clone()
    tables[1:30, :shared] = tables[0, :shared]
    md = AttentionMetadata(slot_mapping=md.slot_mapping, block_tables=tables, seq_lens=lens,
                           query_start_loc_list=md.query_start_loc_list, seq_lens_list=lens.tolist(),
                           num_decodes=40, block_size=16, max_decode_seq_len=int(lens.max()))
    q = q * 4  # the running max moves between tiles
    want = TorchAttentionBackend()._decode(q, kc, vc, md, 0.125)
    no_fallback(monkeypatch)
    torch.testing.assert_close(backend._decode(q, kc, vc, md, 0.125), want, atol=1e-5, rtol=1e-5)


def test_write_rounds_to_nearest_even_and_keeps_specials(backend):
    """Halfway cases, values past bf16's largest, infinities and -0.0, through the C write."""
    kv_heads, dim = 2, 64
    rows = torch.randn(6, kv_heads, dim)
    rows[0, 0, :4] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.4e38])
    rows[1, 0, :3] = torch.tensor([float("inf"), float("-inf"), -0.0])
    kc, vc = torch.zeros(4, 4, kv_heads, dim, dtype=BF16), torch.zeros(4, 4, kv_heads, dim, dtype=BF16)
    slots = torch.tensor([13, 2, 7, 0, 9, 4])
    backend._write_kv(rows, rows * -2, kc, vc, slots)
    flat_k, flat_v = kc.view(-1, kv_heads, dim), vc.view(-1, kv_heads, dim)
    assert torch.equal(flat_k[slots], rows.to(BF16)) and torch.equal(flat_v[slots], (rows * -2).to(BF16))
    assert flat_k[2, 0, 2].item() == 0.0 and torch.signbit(flat_k[2, 0, 2].float())
    assert flat_k[slots].abs().isinf().sum() == 3  # 3.4e38 rounds past bf16's largest, as in torch
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any()


def test_config_names_the_kv_dtypes():
    assert EngineConfig.from_kwargs(kv_cache_dtype="bfloat16").cache_config.kv_cache_dtype == "bfloat16"
    with pytest.raises(ValueError, match="'auto', 'bfloat16', 'fp8' or 'fp8_e4m3', got 'float16'"):
        EngineConfig.from_kwargs(kv_cache_dtype="float16")


def _greedy(llm, prompts, max_tokens):
    eng = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=1)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    eng.scheduler.check_integrity()
    assert eng.scheduler.kv.num_free_blocks == eng.num_blocks
    return [(c.token_ids, [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)])
            for c in (o.outputs[0] for o in outs)]


@pytest.mark.slow
def test_engine_over_bf16_pools():
    """Twice the blocks of float32 pools in the same memory; the C layer loop runs over them,
    bit-identical to the Python loop over the same pools; greedy text close to float32 pools."""
    prompts = ["The capital of France is", "Here is a long story about a lighthouse keeper. " * 10,
               "List three colours:", "def fibonacci(n):"]
    llm = LLM(dtype="float32", kv_cache_dtype="bfloat16", kv_cache_memory=MEMORY, max_num_batched_tokens=64,
              enable_prefix_caching=False)
    eng = llm.llm_engine
    f32_blocks = num_blocks_for_memory(eng.arch, 16, F32, MEMORY)
    assert eng.num_blocks == num_blocks_for_memory(eng.arch, 16, F32, MEMORY, "bfloat16") >= 2 * f32_blocks - 1
    assert eng.runner.kv_caches[0][0].dtype == BF16
    model = eng.runner.model
    assert isinstance(model.layer_loop, CpuLayerLoop)  # every CPU with kernels runs it
    assert model.layer_loop.can_run(torch.zeros(1, 1, dtype=F32), eng.runner.kv_caches)
    with_loop = _greedy(llm, prompts, 12)
    model.layer_loop, loop = None, model.layer_loop
    try:
        assert _greedy(llm, prompts, 12) == with_loop  # the same kernels, one call or many
    finally:
        model.layer_loop = loop
    cc = eng.config.cache_config
    eng.runner.kv_caches = allocate_kv_cache(eng.arch, f32_blocks, cc.block_size, F32, eng.device)
    eng.num_blocks = f32_blocks
    eng.scheduler = Scheduler(eng.config.scheduler_config, cc, f32_blocks, eng.max_model_len)
    f32 = _greedy(llm, prompts, 12)
    identical, max_dlp = 0, 0.0
    for (bt, bl), (ft, fl) in zip(with_loop, f32):
        k = next((i for i, (a, b) in enumerate(zip(bt, ft)) if a != b), len(bt))
        identical += bt == ft
        max_dlp = max([max_dlp] + [abs(a - b) for a, b in zip(bl[:k], fl[:k])])
    assert identical >= len(prompts) - 1, f"only {identical} of {len(prompts)} prompts agree"
    assert max_dlp < 0.1, max_dlp
