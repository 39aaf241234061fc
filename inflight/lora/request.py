"""Which adapter a request runs with (vLLM's ``LoRARequest``); no torch, so core/ may hold it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT LoRA adapter folder under a name and a positive integer id, both unique
    to this adapter. The id keys the loaded weights; the name keys the prefix cache
    (requests of different adapters never share KV) and is the model name clients send."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}")
        if not self.lora_name:
            raise ValueError("lora_name must not be empty")
