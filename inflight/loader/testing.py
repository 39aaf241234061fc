"""Tiny checkpoints for tests: random HF models and GGUF files written from them.

Other test files can use these to exercise the GGUF path (and compare with
transformers) in milliseconds instead of loading the real model. The GGUF
writer applies llama.cpp's Q/K permutation with its own copy of the
converter's code, so reading a file back checks our un-permutation.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
import transformers

from inflight.models.registry import spec_for_gguf

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CONFIG_CLASSES = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "phi3": transformers.Phi3Config,
    "granite": transformers.GraniteConfig,
    "smollm3": transformers.SmolLM3Config,
    "olmo2": transformers.Olmo2Config,
    "ernie4_5": transformers.Ernie4_5Config,
    "glm": transformers.GlmConfig,
    "glm4": transformers.Glm4Config,
    "granitemoe": transformers.GraniteMoeConfig,
    "exaone4": transformers.Exaone4Config,
    "qwen2_moe": transformers.Qwen2MoeConfig,
    "stablelm": transformers.StableLmConfig,
    "cohere": transformers.CohereConfig,
    "cohere2": transformers.Cohere2Config,
    "olmo3": transformers.Olmo3Config,
}


def byte_level_tokens() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b if b in printable else next(extra)) for b in range(256)]


TOKENS = SPECIAL_TOKENS + byte_level_tokens() + ["he", "Ġt"]


def tiny_model(arch: str, tie: bool = False, seed: int = 0, **config) -> transformers.PreTrainedModel:
    """A 2-layer random ``arch`` model (a key of CONFIG_CLASSES) over the byte-level TOKENS
    vocabulary; ``config`` overrides or adds config fields."""
    cfg = CONFIG_CLASSES[arch](**{
        "vocab_size": len(TOKENS),
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        **config,
    })
    cfg.architectures = [type(cfg).__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms start at 1.0; make them distinguishable too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.uniform_(0.5, 1.5)
    return model


def rope_theta(cfg: transformers.PretrainedConfig) -> float:
    """RoPE base of an HF config object, as transformers 4 (rope_theta) or 5 (rope_parameters) stores it."""
    params = getattr(cfg, "rope_parameters", None) or {}
    params = params.get("full_attention", params)  # per layer type (Gemma 3): the global layers' base
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf's forward Q/K row permutation (HF -> GGUF)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    """HF parameter name -> llama.cpp tensor name for the llama.cpp architecture ``arch``."""
    globals_ = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    base, kind = hf_name.rsplit(".", 1)
    if base in globals_:
        return f"{globals_[base]}.{kind}"
    _, _, layer, part = base.split(".", 3)
    to_gguf = {hf: gg for gg, hf in spec_for_gguf(arch).gguf_tensors.items()}
    return f"blk.{layer}.{to_gguf[part]}.{kind}"


def write_tiny_gguf(path: str, model: transformers.PreTrainedModel | None, arch: str = "llama") -> None:
    """Write ``model`` (float32 tensors) plus a byte-level tokenizer as a GGUF file."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny {arch}")
    if model is not None:
        cfg = model.config
        writer.add_block_count(cfg.num_hidden_layers)
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_head_count_kv(cfg.num_key_value_heads)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        params = getattr(cfg, "rope_parameters", None) or {}
        writer.add_rope_dimension_count(int(head_dim * (params.get("partial_rotary_factor") or 1.0)))
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        writer.add_rope_freq_base(rope_theta(cfg))
        _add_longrope(writer, params)
        _add_window_and_caps(writer, cfg)
        _add_granite_scales(writer, cfg)
        _add_experts(writer, cfg, arch)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIAL_TOKENS) + [1] * (len(TOKENS) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(["h e", "Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    if model is not None:
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
        for name, value in model.state_dict().items():
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            proj = name.split(".")[-2]
            if spec_for_gguf(arch).gguf_permute_qk and proj in heads:
                value = llama_cpp_permute(value, heads[proj])
            if name.endswith("norm.weight"):  # as llama.cpp's converter (Gemma stores 1 + w)
                value = value + spec_for_gguf(arch).gguf_norm_offset
            for gg_name, part in _expert_tensors(name, value) or [(gguf_name(name, arch), value)]:
                writer.add_tensor(gg_name, part.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_granite_scales(writer: gguf.GGUFWriter, cfg: transformers.PretrainedConfig) -> None:
    """Granite's four scalars, as llama.cpp's converter writes them."""
    if getattr(cfg, "model_type", None) == "granite":
        writer.add_embedding_scale(cfg.embedding_multiplier)
        writer.add_residual_scale(cfg.residual_multiplier)
        writer.add_attention_scale(cfg.attention_multiplier)
        writer.add_logit_scale(cfg.logits_scaling)


def _add_longrope(writer: gguf.GGUFWriter, params: dict) -> None:
    """Phi-3's LongRoPE as llama.cpp's converter writes it: the factors as two tensors."""
    if params.get("rope_type") != "longrope":
        return
    writer.add_rope_scaling_orig_ctx_len(int(params["original_max_position_embeddings"]))
    for kind in ("long", "short"):
        writer.add_tensor(f"rope_factors_{kind}.weight", np.asarray(params[f"{kind}_factor"], dtype=np.float32))


def _add_window_and_caps(writer: gguf.GGUFWriter, cfg: transformers.PretrainedConfig) -> None:
    """The sliding window and logit soft-caps, where the config has them (Gemma 2/3)."""
    if getattr(cfg, "layer_types", None) and getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)
    if getattr(cfg, "attn_logit_softcapping", None):
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
    if getattr(cfg, "final_logit_softcapping", None):
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)


def _add_experts(writer: gguf.GGUFWriter, cfg: transformers.PretrainedConfig, arch: str) -> None:
    """The mixture-of-experts metadata llama.cpp's converter writes (Mixtral, Qwen3-MoE, OLMoE)."""
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if not experts:
        return
    writer.add_expert_count(experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "qwen3moe":
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if getattr(cfg, "clip_qkv", None):
        writer.add_clamp_kqv(cfg.clip_qkv)


def _expert_tensors(name: str, value: torch.Tensor) -> list[tuple[str, torch.Tensor]] | None:
    """llama.cpp's router and stacked expert tensors for transformers 5's MoE parameters
    (``mlp.gate``, ``mlp.experts.gate_up_proj`` [E, 2I, H] gate rows first, ``mlp.experts.down_proj``);
    None for any other tensor."""
    parts = name.split(".")
    if parts[:2] != ["model", "layers"] or parts[3] != "mlp":
        return None
    blk, rest = f"blk.{parts[2]}", ".".join(parts[4:])
    if rest == "gate.weight":
        return [(f"{blk}.ffn_gate_inp.weight", value)]
    if rest == "experts.gate_up_proj":
        gate, up = value.chunk(2, dim=1)
        return [(f"{blk}.ffn_gate_exps.weight", gate), (f"{blk}.ffn_up_exps.weight", up)]
    if rest == "experts.down_proj":
        return [(f"{blk}.ffn_down_exps.weight", value)]
    return None
