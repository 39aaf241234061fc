"""Mixture-of-experts: the routing and grouped experts against a per-token loop, and
Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE and Granite MoE from HF folders: greedy float32 tokens equal
transformers' on tiny random-weight checkpoints, alone, batched, in tiny chunks,
under preemption and prefix-cached, on the CPU fast path and the torch reference;
and from GGUF files written from the same checkpoints as llama.cpp's converter does."""
from __future__ import annotations

import pytest
import torch
import transformers

from inflight import LLM
from inflight.kernels.cpu.packing import packed_linear_class
from inflight.layers.moe import FusedMoE, dense_experts, grouped_experts, select_experts
from inflight.loader.testing import TOKENS, write_tiny_gguf
from inflight.models.registry import ModelArchConfig

from test_model_archs import PROMPTS, _hf_greedy, _run, _scheduler

# Per architecture: the config class and what differs between them (routing
# normalisation, Qwen3-MoE's own expert width and dense layers, OLMoE's clip_qkv).
# llama.cpp's general.architecture of each (Mixtral is filed under llama)
GGUF_ARCHS = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}
CONFIGS = {
    "mixtral": (transformers.MixtralConfig, dict(num_local_experts=8)),
    "qwen3_moe": (transformers.Qwen3MoeConfig, dict(num_experts=8, moe_intermediate_size=48, norm_topk_prob=True,
                                                    decoder_sparse_step=1, mlp_only_layers=[1])),
    "olmoe": (transformers.OlmoeConfig, dict(num_experts=8, norm_topk_prob=False, clip_qkv=3.0)),
    # a shared expert every token takes (sigmoid-gated) beside the routed ones, q/k/v biases, a dense layer 1
    "qwen2_moe": (transformers.Qwen2MoeConfig, dict(num_experts=8, moe_intermediate_size=48, norm_topk_prob=False,
                                                    shared_expert_intermediate_size=96, decoder_sparse_step=1,
                                                    mlp_only_layers=[1])),
    # Granite's four scalars far from 1 (as test_model_archs' dense Granite), experts stacked in the checkpoint
    "granitemoe": (transformers.GraniteMoeConfig, dict(num_local_experts=8, embedding_multiplier=6.0,
                                                       residual_multiplier=0.3, attention_multiplier=0.4,
                                                       logits_scaling=4.0)),
}


def tiny_config(arch: str) -> transformers.PretrainedConfig:
    cls, extra = CONFIGS[arch]
    cfg = cls(vocab_size=len(TOKENS), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
              num_experts_per_tok=2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              **extra)
    cfg.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    return cfg


def tiny_moe(arch: str, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(("gate.weight", "router.layer.weight")):  # a router that prefers some experts
                p.normal_(0.0, 0.5)
    return model.eval()


def _per_token(x, logits, w13, w2, top_k, renormalize) -> torch.Tensor:
    """The reference: each token through each of its experts, one at a time."""
    probs = torch.softmax(logits.double(), dim=-1)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        top = torch.topk(probs[t], top_k)
        weights = top.values / top.values.sum() if renormalize else top.values
        for w, e in zip(weights, top.indices.tolist()):
            gate, up = (w13[e].double() @ x[t].double()).chunk(2)
            out[t] += w * (w2[e].double() @ (torch.nn.functional.silu(gate) * up))
    return out


@torch.no_grad()
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("cpu_kernels", [False, True])
def test_grouped_experts_equal_a_per_token_loop(renormalize, cpu_kernels):
    torch.manual_seed(0)
    num_experts, hidden, inter, tokens = 6, 32, 24, 19
    moe = FusedMoE(num_experts, 2, hidden, inter, renormalize)
    with torch.no_grad():
        moe.w13_weight.normal_(0, 0.2)
        moe.w2_weight.normal_(0, 0.2)
    w13, w2 = moe.w13_weight.detach().clone(), moe.w2_weight.detach().clone()
    x, logits = torch.randn(tokens, hidden), torch.randn(tokens, num_experts)
    logits[:, 5] = -30.0  # an expert no token picks
    if cpu_kernels:
        if packed_linear_class(torch.float32) is None:
            pytest.skip("no fp32 CPU kernels on this machine")
        moe.dispatch_to("cpu")
        assert moe.packed is not None and moe.w13_weight is None
    want = _per_token(x, logits, w13, w2, 2, renormalize)
    got = moe(x, logits)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    if cpu_kernels:  # the panel GEMM's rows do not depend on the rows batched with them; so the experts'
        assert torch.equal(moe(x[3:4], logits[3:4]), got[3:4])


def test_dense_experts_equal_grouped():
    """The CUDA-graph capture path (every expert over every row, weighted 0 where not routed)."""
    torch.manual_seed(1)
    x, logits = torch.randn(9, 16), torch.randn(9, 4)
    weights, ids = select_experts(logits, 2, renormalize=False)
    mats = torch.randn(4, 16, 16)
    expert = lambda e, rows: rows @ mats[e]  # noqa: E731
    torch.testing.assert_close(dense_experts(x, weights, ids, 4, expert), grouped_experts(x, weights, ids, 4, expert))


def test_routing_normalisation():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    w, ids = select_experts(logits, 2, renormalize=False)
    assert ids.tolist() == [[0, 1]]
    torch.testing.assert_close(w, torch.softmax(logits, -1)[:, :2])
    w, _ = select_experts(logits, 2, renormalize=True)
    torch.testing.assert_close(w, torch.softmax(logits[:, :2], -1))  # Mixtral: softmax over the top-k logits


def test_config_fields():
    cfg = ModelArchConfig.from_hf(tiny_config("qwen3_moe").to_dict())
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 48)
    assert cfg.moe_layers == [0] and cfg.norm_topk_prob and cfg.qk_norm
    qwen = tiny_config("qwen3_moe")
    qwen.num_hidden_layers, qwen.decoder_sparse_step, qwen.mlp_only_layers = 6, 2, [3]
    assert ModelArchConfig.from_hf(qwen.to_dict()).moe_layers == [1, 5]  # every second layer, less layer 3
    cfg = ModelArchConfig.from_hf(tiny_config("olmoe").to_dict())
    assert cfg.moe_layers == [0, 1] and not cfg.norm_topk_prob and cfg.clip_qkv == 3.0
    assert cfg.moe_intermediate_size == 96
    cfg = ModelArchConfig.from_hf(tiny_config("mixtral").to_dict())
    assert cfg.num_experts == 8 and cfg.norm_topk_prob and cfg.moe_layers == [0, 1]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf")


