"""Qwen3, Phi-3, Phi-4-mini's partial rotary with LongRoPE, Granite, SmolLM3, ERNIE 4.5 (interleaved
RoPE) and OLMo 2 from HF folders: greedy float32 tokens equal transformers' on tiny
random-weight checkpoints, alone, batched, in tiny chunks, under preemption and
prefix-cached, on the CPU fast path (the default) and on the plain-torch reference."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers

from inflight import LLM, SamplingParams
from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.hybrid_kv import HybridKVCacheManager
from inflight.core.scheduler import Scheduler
from inflight.distributed.layers import RowParallelLinear
from inflight.kernels.cpu.packing import packed_linear_class
from inflight.loader.testing import tiny_model, write_tiny_gguf
from inflight.models.hf_config import _max_window_layer_types

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
SHARED = [7 + (5 * j) % 240 for j in range(40)]  # a prefix longer than two 16-token blocks
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(5)]
PROMPTS += [SHARED + [100, 101, 102], SHARED + [200, 201]]
WINDOW = 8
SLIDING, FULL = "sliding_attention", "full_attention"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf")


def _hf_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    return new[: new.index(2) + 1] if 2 in new else new


# Granite's four scalars far from 1, so a missed or doubled one changes the tokens
GRANITE = dict(embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.4, logits_scaling=4.0)


# SmolLM3 without positions in every second layer (its checkpoints: every fourth), so one of two is
SMOLLM3 = dict(no_rope_layer_interval=2)


# Phi-4-mini's form: RoPE on half of each head (8 of 16 dims), LongRoPE's per-frequency factors
# and its attention factor (sqrt(1 + ln 4 / ln 128) from 512 / 128 positions). With max_model_len
# at most 128 every position turns by the short factors, as transformers turns a short sequence
PHI4 = dict(partial_rotary_factor=0.5, max_position_embeddings=512, original_max_position_embeddings=128,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.7, 2.9, 5.3],
                          "long_factor": [3.0, 5.0, 9.0, 17.0]})


@pytest.fixture(scope="module", params=["qwen3", "phi3", "phi4", "granite", "smollm3", "ernie4_5", "glm"])
def checkpoint(request, tmp_path_factory, tokenizer):
    """(arch, HF folder, transformers' greedy tokens for every prompt)."""
    folder = tmp_path_factory.mktemp(request.param)
    # ERNIE 4.5: RoPE over (2i, 2i + 1) pairs; its config's head_dim would be 128
    # GLM: q/k/v biases, RoPE over half of each head in interleaved pairs
    extra = {"granite": GRANITE, "smollm3": SMOLLM3, "phi4": PHI4, "ernie4_5": {"head_dim": 16},
             "glm": {"head_dim": 16}}.get(request.param, {})
    model = tiny_model("phi3" if request.param == "phi4" else request.param, seed=3, **extra).eval()
    if request.param == "smollm3":
        assert model.config.no_rope_layers == [1, 0]
    if request.param in ("smollm3", "phi4", "ernie4_5", "glm"):
        _sharpen(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return request.param, str(folder), [_hf_greedy(model, p) for p in PROMPTS]


def _sharpen(model) -> None:
    """Sharp attention and a strong attention path, so whether a layer sees positions shows in the tokens."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)
            elif name.endswith(("v_proj.weight", "o_proj.weight", "embed_tokens.weight")):
                p.normal_(0.0, 0.3)


def _run(llm, prompts) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp,
                                                          use_tqdm=False)]


def _scheduler(llm, sched: dict | None = None, **cache) -> Scheduler:
    """The loaded model with other scheduler settings (and the engine's KV layout)."""
    eng = llm.llm_engine
    cfg = SchedulerConfig(**{**eng.config.scheduler_config.__dict__, **(sched or {})})
    cc = CacheConfig(**{**eng.config.cache_config.__dict__, **cache})
    eng.scheduler = Scheduler(cfg, cc, cc.num_gpu_blocks_override or eng.num_blocks, eng.max_model_len,
                              sliding_window=eng.scheduler.kv.sliding_window,
                              layer_windows=eng.executor.built.layer_windows)
    return eng.scheduler


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_greedy_equals_transformers(checkpoint, backend):
    arch, folder, want = checkpoint
    llm = LLM(model=folder, dtype="float32", attention_backend=backend, kv_cache_memory=16 << 20,
              max_num_seqs=16, max_num_batched_tokens=256, **({"max_model_len": 128} if arch == "phi4" else {}))
    model = llm.llm_engine.runner.model
    if backend == "auto" and packed_linear_class(torch.float32) is not None:
        assert isinstance(model.layers[0].mlp.down_proj, packed_linear_class(torch.float32))
        # the C layer loop runs both (Qwen3's per-head q/k norm is a kernel in it)
        assert model.layer_loop is not None
    if backend == "torch":
        assert type(model.layers[0].mlp.down_proj) is RowParallelLinear and model.layer_loop is None

    for p, w in zip(PROMPTS[:3], want[:3]):
        assert _run(llm, [p]) == [w]
    assert _run(llm, PROMPTS) == want

    s = _scheduler(llm, {"long_prefill_token_threshold": 4, "max_num_batched_tokens": 8})
    assert _run(llm, PROMPTS) == want  # prefills in chunks of at most 4 tokens beside decodes
    assert s.kv.num_free_blocks == s.kv.num_blocks

    s = _scheduler(llm, num_gpu_blocks_override=8)
    assert _run(llm, PROMPTS) == want
    assert s.num_preemptions > 0

    s = _scheduler(llm, enable_prefix_caching=True)
    assert _run(llm, PROMPTS[-2:-1]) + _run(llm, PROMPTS[-1:]) == want[-2:]
    assert s.kv.prefix_cache_hits >= 32  # the second prompt's shared blocks came from the cache


def test_smollm3_gguf_greedy_equals_transformers(tmp_path):
    """llama.cpp's smollm3 files carry no layer pattern: every fourth layer has no positions."""
    model = tiny_model("smollm3", seed=4, num_hidden_layers=4).eval()
    assert model.config.no_rope_layers == [1, 1, 1, 0]
    _sharpen(model)
    path = str(tmp_path / "smollm3.gguf")
    write_tiny_gguf(path, model, "smollm3")
    llm = LLM(model=path, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
    assert llm.llm_engine.arch.no_rope_layers == [1, 1, 1, 0]
    assert _run(llm, PROMPTS[:4]) == [_hf_greedy(model, p) for p in PROMPTS[:4]]


def test_phi4_gguf_greedy_equals_transformers(tmp_path):
    """A Phi-4-mini-form GGUF as llama.cpp's converter writes it: the turned dims as
    phi3.rope.dimension_count, LongRoPE's factors as rope_factors_long / _short tensors."""
    model = tiny_model("phi3", seed=4, **PHI4).eval()
    _sharpen(model)
    path = str(tmp_path / "phi4.gguf")
    write_tiny_gguf(path, model, "phi3")
    llm = LLM(model=path, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256,
              max_model_len=128)
    arch = llm.llm_engine.arch
    assert arch.rotary_dim == 8 and arch.rope_scaling["short_factor"] == pytest.approx([1.0, 1.7, 2.9, 5.3])
    assert _run(llm, PROMPTS[:4]) == [_hf_greedy(model, p) for p in PROMPTS[:4]]


def test_ernie4_5_gguf_greedy_equals_transformers(tmp_path):
    """An ERNIE 4.5 GGUF as llama.cpp's converter writes it: q/k rows as in the checkpoint
    (llama.cpp's ernie4_5 RoPE pairs (2i, 2i + 1) as the checkpoint does)."""
    model = tiny_model("ernie4_5", seed=4, head_dim=16).eval()
    _sharpen(model)
    path = str(tmp_path / "ernie.gguf")
    write_tiny_gguf(path, model, "ernie4_5")
    llm = LLM(model=path, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
    assert llm.llm_engine.arch.rope_interleaved
    assert _run(llm, PROMPTS[:4]) == [_hf_greedy(model, p) for p in PROMPTS[:4]]


def test_phi4_long_context_turns_every_position_by_the_long_factors(tmp_path, tokenizer):
    """max_model_len past original_max_position_embeddings: the long factors everywhere, as
    vLLM does and as transformers does for a sequence that long (prompts of 130-160 tokens)."""
    model = tiny_model("phi3", seed=5, **PHI4).eval()
    _sharpen(model)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts = [[5 + (i * 7 + j * 13) % 250 for j in range(130 + 15 * i)] for i in range(3)]
    llm = LLM(model=str(tmp_path), dtype="float32", kv_cache_memory=16 << 20, max_num_batched_tokens=256)
    assert llm.llm_engine.max_model_len == 512
    assert _run(llm, prompts) == [_hf_greedy(model, p) for p in prompts]


# Families that run op by op on the CPU (the C layer loop runs pre-norm RMSNorm stacks):
# name -> (transformers' model type, config fields, what the parsed config must show)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
OP_BY_OP = {
    # post-sublayer norms, whole-projection q/k norms
    "olmo2": ("olmo2", {}, lambda a: a.qk_norm is False),
    # plus windowed layers on plain RoPE and a global one on YaRN: two tables
    "olmo3": ("olmo3", dict(sliding_window=WINDOW, layer_types=[SLIDING, FULL], rope_scaling=YARN),
              lambda a: a.rope_scaling["rope_type"] == "yarn" and a.layer_types == [SLIDING, FULL]),
    # post-sublayer norms over per-head q/k norms; the global layer of a windowed stack has no positions
    "exaone4": ("exaone4", {"sliding_window": None, "layer_types": [FULL, FULL]}, lambda a: a.no_rope_layers is None),
    "exaone4-window": ("exaone4", {"sliding_window": WINDOW, "sliding_window_pattern": 2},
                       lambda a: a.no_rope_layers == [1, 0] and a.layer_types == [SLIDING, FULL]),
    # GLM's interleaved half-width RoPE and q/k/v biases, plus a norm after each sublayer's output
    "glm4": ("glm4", {"head_dim": 16}, lambda a: a.rotary_dim == 8 and a.rope_interleaved),
    # LayerNorms with biases, q/k/v biases, RoPE over a quarter of each head
    "stablelm": ("stablelm", {"use_qkv_bias": True}, lambda a: a.rotary_dim == 4 and a.attention_bias),
    # a parallel block from one bias-free LayerNorm, interleaved RoPE, logits times logit_scale
    "cohere": ("cohere", {"logit_scale": 0.25}, lambda a: a.no_rope_layers is None),
    # plus a window and a global layer without positions
    "cohere2": ("cohere2", {"logit_scale": 0.25, "sliding_window": WINDOW, "layer_types": [SLIDING, FULL]},
                lambda a: a.no_rope_layers == [1, 0]),
}


@pytest.mark.parametrize("name", sorted(OP_BY_OP))
def test_op_by_op_families_equal_transformers(tmp_path, tokenizer, name):
    """Greedy tokens equal transformers' on both backends, batched and in chunks of 4 tokens,
    and the first token's logprob too (a logit scale changes no argmax)."""
    model_type, fields, parsed = OP_BY_OP[name]
    model = tiny_model(model_type, seed=6, **fields).eval()
    _sharpen(model)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    want = [_hf_greedy(model, p) for p in PROMPTS]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([PROMPTS[2]])).logits[0, -1].float(), -1)
    for backend in ("auto", "torch"):
        llm = LLM(model=str(tmp_path), dtype="float32", attention_backend=backend, kv_cache_memory=16 << 20,
                  max_num_seqs=16, max_num_batched_tokens=256)
        assert parsed(llm.llm_engine.arch) and llm.llm_engine.runner.model.layer_loop is None
        assert _run(llm, PROMPTS) == want
        out = llm.generate(prompt_token_ids=[PROMPTS[2]], use_tqdm=False,
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=1, logprobs=0))[0].outputs[0]
        assert out.logprobs[0][out.token_ids[0]].logprob == pytest.approx(lp[out.token_ids[0]].item(), abs=1e-4)
        _scheduler(llm, {"long_prefill_token_threshold": 4, "max_num_batched_tokens": 8})
        assert _run(llm, PROMPTS) == want


def test_olmo2_gguf_and_olmo3_gguf(tmp_path):
    """OLMo 2's GGUF as llama.cpp writes it (no input norms; post_attention_norm, post_ffw_norm)
    equals transformers; llama.cpp files OLMo 3 under olmo2 with a window, which is refused."""
    model = tiny_model("olmo2", seed=6).eval()
    _sharpen(model)
    write_tiny_gguf(str(tmp_path / "olmo2.gguf"), model, "olmo2")
    llm = LLM(model=str(tmp_path / "olmo2.gguf"), dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=256)
    assert _run(llm, PROMPTS[:4]) == [_hf_greedy(model, p) for p in PROMPTS[:4]]
    olmo3 = tiny_model("olmo3", seed=6, sliding_window=WINDOW, layer_types=[SLIDING, FULL]).eval()
    write_tiny_gguf(str(tmp_path / "olmo3.gguf"), olmo3, "olmo2")
    with pytest.raises(Exception, match="OLMo 3 GGUF"):
        LLM(model=str(tmp_path / "olmo3.gguf"), dtype="float32", kv_cache_memory=16 << 20)


def test_granite_gguf_greedy_equals_transformers(tmp_path):
    """A Granite GGUF as llama.cpp's converter writes it (Q/K rows permuted, the four scalars
    as granite.embedding_scale, residual_scale, attention.scale and logit_scale)."""
    model = tiny_model("granite", seed=4, **GRANITE).eval()
    path = str(tmp_path / "granite.gguf")
    write_tiny_gguf(path, model, "granite")
    llm = LLM(model=path, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
    arch = llm.llm_engine.arch
    got = (arch.embedding_multiplier, arch.residual_multiplier, arch.attention_multiplier, arch.logits_scaling)
    assert got == pytest.approx((6.0, 0.3, 0.4, 4.0))  # float32 in the file
    assert _run(llm, PROMPTS[:4]) == [_hf_greedy(model, p) for p in PROMPTS[:4]]



@pytest.fixture(scope="module")
def qwen2_window(tmp_path_factory, tokenizer):
    """(HF folder, transformers' greedy tokens for PROMPTS[2:5]) of a Qwen2 with
    use_sliding_window and max_window_layers=1: layer 0 global, layer 1 an 8-token window,
    far shorter than the prompts."""
    folder = tmp_path_factory.mktemp("qwen2_window")
    model = tiny_model("qwen2", seed=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1).eval()
    assert model.config.layer_types == [FULL, SLIDING]
    with torch.no_grad():  # sharp attention and a strong attention path: which keys a layer sees matters
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)
            elif name.endswith(("v_proj.weight", "o_proj.weight", "embed_tokens.weight")):
                p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    want = [_hf_greedy(model, p) for p in PROMPTS[2:5]]
    # the per-layer rule is tested: the window on no layer, or on every layer, gives other tokens
    for types in ([FULL, FULL], [SLIDING, SLIDING]):
        model.config.layer_types = types
        assert [_hf_greedy(model, p) for p in PROMPTS[2:5]] != want
    return str(folder), want


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_qwen2_max_window_layers_equal_transformers(qwen2_window, backend):
    folder, want = qwen2_window
    llm = LLM(model=folder, dtype="float32", attention_backend=backend, kv_cache_memory=16 << 20,
              max_num_seqs=16, max_num_batched_tokens=256)
    assert [ly.self_attn.sliding_window for ly in llm.llm_engine.runner.model.layers] == [None, WINDOW]
    assert llm.llm_engine.arch.kv_sliding_window is None  # one window does not hold for every layer
    kv = llm.llm_engine.scheduler.kv  # a block table per layer group: the windowed one frees blocks
    assert isinstance(kv, HybridKVCacheManager) and [g.sliding_window for g in kv.groups] == [None, WINDOW]
    assert _run(llm, PROMPTS[2:5]) == want
    s = _scheduler(llm, {"long_prefill_token_threshold": 4, "max_num_batched_tokens": 8})
    assert isinstance(s.kv, HybridKVCacheManager)
    assert _run(llm, PROMPTS[2:5]) == want  # prefills in chunks of at most 4 tokens beside decodes
    assert s.kv.num_free_blocks == s.kv.num_blocks


@pytest.mark.parametrize("first", [0, 2, 4])
def test_max_window_layers_rule_equals_transformers(first):
    """Where transformers predates layer_types, the layers from max_window_layers on are windowed,
    as transformers 5 derives them; without use_sliding_window none is."""
    kw = dict(num_hidden_layers=4, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=first)
    assert _max_window_layer_types(SimpleNamespace(**kw)) == transformers.Qwen2Config(**kw).layer_types
    assert _max_window_layer_types(SimpleNamespace(**{**kw, "use_sliding_window": False})) == []
