"""``/score`` and ``/rerank`` (vLLM's, also under ``/v1`` and ``/v2/rerank``). With an embedding
model each pair's score is the cosine similarity of the two texts' embeddings (a query
shared by every document is embedded once); with a cross-encoder (a classifier of one
label) it is the classifier's probability for the pair read as one prompt, as vLLM scores."""
from __future__ import annotations

import time
from typing import Literal, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, model_validator

from inflight.entrypoints.openai.errors import OpenAIError, bad_request
from inflight.entrypoints.openai.protocol import Int64, OpenAIBaseModel
from inflight.entrypoints.openai.protocol_embeddings import MAX_EMBEDDING_INPUTS
from inflight.entrypoints.openai.responses import UsageInfo, dump, random_id
from inflight.entrypoints.openai.serving_common import (CLIENT_CLOSED, ServerState, add_requests, final_outputs,
                                                        unless_disconnected)
from inflight.entrypoints.openai.validation import SafeStr, check_truncation
from inflight.errors import InvalidRequestError
from inflight.pooling.pooler import cosine_scores
from inflight.pooling.token_types import pair_ids
from inflight.pooling_params import PoolingParams

Texts = Union[SafeStr, list[SafeStr]]


class _ScoringFields(OpenAIBaseModel):
    model: Optional[SafeStr] = None
    truncate_prompt_tokens: Optional[Int64] = Field(default=None, ge=-1)
    # vLLM's: "right" keeps the first truncate_prompt_tokens ([CLS] and a pair's query: the default
    # here), "left" the last
    truncation_side: Optional[Literal["left", "right"]] = None
    priority: Int64 = 0


class ScoreRequest(_ScoringFields):
    """``text_1`` / ``text_2`` (or vLLM's other spellings: ``queries`` with ``documents`` or
    ``items``, ``data_1`` / ``data_2``): 1:1, 1:N or N:N texts."""

    text_1: Optional[Texts] = None
    text_2: Optional[Texts] = None

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data):
        if isinstance(data, dict) and "text_1" not in data:
            for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
                if first in data and second in data:
                    return {**data, "text_1": data[first], "text_2": data[second]}
        return data

    @model_validator(mode="after")
    def _check(self) -> "ScoreRequest":
        if self.text_1 is None or self.text_2 is None:
            raise ValueError("text_1: give text_1 and text_2 (or queries and documents)")
        check_pairs(as_list(self.text_1), as_list(self.text_2))
        return self


class RerankRequest(_ScoringFields):
    query: SafeStr
    documents: list[SafeStr] = Field(min_length=1)
    top_n: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "RerankRequest":
        check_pairs([self.query], self.documents)
        return self


def as_list(texts: Texts) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def check_pairs(first: list[str], second: list[str]) -> None:
    """vLLM's pairing rule (1:1, 1:N or N:N), within OpenAI's input limit; no empty text."""
    if not first or not second:
        raise ValueError("At least one text element must be given")
    if len(first) > 1 and len(first) != len(second):
        raise ValueError("Input lengths must be either 1:1, 1:N or N:N")
    if len(first) + len(second) > MAX_EMBEDDING_INPUTS:
        raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} texts per request, got {len(first) + len(second)}")
    if any(not t for t in first + second):
        raise ValueError("texts must not be empty")


class ScoreResponseData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ScoreHandler:
    """Scores pairs of texts with a pooling model's embeddings."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def score(self, req: ScoreRequest, raw: Request) -> Response:
        scored = await self._cosines(req, as_list(req.text_1), as_list(req.text_2), raw)
        if scored is None:
            return Response(status_code=CLIENT_CLOSED)
        scores, n = scored
        body = ScoreResponse(id=random_id("score"), created=int(time.time()), model=self.state.answer_model(req.model),
                             data=[ScoreResponseData(index=i, score=s) for i, s in enumerate(scores)],
                             usage=UsageInfo(prompt_tokens=n, total_tokens=n))
        return JSONResponse(dump(body))

    async def rerank(self, req: RerankRequest, raw: Request) -> Response:
        scored = await self._cosines(req, [req.query], req.documents, raw)
        if scored is None:
            return Response(status_code=CLIENT_CLOSED)
        scores, n = scored
        results = sorted((RerankResult(index=i, document=RerankDocument(text=d), relevance_score=s)
                          for i, (d, s) in enumerate(zip(req.documents, scores))),
                         key=lambda r: r.relevance_score, reverse=True)
        body = RerankResponse(id=random_id("rerank"), model=self.state.answer_model(req.model),
                              usage=RerankUsage(prompt_tokens=n, total_tokens=n),
                              results=results[:req.top_n or len(results)])
        return JSONResponse(dump(body))

    async def _cosines(self, req: _ScoringFields, first: list[str], second: list[str],
                       raw: Request) -> Optional[tuple[list[float], int]]:
        """Each pair's cosine similarity and the prompt tokens embedded; None if the client left."""
        state = self.state
        state.check_model(req.model)
        pooler = state.pooler_config
        cross = pooler is not None and pooler.task == "classify"
        if pooler is None or (cross and len(pooler.labels or []) != 1):
            what = "generates text" if pooler is None else "is a classifier of several labels"
            raise OpenAIError(404, f"The model `{state.model_name}` {what}; scores need an embedding model or a "
                                   "cross-encoder (a classifier of one label), served with --runner pooling.",
                              param="model", code="model_not_supported")
        try:
            check_truncation(req.truncate_prompt_tokens, state.max_model_len)
        except InvalidRequestError as e:
            raise bad_request(str(e), "truncate_prompt_tokens") from None
        if cross:  # each pair is one prompt, as the tokenizer joins a text and its pair
            first = first * len(second) if len(first) == 1 else first
            texts = [(a, b) for a, b in zip(first, second)]
        else:
            texts = first + second
        state.check_capacity(len(texts))
        prompts = [await self._prompt(t, req) for t in texts]
        # NOTE: cosine similarity ignores the norm: the model's normalization does not change a score
        streams = await add_requests(state, random_id("score"), prompts, PoolingParams(), req.priority,
                                     model=req.model)
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return None
        n = sum(len(o.prompt_token_ids) for o in outputs)
        if cross:
            return [o.outputs.data[0].item() for o in outputs], n
        vectors = [o.outputs.data for o in outputs]
        return cosine_scores(vectors[:len(first)], vectors[len(first):]), n

    async def _prompt(self, text: Union[str, tuple[str, str]], req: _ScoringFields) -> dict:
        state = self.state
        if isinstance(text, tuple):  # cut by the tokenizer, as a text (pooling/truncation.py)
            typed = state.pooler_config.token_types
            ids = await state.pool.run(pair_ids, state.tokenizer, text[0], text[1], typed, state.cut_by_tokenizer(req))
        else:
            ids = await state.tokenize(text, True, req)
        p = state.truncated({"prompt": None, "prompt_token_ids": ids}, req)
        if len(p["prompt_token_ids"]) > state.max_model_len:
            raise bad_request(f"a text of {len(p['prompt_token_ids'])} tokens does not fit max_model_len "
                              f"({state.max_model_len}); set truncate_prompt_tokens to cut it", "input")
        return p
