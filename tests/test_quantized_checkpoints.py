"""Quantized HF checkpoints as vLLM users download them: GPTQ (AutoGPTQ / GPTQModel, both
checkpoint formats, act-order), AWQ (GEMM), transformers' block FP8 and llm-compressor's
compressed-tensors (packed int4, FP8 per channel). Each tiny random Llama is packed here by
the formats' own rules (as vLLM's and compressed-tensors' packers write them), and its greedy
tokens and prompt logprobs in float32 equal transformers' on the weights the integers stand
for. Forms the engine does not run, and a ``quantization`` that names another method, are
refused before anything loads."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from inflight import LLM, SamplingParams
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32
from inflight.loader import ModelLoadError
from inflight.loader.testing import tiny_model, write_tiny_gguf

PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(4 + 9 * i)] for i in range(4)]
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_EXPERT = re.compile(r"experts\.\d+\.w[123]$")  # Mixtral's per-expert projections in its checkpoints
SMALL = dict(dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=8, max_num_batched_tokens=128)


def _pack_rows(q: np.ndarray, bits: int) -> np.ndarray:
    """int32 words down the rows: word r holds rows r * per + i at bits * i (GPTQ's qweight)."""
    per, q = 32 // bits, q.astype(np.uint32)
    out = np.zeros((q.shape[0] // per, q.shape[1]), np.uint32)
    for i in range(per):
        out |= q[i::per] << (bits * i)
    return out.view(np.int32)


def _pack_cols(q: np.ndarray, bits: int) -> np.ndarray:
    return np.ascontiguousarray(_pack_rows(q.T, bits).T)


def _awq_pack(q: np.ndarray) -> np.ndarray:
    """AutoAWQ's GEMM layout: each 8 columns interleaved 0, 2, 4, 6, 1, 3, 5, 7, then packed."""
    order = np.array([0, 2, 4, 6, 1, 3, 5, 7])
    return _pack_cols(q.reshape(-1, 8)[:, order].reshape(q.shape), 4)


def _quantize(kind: str, n: int, k: int, gen: torch.Generator) -> tuple[dict, torch.Tensor]:
    """Random stored tensors of one [n, k] layer in form ``kind``, and the float32 weight
    they stand for."""
    rnd = lambda hi, *shape: torch.randint(0, hi, shape, generator=gen)  # noqa: E731
    scales = lambda *shape: (torch.rand(shape, generator=gen) * 0.02 + 0.005).half()  # noqa: E731
    if kind in ("gptq4", "gptq_actorder", "gptq8_v2"):
        bits, group = (8, k) if kind == "gptq8_v2" else (4, 16 if kind == "gptq_actorder" else 32)
        q, s = rnd(1 << bits, k, n), scales(k // group, n)
        # asymmetric zeros from 1: the original format could not store a zero point of 0
        z = torch.full((k // group, n), 1 << (bits - 1)) if kind != "gptq_actorder" else rnd(15, k // group, n) + 1
        g = torch.arange(k) // group
        if kind == "gptq_actorder":
            g = g[torch.randperm(k, generator=gen)]
        w = ((q - z[g]).float() * s.float()[g]).t().contiguous()
        stored = z - (1 if kind != "gptq8_v2" else 0)  # the original format keeps zero - 1
        parts = {"qweight": _pack_rows(q.numpy(), bits), "qzeros": _pack_cols(stored.numpy(), bits),
                 "scales": s, "g_idx": g.int()}
    elif kind == "awq":
        q, z, s = rnd(16, k, n), rnd(16, k // 32, n), scales(k // 32, n)
        g = torch.arange(k) // 32
        w = ((q - z[g]).float() * s.float()[g]).t().contiguous()
        parts = {"qweight": _awq_pack(q.numpy()), "qzeros": _awq_pack(z.numpy()), "scales": s}
    elif kind == "ct_int4":
        q, s = rnd(16, n, k) - 8, scales(n, k // 32).bfloat16()
        w = q.float() * s.float().repeat_interleave(32, 1)
        parts = {"weight_packed": _pack_cols((q + 8).numpy(), 4), "weight_scale": s,
                 "weight_shape": torch.tensor([n, k])}
    elif kind == "fp8_block":  # blocks of 16 x 48: the last column block is partial
        f8 = (torch.randn(n, k, generator=gen) * 100).to(torch.float8_e4m3fn)
        s = torch.rand(-(-n // 16), -(-k // 48), generator=gen) * 1e-3
        w = f8.float() * s.repeat_interleave(16, 0)[:n].repeat_interleave(48, 1)[:, :k]
        parts = {"weight": f8, "weight_scale_inv": s}
    else:  # ct_fp8: one scale per output channel, and a static input scale the engine ignores
        f8 = (torch.randn(n, k, generator=gen) * 100).to(torch.float8_e4m3fn)
        s = torch.rand(n, 1, generator=gen) * 1e-3
        parts = {"weight": f8, "weight_scale": s, "input_scale": torch.tensor([0.5])}
        w = f8.float() * s
    return {p: torch.as_tensor(t) for p, t in parts.items()}, w


CONFIGS = {
    "gptq4": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True},
    "gptq_actorder": {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": True, "sym": False},
    "gptq8_v2": {"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True, "checkpoint_format": "gptq_v2"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
    "ct_int4": {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}},
    "fp8_block": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 48]},
    "ct_fp8": {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}}}},
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf")


def write_quantized(folder, kind: str, tokenizer, model=None) -> transformers.PreTrainedModel:
    """A tiny Llama (or ``model``) saved in quantized form ``kind``: every linear layer of its
    decoder, the experts' too (their checkpoint names, ``experts.{e}.w1``), the router not.
    Returns transformers' model of the weights that form stands for, loaded from a float copy."""
    model = model if model is not None else tiny_model("llama", seed=5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    gen = torch.Generator().manual_seed(11)
    plain, quantized = {}, {}
    for name, value in load_file(str(folder / "model.safetensors")).items():
        prefix = name.removesuffix(".weight")
        if not prefix.endswith(LINEARS) and not _EXPERT.search(prefix):
            plain[name] = quantized[name] = value.contiguous()
            continue
        parts, plain[name] = _quantize(kind, *value.shape, gen)
        quantized.update({f"{prefix}.{p}": t.contiguous() for p, t in parts.items()})
    save_file(plain, str(folder / "model.safetensors"))
    want = type(model).from_pretrained(folder).eval()  # the float weights, as transformers reads them
    save_file(quantized, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = CONFIGS[kind]
    (folder / "config.json").write_text(json.dumps(cfg))
    return want


def _hf(model, ids: list[int]) -> tuple[list[int], list[float]]:
    """8 greedy tokens after ``ids``, through EOS as ``ignore_eos`` runs, and the logprob of
    each prompt token after the first."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        seq = list(ids)
        for _ in range(8):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):], [logp[i, t].item() for i, t in enumerate(ids[1:])]


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_quantized_checkpoint_equals_transformers_on_its_weights(tmp_path, tokenizer, kind):
    want = write_quantized(tmp_path, kind, tokenizer)
    llm = LLM(str(tmp_path), **SMALL)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        tokens, logprobs = _hf(want, p)
        assert list(o.outputs[0].token_ids) == tokens
        got = [d[t].logprob for d, t in zip(o.prompt_logprobs[1:], p[1:])]
        np.testing.assert_allclose(got, logprobs, atol=2e-4, rtol=0)
    if kind in ("gptq4", "awq", "ct_int4"):  # 4-bit groups of whole 32-input blocks: the low-bit panels
        model = llm.llm_engine.runner.model
        bits = [m.lowbit_bits for m in model.modules() if isinstance(m, PanelLinearF32)]
        if bits:  # the fp32 GEMM is built on this machine
            assert bits.count(4) == 4 * len(model.layers), bits


def test_quantization_flag_must_name_the_checkpoints_method(tmp_path, tokenizer):
    write_quantized(tmp_path, "gptq4", tokenizer)
    with pytest.raises(ModelLoadError, match=r"model config \(gptq\) does not match .* argument \(awq\)"):
        LLM(str(tmp_path), quantization="awq", **SMALL)
    llm = LLM(str(tmp_path), quantization="gptq_marlin", **SMALL)  # vLLM's kernel names for the method pass
    assert llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="quantization must be one of"):
        LLM(str(tmp_path), quantization="int3", **SMALL)


def test_plain_checkpoint_refuses_quantizing_at_load(tmp_path, tokenizer):
    tiny_model("llama").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="is not quantized"):
        LLM(str(tmp_path), quantization="fp8", **SMALL)


@pytest.mark.parametrize("change, message", [
    ({"bits": 3}, r"bits=3 \(4 and 8 are\)"),
    ({"dynamic": {"-:.*mlp.*": {}}}, "per-module `dynamic`"),
    ({"quant_method": "awq", "version": "gemv"}, "version 'gemv'"),
    ({"quant_method": "bitsandbytes"}, "method 'bitsandbytes' is not supported"),
])
def test_forms_not_run_are_refused_by_name(tmp_path, tokenizer, change, message):
    write_quantized(tmp_path, "gptq4", tokenizer)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(tmp_path), **SMALL)


def test_quantized_mixture_of_experts(tmp_path, tokenizer):
    """A Mixtral whose attention and every expert's projections are 4-bit GPTQ (the router
    stays float, as GPTQ leaves it): the experts load from their dequantized per-expert
    layers into the stacked weights, and the tokens equal transformers'."""
    cfg = transformers.MixtralConfig(vocab_size=261, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=128, bos_token_id=1,
                                     eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    cfg.architectures = ["MixtralForCausalLM"]
    torch.manual_seed(2)
    moe = transformers.MixtralForCausalLM(cfg).eval()
    want = write_quantized(tmp_path, "gptq4", tokenizer, moe)
    assert any(".experts.0.w1.qweight" in k for k in load_file(str(tmp_path / "model.safetensors")))
    llm = LLM(str(tmp_path), **SMALL)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        assert list(o.outputs[0].token_ids) == _hf(want, p)[0]


@pytest.mark.parametrize("kind", ["gptq4", "gptq_actorder", "awq"])
def test_dequantized_in_column_pieces_equals_whole(tmp_path, tokenizer, kind, monkeypatch):
    """A layer is dequantized a slice of output columns at a time; slices of 8 give the
    weights of one slice (the tiny layers here have at most 96 outputs)."""
    import inflight.loader.quant.dequant as dq
    from inflight.loader.hf import hf_config, hf_weights
    from inflight.loader.quant import dequantized

    write_quantized(tmp_path, kind, tokenizer)
    src = dequantized(hf_weights(str(tmp_path)), hf_config(str(tmp_path)), str(tmp_path))
    name = "model.layers.0.mlp.up_proj.weight"
    whole = src[name]
    monkeypatch.setattr(dq, "_COLUMNS", 8)
    assert torch.equal(src[name], whole)
