"""Shared types of the loader: the result object and the error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # transformers is heavy to import; only needed for the annotation
    from transformers import PreTrainedTokenizerBase

    from .stream import WeightSource


class ModelLoadError(Exception):
    """A model could not be loaded; the message is one line and names the path."""

    def __init__(self, message: str) -> None:
        # Exceptions from gguf/safetensors can span lines; callers print ours as one.
        super().__init__(" ".join(str(message).split()))


@dataclass
class LoadedModel:
    """Everything the engine needs from a checkpoint, independent of its file format."""

    hf_config: dict[str, Any]
    weights: "WeightSource"  # HF names; read lazily, each tensor straight into its parameter
    tokenizer: "PreTrainedTokenizerBase"
    source: str
    eos_token_ids: list[int] = field(default_factory=list)


def unsupported_architecture(arch: object, source: str) -> ModelLoadError:
    """The one error for every architecture we cannot run."""
    from inflight.models.registry import supported_architectures

    supported = ", ".join(supported_architectures())
    return ModelLoadError(f"unsupported architecture {arch} in {source}; supported: {supported}")
