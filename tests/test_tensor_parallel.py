"""Tensor parallelism: the model split over two worker processes (gloo) gives the same
greedy float32 tokens as one process, batched, in prefill chunks, with prefix-cache
hits and under preemption; head counts that do not split are a clear error.

The embedded SmolLM2-135M has 9 attention heads, which do not split over 2 ranks
(vLLM refuses such a split too), so the parity test runs a tiny random-weight Llama
with 4 heads and 2 KV heads."""
from __future__ import annotations

import pytest
import transformers

from inflight import LLM, SamplingParams
from inflight.distributed.sharding import check_tp_size, head_shard
from inflight.loader.testing import tiny_model, write_tiny_gguf

MAX_TOKENS = 12
SHARED = [7 + (5 * j) % 240 for j in range(40)]  # a prefix longer than two 16-token blocks
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(5)]
PROMPTS += [SHARED + [100, 101, 102], SHARED + [200, 201]]
# a 16-token step budget chunks every longer prompt; 10 blocks of 16 tokens cannot hold
# the batch, so requests are preempted and recomputed
ENGINE = dict(dtype="float32", max_num_batched_tokens=16, max_num_seqs=8, num_gpu_blocks_override=10)


def tiny_folder(tmp_path_factory, tie: bool) -> str:
    """A tiny random Llama (4 heads, 2 KV heads, 2 layers) with a byte-level tokenizer."""
    path = tmp_path_factory.mktemp("tiny_llama_tp")
    write_tiny_gguf(str(path / "tok.gguf"), None)
    transformers.AutoTokenizer.from_pretrained(path, gguf_file="tok.gguf").save_pretrained(path)
    (path / "tok.gguf").unlink()
    tiny_model("llama", tie=tie, seed=3).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory, tie=False)  # untied: the vocab-parallel lm_head


def _greedy(llm: LLM) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=sp,
                                                          use_tqdm=False)]


@pytest.mark.slow
def test_tp2_matches_tp1_token_for_token(folder):
    ref_llm = LLM(folder, **ENGINE)
    reference = [_greedy(ref_llm), _greedy(ref_llm)]  # the second pass hits the prefix cache
    llm = LLM(folder, tensor_parallel_size=2, **ENGINE)
    try:
        assert llm.llm_engine.runner is None  # the ranks run in worker processes
        got = [_greedy(llm), _greedy(llm)]
        stats = llm.llm_engine.stats()
    finally:
        llm.llm_engine.shutdown()
    assert got == reference
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0  # the cases ran


def test_heads_that_do_not_split_are_refused_before_any_worker_starts(folder):
    with pytest.raises(ValueError, match="divisible by tensor_parallel_size"):
        LLM(folder, tensor_parallel_size=3, dtype="float32")
    with pytest.raises(ValueError, match="divisible"):
        check_tp_size(9, 3, 2)  # SmolLM2-135M over two ranks


