"""LoRA adapters served beside the base model (vLLM's ``vllm.lora``)."""
from inflight.lora.request import LoRARequest

__all__ = ["LoRARequest"]
