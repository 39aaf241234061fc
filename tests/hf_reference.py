"""The transformers model for a checkpoint, as the reference for parity tests.

transformers dequantizes GGUF files and undoes llama.cpp's Q/K permutation
with its own code, independent of ``inflight.loader``, which is what makes it
a useful reference.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import torch

from inflight.loader import default_model_path


def load_hf_reference(path: str | None = None, dtype: torch.dtype = torch.float32):
    """Return ``transformers``' causal LM for ``path`` (default: the embedded GGUF), in eval mode.

    ``path`` is a ``.gguf`` file or an HF model folder. Cached per process, under the
    resolved path, however the arguments are spelled: the embedded model takes ~10 s
    to dequantize. Treat the result as read-only.
    """
    return _load(os.path.realpath(path or default_model_path()), dtype)


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    if os.path.isdir(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with _tensor_name_maps_memoized():
        if importlib.util.find_spec("accelerate") is not None:
            folder, name = os.path.split(path)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
        else:
            model = _from_gguf_without_accelerate(path, dtype)
    return model.eval()


@contextlib.contextmanager
def _tensor_name_maps_memoized():
    """transformers asks gguf for the same (arch, layers) name map once per submodule,
    and each is built from scratch: a third of the load; and it parses the file's header
    (the tokenizer's vocabulary: most of the rest) once for the config and again for the
    weights. The map is a pure function of its arguments and transformers only reads the
    parsed file, so memoizing both changes no weight."""
    import gguf

    original_map, original_reader = gguf.get_tensor_name_map, gguf.GGUFReader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original_map)
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(original_reader)
    try:
        yield
    finally:
        gguf.get_tensor_name_map, gguf.GGUFReader = original_map, original_reader


def _from_gguf_without_accelerate(path: str, dtype: torch.dtype):
    """Same weights as from_pretrained(gguf_file=...), which insists on ``accelerate``.

    Uses transformers' own GGUF config parsing and tensor conversion
    (``load_gguf_checkpoint``), so the reference stays independent of our loader.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = os.path.split(path)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):  # only used to map GGUF names to parameter names
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    result = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    # Only a tied lm_head may be absent from the file.
    assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys, result
    model.tie_weights()
    return model.to(dtype)
