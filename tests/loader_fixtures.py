"""The tiny GGUF files and tokenizer the loader tests share (inflight.loader.testing)."""
from __future__ import annotations

import pytest
import transformers

from inflight.loader.testing import tiny_model, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny_gguf")
    write_tiny_gguf(str(folder / "llama.gguf"), tiny_model("llama", tie=True), "llama")
    write_tiny_gguf(str(folder / "qwen2.gguf"), tiny_model("qwen2", tie=False), "qwen2")
    write_tiny_gguf(str(folder / "qwen3.gguf"), tiny_model("qwen3", tie=True), "qwen3")
    write_tiny_gguf(str(folder / "phi3.gguf"), tiny_model("phi3", tie=False), "phi3")
    return str(folder)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_gguf_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_gguf_dir, gguf_file="llama.gguf")
