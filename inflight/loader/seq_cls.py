"""A causal LM served as a sequence classifier from a few of its vocabulary's logits, as vLLM
converts one (Qwen3-Reranker): ``classifier_from_token`` names the tokens, ``method`` how their
lm_head rows become the ``score`` head.

- ``from_2_way_softmax`` (two tokens, "no" then "yes"): one label whose logit is the
  difference of the two rows, so its sigmoid is the softmax of the two logits' "yes";
  ``is_original_qwen3_reranker`` sets it with its tokens.
- ``no_post_processing``: one label per token, its row as it is.

The settings arrive through ``hf_overrides`` with ``architectures`` set to the
``XForSequenceClassification`` of the model (vLLM's recipe); the head is computed from the
checkpoint's lm_head (or its tied embedding) when the model reads ``score.weight``.
"""
from __future__ import annotations

from typing import Any

import torch

from .stream import WeightSource
from .types import ModelLoadError

METHODS = ("from_2_way_softmax", "no_post_processing")


def classifier_settings(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """``raw`` with ``num_labels`` and ``classifier_method`` set where it asks for a classifier
    from tokens; ModelLoadError for settings that cannot make one."""
    tokens = raw.get("classifier_from_token")
    method = raw.get("method")
    if raw.get("is_original_qwen3_reranker"):
        method = "from_2_way_softmax"
    if tokens is None and method is None:
        return raw
    archs = raw.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else str(archs)
    if not arch.endswith("ForSequenceClassification"):
        raise ModelLoadError(f"{source}: classifier_from_token needs a sequence classifier's architecture; set "
                             f"hf_overrides' \"architectures\" to its *ForSequenceClassification (got {arch!r})")
    if method not in METHODS:
        raise ModelLoadError(f"{source}: method must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens) \
            or (method == "from_2_way_softmax" and len(tokens) != 2):
        want = "two tokens (false, then true)" if method == "from_2_way_softmax" else "a list of tokens"
        raise ModelLoadError(f"{source}: classifier_from_token must be {want}, got {tokens!r}")
    labels = 1 if method == "from_2_way_softmax" else len(tokens)
    return {**raw, "classifier_method": method, "num_labels": labels}


def token_ids(tokenizer: Any, tokens: list[str], source: str) -> list[int]:
    """Each classifier token's id; ModelLoadError for one the vocabulary lacks."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    unknown = [t for t, i in zip(tokens, ids) if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise ModelLoadError(f"{source}: classifier_from_token {unknown} not in the tokenizer's vocabulary")
    return ids


class ScoreFromTokens(WeightSource):
    """``base`` plus a ``score.weight`` made from rows of its logits head (lm_head, or the
    embedding a tied model projects with)."""

    def __init__(self, base: WeightSource, ids: list[int], method: str) -> None:
        self.base, self.ids, self.method = base, ids, method
        self.head = "lm_head.weight" if "lm_head.weight" in base.keys() else "model.embed_tokens.weight"
        if self.head not in base.keys():
            raise ModelLoadError("classifier_from_token: the checkpoint has neither lm_head.weight nor "
                                 "model.embed_tokens.weight to read the tokens' rows from")
        self.entries = {name: None for name in base.keys()}
        self.entries["score.weight"] = None

    def keep(self, names: set[str]) -> None:
        super().keep(names)
        self.base.keep((names - {"score.weight"}) | {self.head})

    def shape(self, name: str) -> tuple[int, ...]:
        if name != "score.weight":
            return self.base.shape(name)
        hidden = self.base.shape(self.head)[1]
        return (1 if self.method == "from_2_way_softmax" else len(self.ids), hidden)

    def dtype(self, name: str) -> torch.dtype:
        return torch.float32 if name == "score.weight" else self.base.dtype(name)

    def read_into(self, name: str, out: torch.Tensor) -> None:
        if name != "score.weight":
            self.base.read_into(name, out)
            return
        rows = self.base[self.head][self.ids].to(torch.float32)
        out.copy_(rows[1:] - rows[:1] if self.method == "from_2_way_softmax" else rows)
