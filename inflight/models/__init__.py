"""Model implementations on the flattened ``[num_tokens, hidden]`` batch."""
from inflight.models.registry import ModelArchConfig, get_model_class, SUPPORTED_ARCHITECTURES

__all__ = ["ModelArchConfig", "get_model_class", "SUPPORTED_ARCHITECTURES"]
