"""Shared types of the loader: the result object, the error, supported architectures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers is heavy to import; only needed for the annotation
    import torch
    from transformers import PreTrainedTokenizerBase

# HF architecture name -> HF model_type. Llama, Mistral and Qwen2 share one
# decoder layout (RMSNorm, RoPE, GQA, SwiGLU); Qwen2 adds q/k/v biases.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


class ModelLoadError(Exception):
    """A model could not be loaded; the message is one line and names the path."""

    def __init__(self, message: str) -> None:
        # Exceptions from gguf/safetensors can span lines; callers print ours as one.
        super().__init__(" ".join(str(message).split()))


@dataclass
class LoadedModel:
    """Everything the engine needs from a checkpoint, independent of its file format."""

    hf_config: dict[str, Any]
    weights: dict[str, "torch.Tensor"]
    tokenizer: "PreTrainedTokenizerBase"
    source: str
    eos_token_ids: list[int] = field(default_factory=list)


def unsupported_architecture(arch: object, source: str) -> ModelLoadError:
    """The one error for every architecture we cannot run."""
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    return ModelLoadError(f"unsupported architecture {arch} in {source}; supported: {supported}")
