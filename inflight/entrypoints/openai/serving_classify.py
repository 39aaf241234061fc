"""``POST /classify`` (vLLM's, also ``/v1/classify``): a sequence classifier's label
probabilities for each input."""
from __future__ import annotations

import time
from typing import Literal, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, model_validator

from inflight.entrypoints.openai.errors import OpenAIError
from inflight.entrypoints.openai.protocol import Int64, OpenAIBaseModel
from inflight.entrypoints.openai.protocol_embeddings import EmbeddingInput, check_inputs, inputs_of
from inflight.entrypoints.openai.responses import UsageInfo, dump, random_id
from inflight.entrypoints.openai.serving_common import (CLIENT_CLOSED, ServerState, add_requests, final_outputs,
                                                        unless_disconnected)
from inflight.entrypoints.openai.serving_embedding import EmbeddingHandler
from inflight.entrypoints.openai.validation import SafeStr
from inflight.pooling_params import PoolingParams



class ClassificationRequest(OpenAIBaseModel):
    model: Optional[SafeStr] = None
    input: EmbeddingInput
    use_activation: Optional[bool] = None  # probabilities (None: yes); false: the raw logits
    truncate_prompt_tokens: Optional[Int64] = Field(default=None, ge=-1)
    # vLLM's: "right" keeps the first truncate_prompt_tokens ([CLS] and a pair's query: the default
    # here), "left" the last
    truncation_side: Optional[Literal["left", "right"]] = None
    add_special_tokens: bool = True
    priority: Int64 = 0
    user: Optional[SafeStr] = None

    @model_validator(mode="after")
    def _check(self) -> "ClassificationRequest":
        check_inputs(self.input)
        return self

    def inputs(self) -> list:
        return inputs_of(self.input)


class ClassificationData(BaseModel):
    index: int
    label: Optional[str]
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ClassificationHandler:
    """Serves a sequence classifier's probabilities; input handling as ``/v1/embeddings``'."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def create(self, req: ClassificationRequest, raw: Request) -> Response:
        state = self.state
        state.check_model(req.model)
        if state.pooler_config is None or state.pooler_config.task != "classify":
            raise OpenAIError(404, f"The model `{state.model_name}` is not a sequence classifier "
                                   "(a *ForSequenceClassification checkpoint served with --runner pooling).",
                              param="model", code="model_not_supported")
        inputs = EmbeddingHandler(state)
        params = inputs.checked_params(PoolingParams(use_activation=req.use_activation, task="classify",
                                                     truncate_prompt_tokens=req.truncate_prompt_tokens))
        state.check_capacity(len(req.inputs()))
        prompts = [await inputs.engine_prompt(p, req, req.add_special_tokens)
                   for p in req.inputs()]
        streams = await add_requests(state, random_id("classify"), prompts, params, req.priority, model=req.model)
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=CLIENT_CLOSED)
        labels = state.pooler_config.labels or []
        data = []
        for i, out in enumerate(outputs):
            probs = out.outputs.data.tolist()
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append(ClassificationData(index=i, label=labels[best] if best < len(labels) else None, probs=probs,
                                           num_classes=len(probs)))
        n = sum(len(o.prompt_token_ids) for o in outputs)
        body = ClassificationResponse(id=random_id("classify"), created=int(time.time()),
                                      model=state.answer_model(req.model), data=data,
                                      usage=UsageInfo(prompt_tokens=n, total_tokens=n))
        return JSONResponse(dump(body))
