"""Model loading: HF safetensors folders and GGUF files, plus their tokenizers.

``load_model`` returns a ``LoadedModel`` whose weights use HF parameter names
and layouts in float32, whatever the source format, so the model code has one
input format. See ``api.load_model`` for the accepted ``model`` arguments.
"""

from .api import default_model_path, load_model, load_tokenizer
from .types import LoadedModel, ModelLoadError

__all__ = ["LoadedModel", "ModelLoadError", "load_model", "default_model_path", "load_tokenizer"]
