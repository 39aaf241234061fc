"""Tokenizers from HF folders and GGUF files, with the chat template always attached."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Callable

from .types import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tokenizer_from_folder(folder: str) -> "PreTrainedTokenizerBase":
    """Load the tokenizer saved in ``folder`` (an HF model folder or our cache entry); a
    multimodal checkpoint's chat template may live only in its processor's
    ``chat_template.json`` (Gemma 3), which transformers' tokenizer does not read."""
    try:
        # local_files_only: no hub is reachable, and a local folder must not fall back to one.
        tok = _tokenizer_class(folder).from_pretrained(folder, local_files_only=True)
    except Exception as exc:
        raise ModelLoadError(f"cannot load tokenizer from {folder}: {type(exc).__name__}: {exc}") from exc
    processor_template = os.path.join(folder, "chat_template.json")
    if not tok.chat_template and os.path.isfile(processor_template):
        try:
            with open(processor_template, encoding="utf-8") as f:
                tok.chat_template = json.load(f).get("chat_template") or None
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"cannot read {processor_template}: {exc}") from exc
    return tok


def _tokenizer_class(folder: str) -> type:
    """transformers' generic tokenizer class where the folder names it and holds no model
    config that could make AutoTokenizer pick another (a GGUF cache entry's tokenizer: what
    AutoTokenizer would build too); AutoTokenizer otherwise. Importing AutoTokenizer scans every
    model's module in transformers, a large part of a warm start-up."""
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        config = None
    generic = (isinstance(config, dict) and config.get("tokenizer_class") == "TokenizersBackend"
               and "auto_map" not in config and not os.path.exists(os.path.join(folder, "config.json")))
    if generic:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend
    from transformers import AutoTokenizer

    return AutoTokenizer


def tokenizer_from_gguf(
    path: str, chat_template: Callable[[], str | None] | None = None
) -> "PreTrainedTokenizerBase":
    """Build the tokenizer stored in the GGUF file ``path``.

    transformers converts the GGUF vocabulary and merges itself and normally
    copies ``tokenizer.chat_template`` too; ``chat_template`` is a fallback
    source for the template, called only when transformers left it unset.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder, name = os.path.split(path)
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except Exception as exc:
        try:
            # AutoTokenizer first parses the model config and refuses architectures transformers
            # cannot load from GGUF (olmoe); the vocabulary itself converts the same for any of them
            tok = PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=name, local_files_only=True)
        except Exception:
            raise ModelLoadError(f"cannot build tokenizer from {path}: {type(exc).__name__}: {exc}") from exc
    if not tok.chat_template and chat_template is not None:
        template = chat_template()
        if template:
            tok.chat_template = template
    return tok
