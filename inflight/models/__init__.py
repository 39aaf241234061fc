"""Model implementations on the flattened ``[num_tokens, hidden]`` batch."""
from inflight.models.registry import ModelArchConfig, get_model_class, supported_architectures

__all__ = ["ModelArchConfig", "get_model_class", "supported_architectures"]