def test_kv_heads_split_or_replicate_with_the_query_heads_that_read_them():
    # 8 query heads over 4 KV heads (groups of 2), on 2 ranks: each rank its own KV heads
    assert [(s.num_heads, s.num_kv_heads, s.q_start, s.kv_start) for s in (head_shard(8, 4, 2, r) for r in range(2))] \
        == [(4, 2, 0, 0), (4, 2, 4, 2)]
    # 2 KV heads on 4 ranks: each rank holds the one KV head its 2 query heads read
    shards = [head_shard(8, 2, 4, r) for r in range(4)]
    assert [(s.num_heads, s.num_kv_heads, s.kv_start) for s in shards] == [(2, 1, 0), (2, 1, 0), (2, 1, 1),
                                                                           (2, 1, 1)]
    for s in shards:  # query head h reads KV head h // (8 // 2)
        assert {h // 4 for h in range(s.q_start, s.q_start + s.num_heads)} == {s.kv_start}


@pytest.mark.parametrize("arch", ["llama", "phi3"])  # q/k/v and gate/up stacked on load; already fused
def test_each_rank_loads_its_rows_and_columns_of_every_checkpoint_tensor(arch, monkeypatch):
    """Rank 1 of 2 builds its shard and cuts the checkpoint as it loads (no process group
    is needed to load); 261 vocabulary rows split 131 + 130."""
    import torch

    from inflight.attention import get_attention_backend
    from inflight.distributed import parallel_state
    from inflight.models.registry import ModelArchConfig, get_model_class

    hf = tiny_model(arch, seed=1)
    sd = {k: v.detach() for k, v in hf.state_dict().items()}
    cfg = ModelArchConfig.from_hf(hf.config.to_dict())
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank=1, world_size=2))
    model = get_model_class(cfg.architecture)(cfg, get_attention_backend("torch", torch.device("cpu")), 64)
    model.load_weights(sd)
    hd, inter = cfg.head_dim, cfg.intermediate_size  # 16, 96: 4 heads, 2 KV heads, 64 wide
    p = "model.layers.0."
    if arch == "phi3":
        q, k, v = sd[p + "self_attn.qkv_proj.weight"].split([64, 32, 32])
        gate, up = sd[p + "mlp.gate_up_proj.weight"].split([inter, inter])
    else:
        q, k, v = (sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        gate, up = sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]
    layer = model.layers[0]
    assert (layer.self_attn.nh, layer.self_attn.nkv) == (2, 1)
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat([q[2 * hd:], k[hd:], v[hd:]]))
    assert torch.equal(layer.self_attn.o_proj.weight, sd[p + "self_attn.o_proj.weight"][:, 2 * hd:])
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat([gate[inter // 2:], up[inter // 2:]]))
    assert torch.equal(layer.mlp.down_proj.weight, sd[p + "mlp.down_proj.weight"][:, inter // 2:])
    assert torch.equal(model.embed_tokens.weight, sd["model.embed_tokens.weight"][131:])
    assert torch.equal(model.lm_head.weight, sd["lm_head.weight"][131:])
    assert torch.equal(layer.input_layernorm.weight, sd[p + "input_layernorm.weight"])  # replicated


@pytest.mark.slow
@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
def test_tp2_pools_as_tp1(folder, pooling_type):
    """A pooling model split over two ranks embeds as one process does (rank 0 pools)."""
    import torch

    # 8 tokens of each prompt a step, several prompts a step: 10 blocks cannot hold them all
    kw = dict(ENGINE, runner="pooling", pooler_config={"pooling_type": pooling_type}, max_num_batched_tokens=64,
              long_prefill_token_threshold=8)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    reference = [o.outputs.embedding for o in LLM(folder, **kw).embed(prompts, use_tqdm=False)]
    llm = LLM(folder, tensor_parallel_size=2, **kw)
    try:
        got = [o.outputs.embedding for o in llm.embed(prompts, use_tqdm=False)]
        stats = llm.llm_engine.stats()
    finally:
        llm.llm_engine.shutdown()
    torch.testing.assert_close(torch.tensor(got), torch.tensor(reference), atol=1e-5, rtol=1e-4)
    assert stats["num_preemptions"] > 0  # prompts recomputed mid-prefill


@pytest.mark.slow
def test_tp2_classifies_as_transformers(tmp_path):
    """A sequence classifier's head (not split: every rank holds it) over two ranks."""
    import torch

    write_tiny_gguf(str(tmp_path / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf")
    cfg = tiny_model("llama", seed=3).config
    cfg.num_labels, cfg.pad_token_id, cfg.architectures = 3, 0, ["LlamaForSequenceClassification"]
    model = transformers.LlamaForSequenceClassification(cfg).eval()
    model.save_pretrained(tmp_path / "cls")
    tok.save_pretrained(tmp_path / "cls")
    llm = LLM(str(tmp_path / "cls"), tensor_parallel_size=2, **ENGINE)
    try:
        outs = llm.classify([{"prompt_token_ids": p} for p in PROMPTS[:4]], use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    with torch.no_grad():
        want = [torch.softmax(model(torch.tensor([p])).logits[0], -1) for p in PROMPTS[:4]]
    torch.testing.assert_close(torch.tensor([o.outputs.probs for o in outs]), torch.stack(want), atol=1e-5, rtol=1e-4)
