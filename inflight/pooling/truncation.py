"""``truncate_prompt_tokens`` on a pooling model, as vLLM's pooling runner applies it.

A pooling model reads its prompt from the start: a BERT pools [CLS], a cross-encoder's pair
begins with its query. So a pooling model's prompt keeps its *first* tokens. A text is cut by
the tokenizer (its truncation side set to the right), which keeps the special tokens it adds
(``[CLS] ... [SEP]``) and trims a pair's longer text first; token ids, and a text whose
request names a ``truncation_side``, are cut by slicing (``sampling_params.truncate_prompt``).
"""
from __future__ import annotations

from typing import Any, Optional


def cut_length(keep: Optional[int], max_model_len: int) -> Optional[int]:
    """The tokens ``truncate_prompt_tokens`` keeps (-1: ``max_model_len``), None for all."""
    return None if keep is None else (max_model_len if keep == -1 else keep)


def tokenizer_cut(max_length: Optional[int]) -> dict[str, Any]:
    """The tokenizer's keyword arguments for at most ``max_length`` ids (none for None)."""
    return {} if max_length is None else {"truncation": True, "max_length": max_length}


def text_ids(tokenizer: Any, text: str, add_special_tokens: bool = True,
             max_length: Optional[int] = None) -> list[int]:
    """Token ids of ``text``; at most ``max_length`` of them, cut by the tokenizer, when set."""
    return tokenizer(text, add_special_tokens=add_special_tokens, **tokenizer_cut(max_length)).input_ids
