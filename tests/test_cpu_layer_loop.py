"""The one-call C layer loop (kernels/cpu/layer_loop.py) runs the same kernels as the
Python layer loop, so a mixed step (decodes and prefill chunks, with and without
a cached prefix) gives bit-identical logprobs either way, in float32 and bfloat16,
for Llama (SmolLM2) and for Qwen3's per-head q/k norm (a tiny random checkpoint)."""
import pytest
import torch
import transformers

from inflight import LLM, SamplingParams
from inflight.distributed.layers import RowParallelLinear
from inflight.kernels.cpu.layer_loop import CpuLayerLoop
from inflight.loader.testing import tiny_model, write_tiny_gguf

PROMPTS = ["The capital of France is", "Here is a long story about a lighthouse keeper. " * 12, "1, 2, 3,",
           "Here is a long story about a lighthouse keeper. " * 12 + "His name was"]


def logprob_table(outputs):
    return [[{tok: lp.logprob for tok, lp in step.items()} for step in o.outputs[0].logprobs] for o in outputs]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fused_silu", [True, False])  # False: gate_up then silu_mul, as for odd MLP widths
def test_layer_loop_is_bit_identical_to_the_python_loop(fused_silu, dtype):
    # 64-token chunks: the long prompts prefill over several steps (each chunk over
    # its cached prefix) next to running decodes. No prefix caching, so the second
    # run computes exactly what the first did.
    llm = LLM(dtype=dtype, max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    assert isinstance(model.layer_loop, CpuLayerLoop)  # every CPU with kernels runs it
    assert model.layer_loop.kernels.gemm_silu is not None  # SmolLM2's 1536-wide MLP splits on a panel
    if not fused_silu:
        model.layer_loop.kernels.gemm_silu = None
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=3)
    with_loop = llm.generate(PROMPTS, params, use_tqdm=False)
    model.layer_loop, loop = None, model.layer_loop
    try:
        without = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        model.layer_loop = loop
    assert [o.outputs[0].token_ids for o in with_loop] == [o.outputs[0].token_ids for o in without]
    assert logprob_table(with_loop) == logprob_table(without)


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    """A tiny random-weight Qwen3 HF folder (head_dim 128, q/k norm weights not 1)."""
    folder = tmp_path_factory.mktemp("qwen3")
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf").save_pretrained(folder)
    tiny_model("qwen3", seed=5).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_qwen3_layer_loop_is_bit_identical_to_the_python_loop(qwen3_folder, dtype):
    # 16-token chunks: the longer prompts prefill over several steps beside running decodes
    llm = LLM(model=qwen3_folder, dtype=dtype, kv_cache_memory=16 << 20, max_num_seqs=4,
              max_num_batched_tokens=16, enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    loop = model.layer_loop
    assert isinstance(loop, CpuLayerLoop) and loop.kernels.rmsnorm_heads is not None
    # q/k norms the heads kernel does not compute are declined: one over every head at once
    # (OLMoE's), or only some layers normed
    plan, torch_dtype = model.layer_plan(), getattr(torch, dtype)
    wide = torch.ones(plan.num_heads * plan.head_dim, dtype=torch_dtype)
    assert CpuLayerLoop.build(plan._replace(layers=[ly._replace(q_norm=wide) for ly in plan.layers]),
                              torch_dtype) is None
    assert CpuLayerLoop.build(plan._replace(layers=plan.layers[:1] + [
        ly._replace(q_norm=None, k_norm=None) for ly in plan.layers[1:]]), torch_dtype) is None
    assert CpuLayerLoop.build(plan, torch_dtype) is not None
    prompts = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3)
    loop.profile()
    with_loop = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert loop.profile_shares()["qk_norm"] > 0  # the norm ran in the loop, and its time is its own
    model.layer_loop = None  # the Python loop: QKNorm's C kernel per layer
    try:
        without = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    finally:
        model.layer_loop = loop
    assert [o.outputs[0].token_ids for o in with_loop] == [o.outputs[0].token_ids for o in without]
    assert logprob_table(with_loop) == logprob_table(without)


@pytest.mark.slow
def test_profile_attributes_the_loop_time_to_kernels():
    llm = LLM(max_num_batched_tokens=64)
    loop = llm.llm_engine.runner.model.layer_loop
    assert loop is not None
    loop.profile()
    llm.generate(["Here is a long story about a lighthouse keeper. " * 6], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    shares = loop.profile_shares()
    assert abs(sum(shares.values()) - 1) < 1e-9
    for kernel in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "decode_attention", "prefill_attention"):
        assert shares[kernel] > 0, kernel
    assert shares["qk_norm"] == 0  # Llama has no q/k norm
    loop.profile(False)
    assert loop.ticks is None


def test_build_declines_models_off_the_fast_path():
    llm = LLM(attention_backend="torch")  # the plain-torch reference path: no kernels at all
    model = llm.llm_engine.runner.model
    assert model.layer_loop is None
    assert type(model.layers[0].mlp.down_proj) is RowParallelLinear  # unpacked: an nn.Linear
    assert CpuLayerLoop.build(model.layer_plan(), torch.float32) is None  # torch linears, torch attention
    assert CpuLayerLoop.build(model.layer_plan()._replace(layers=[]), torch.float32) is None
    assert CpuLayerLoop.build(model.layer_plan(), torch.float16) is None  # no float16 kernels
