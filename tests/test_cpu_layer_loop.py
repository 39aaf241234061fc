"""The one-call C layer loop (models/cpu_layers.py) runs the same kernels as the
Python layer loop, so a mixed step (decodes and prefill chunks, with and without
a cached prefix) gives bit-identical logprobs either way."""
import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.kernels.cpu.layer_loop import CpuLayerLoop
from inflight.kernels.cpu.packing import can_pack

PROMPTS = ["The capital of France is", "Here is a long story about a lighthouse keeper. " * 12, "1, 2, 3,",
           "Here is a long story about a lighthouse keeper. " * 12 + "His name was"]


def logprob_table(outputs):
    return [[{tok: lp.logprob for tok, lp in step.items()} for step in o.outputs[0].logprobs] for o in outputs]


@pytest.mark.slow
@pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16), reason="no bf16 CPU fast path")
@pytest.mark.parametrize("fused_silu", [True, False])  # False: gate_up then silu_mul, as for odd MLP widths
def test_layer_loop_is_bit_identical_to_the_python_loop(fused_silu):
    # 64-token chunks: the long prompts prefill over several steps (each chunk over
    # its cached prefix) next to running decodes. No prefix caching, so the second
    # run computes exactly what the first did.
    llm = LLM(dtype="bfloat16", max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    if not isinstance(model.layer_loop, CpuLayerLoop):
        pytest.skip("the C layer loop does not run on this machine")
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


@pytest.mark.slow
@pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16), reason="no bf16 CPU fast path")
def test_profile_attributes_the_loop_time_to_kernels():
    llm = LLM(dtype="bfloat16", max_num_batched_tokens=64)
    loop = llm.llm_engine.runner.model.layer_loop
    if loop is None:
        pytest.skip("the C layer loop does not run on this machine")
    loop.profile()
    llm.generate(["Here is a long story about a lighthouse keeper. " * 6], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    shares = loop.profile_shares()
    assert abs(sum(shares.values()) - 1) < 1e-9
    for kernel in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "decode_attention", "prefill_attention"):
        assert shares[kernel] > 0, kernel
    loop.profile(False)
    assert loop.ticks is None


def test_build_declines_models_off_the_fast_path():
    assert CpuLayerLoop.build(torch.nn.Module()) is None
    llm = LLM(dtype="float32")  # float32: plain torch linears, no fused ops
    assert llm.llm_engine.runner.model.layer_loop is None
