"""ERNIE 4.5 (dense: the 0.3B): the Llama-shaped decoder whose RoPE pairs each head's dims
GPT-J's way, (2i, 2i + 1); it runs as Llama over q/k heads permuted at load
(models/llama.py), so every RoPE kernel and the C layer loop run it unchanged."""
from __future__ import annotations

from typing import Any

from inflight.models.llama import LlamaForCausalLM
from inflight.models.registry import ArchSpec


def _check(c: Any) -> None:
    if getattr(c, "use_bias", False):
        raise ValueError("ERNIE 4.5 with use_bias (biases on every projection) is not supported")


ARCHITECTURES = (
    # llama.cpp's converter keeps the checkpoint's q/k rows (its ernie4_5 RoPE pairs them as HF does)
    ArchSpec("Ernie4_5ForCausalLM", "ernie4_5", LlamaForCausalLM, rope_interleaved=True, check_config=_check,
             gguf_arch="ernie4_5"),
)