@pytest.fixture(scope="module", params=list(CONFIGS))
def checkpoint(request, tmp_path_factory, tokenizer):
    """(arch, HF folder, transformers' greedy tokens for every prompt)."""
    folder = tmp_path_factory.mktemp(request.param)
    model = tiny_moe(request.param, seed=5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return request.param, str(folder), [_hf_greedy(model, p) for p in PROMPTS]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_greedy_equals_transformers(checkpoint, backend):
    arch, folder, want = checkpoint
    llm = LLM(model=folder, dtype="float32", attention_backend=backend, kv_cache_memory=16 << 20,
              max_num_seqs=16, max_num_batched_tokens=256)
    model = llm.llm_engine.runner.model
    moe = model.layers[0].block_sparse_moe if arch in ("mixtral", "granitemoe") else model.layers[0].mlp
    fast = backend == "auto" and packed_linear_class(torch.float32) is not None
    assert (moe.experts.packed is not None) == fast  # experts on the packed CPU GEMM on the fast path
    assert isinstance(model.layers[0].self_attn.o_proj, packed_linear_class(torch.float32) if fast else torch.nn.Linear)

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
    assert s.kv.prefix_cache_hits >= 32


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["qwen3_moe"], indirect=True)
def test_tensor_parallel_equals_transformers(checkpoint):
    """Two ranks: attention heads and the dense layer split, router and experts whole on each."""
    _, folder, want = checkpoint
    llm = LLM(model=folder, dtype="float32", tensor_parallel_size=2, max_num_seqs=8, max_num_batched_tokens=32)
    try:
        assert _run(llm, PROMPTS[:4]) == want[:4]  # batched, the longer prompts in chunks
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("checkpoint", ["olmoe"], indirect=True)
def test_olmoe_refuses_tensor_parallel(checkpoint):
    with pytest.raises(ValueError, match="tensor_parallel_size"):  # its q/k norm spans every head
        LLM(model=checkpoint[1], dtype="float32", tensor_parallel_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", list(GGUF_ARCHS), indirect=True)
def test_gguf_greedy_equals_transformers(checkpoint, tmp_path, monkeypatch):
    """A GGUF file as llama.cpp's converter writes it (the router as ffn_gate_inp, each projection
    of every expert stacked in one tensor, Mixtral under "llama" with Q/K permuted, the expert
    counts and OLMoE's clip in the metadata; Qwen3-MoE's dense layer 1 without a router) gives
    transformers' tokens for the HF model it was written from."""
    arch, _, want = checkpoint
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path / "cache"))
    path = str(tmp_path / f"{arch}.gguf")
    write_tiny_gguf(path, tiny_moe(arch, seed=5), GGUF_ARCHS[arch])  # the checkpoint's weights
    llm = LLM(model=path, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
    fields = ("architecture", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_layers",
              "norm_topk_prob", "clip_qkv")
    hf = ModelArchConfig.from_hf(tiny_config(arch).to_dict())
    assert [getattr(llm.llm_engine.arch, f) for f in fields] == [getattr(hf, f) for f in fields]
    assert _run(llm, PROMPTS[2:5]) == want[2:5]
