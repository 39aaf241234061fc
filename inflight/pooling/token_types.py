"""Token types (BERT's segment ids) carried inside prompt token ids, as vLLM carries them.

A BERT cross-encoder reads a (query, document) pair with token type 0 for the query's
tokens and 1 for the document's. The engine moves token ids, not types, so a pair's types
ride in the ids' high bits, ``id | type << TOKEN_TYPE_SHIFT`` (vLLM's encoding), and the
encoder's embedding splits them again; nothing between reads a type. Vocabularies stay far
below 2**30 ids.
"""
from __future__ import annotations

from typing import Optional

from inflight.pooling.truncation import tokenizer_cut

TOKEN_TYPE_SHIFT = 30
TOKEN_ID_MASK = (1 << TOKEN_TYPE_SHIFT) - 1


def encode_token_types(ids: list[int], types: list[int]) -> list[int]:
    """``ids`` with each token's type in its high bits."""
    return [t | (k << TOKEN_TYPE_SHIFT) for t, k in zip(ids, types)]


def strip_token_types(ids: list[int]) -> list[int]:
    """The plain token ids of ``ids`` (types dropped)."""
    return [t & TOKEN_ID_MASK for t in ids]


def check_token_types(ids: list[int], vocab_size: int, type_vocab_size: int) -> None:
    """ValueError unless every id is in the vocabulary and every type below ``type_vocab_size``."""
    if any(not 0 <= (t & TOKEN_ID_MASK) < vocab_size or t >> TOKEN_TYPE_SHIFT >= type_vocab_size for t in ids):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), token types in [0, {type_vocab_size})")


def pair_ids(tokenizer, first: str, second: str, typed: bool, max_length: Optional[int] = None) -> list[int]:
    """A (query, document) pair as one prompt, the tokenizer's text pair, at most ``max_length``
    tokens when set (the tokenizer trims the longer text); with ``typed`` (a BERT cross-encoder)
    each token's type rides in its id."""
    enc = tokenizer(first, text_pair=second, return_token_type_ids=typed, **tokenizer_cut(max_length))
    return encode_token_types(enc["input_ids"], enc["token_type_ids"]) if typed else enc["input_ids"]
