"""``POST /v1/embeddings``: one engine pooling request per input, answered together."""
from __future__ import annotations

import base64
import sys
import time
from typing import Any, Union

import torch
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from inflight.entrypoints.openai.errors import OpenAIError, bad_request
from inflight.entrypoints.openai.protocol_embeddings import (EmbeddingRequest, EmbeddingResponse,
                                                             EmbeddingResponseData)
from inflight.entrypoints.openai.responses import UsageInfo, dump, random_id
from inflight.entrypoints.openai.serving_common import (CLIENT_CLOSED, ServerState, add_requests, final_outputs,
                                                        unless_disconnected)
from inflight.entrypoints.openai.validation import check_truncation
from inflight.errors import InvalidRequestError
from inflight.outputs import PoolingRequestOutput
from inflight.pooling_params import PoolingParams

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class EmbeddingHandler:
    """Serves embeddings against the shared server state (a pooling model's)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def create(self, req: EmbeddingRequest, raw: Request) -> Response:
        state = self.state
        state.check_model(req.model)
        if state.pooler_config is None or state.pooler_config.task != "embed":
            what = "generates text" if state.pooler_config is None else "is a classifier (/classify)"
            raise OpenAIError(404, f"The model `{state.model_name}` {what}; embeddings need an embedding model "
                                   "(served with --runner pooling).", param="model", code="model_not_supported")
        params = self.checked_params(PoolingParams(dimensions=req.dimensions, use_activation=req.use_activation,
                                                   truncate_prompt_tokens=req.truncate_prompt_tokens))
        state.check_capacity(max(1, len(req.inputs())))
        add = req.add_special_tokens
        prompts = ([await self.engine_prompt(p, req, True if add is None else add)
                    for p in req.inputs()] or [await self._chat_prompt(req)])
        request_id, created = random_id("embd"), int(time.time())
        streams = await add_requests(state, request_id, prompts, params, req.priority, req.cache_salt,
                                     model=req.model)
        outputs = await unless_disconnected(raw, final_outputs(streams))
        if outputs is None:
            return Response(status_code=CLIENT_CLOSED)
        data = [EmbeddingResponseData(index=i, embedding=encode(o, req)) for i, o in enumerate(outputs)]
        n = sum(len(o.prompt_token_ids) for o in outputs)
        body = EmbeddingResponse(id=request_id, created=created, model=state.answer_model(req.model), data=data,
                                 usage=UsageInfo(prompt_tokens=n, total_tokens=n))
        return JSONResponse(dump(body))

    def checked_params(self, params: PoolingParams) -> PoolingParams:
        """``params`` checked against the model's pooler (400 naming the field)."""
        state = self.state
        try:
            check_truncation(params.truncate_prompt_tokens, state.max_model_len)
            params.resolve(state.pooler_config, state.hidden_size or 0, state.model_name)
        except InvalidRequestError as e:
            field = "dimensions" if "dimensions" in str(e) else "truncate_prompt_tokens"
            raise bad_request(str(e), field) from None
        return params

    async def engine_prompt(self, item: Union[str, list[int]], req: Any,
                            add_special_tokens: bool = True) -> dict[str, Any]:
        """A text (tokenized on the tokenizer pool) or token ids, cut as ``req`` asks and checked."""
        state = self.state
        if isinstance(item, str):
            prompt = {"prompt": item, "prompt_token_ids": await state.tokenize(item, add_special_tokens, req)}
        else:
            prompt = {"prompt": None, "prompt_token_ids": list(item)}
        return self._checked(state.truncated(prompt, req))

    async def _chat_prompt(self, req: EmbeddingRequest) -> dict[str, Any]:
        prompt = await self.state.render_chat(req, req.chat_template_kwargs)
        return self._checked(self.state.truncated(prompt, req))

    def _checked(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """A prompt fits max_model_len (all of it: nothing is generated) and the vocabulary."""
        ids, state = prompt["prompt_token_ids"], self.state
        if len(ids) > state.max_model_len:
            raise bad_request(f"input: {len(ids)} tokens do not fit max_model_len ({state.max_model_len}); "
                              "set truncate_prompt_tokens to cut it", "input")
        if state.vocab_size is not None and any(not 0 <= t < state.vocab_size for t in ids):
            raise bad_request(f"input: token ids must be in [0, {state.vocab_size})", "input")
        return prompt


def encode(out: PoolingRequestOutput, req: EmbeddingRequest) -> Union[list[float], str]:
    """An embedding as floats, or as base64 of its bytes in ``embed_dtype`` (OpenAI's float32 default)."""
    data = out.outputs.data
    if req.encoding_format == "float":
        return data.tolist()
    raw = data.to(_DTYPES[req.embed_dtype]).contiguous().view(torch.uint8).numpy().tobytes()
    order = sys.byteorder if req.endianness == "native" else req.endianness
    if order != sys.byteorder:
        width = data.to(_DTYPES[req.embed_dtype]).element_size()
        raw = b"".join(raw[i:i + width][::-1] for i in range(0, len(raw), width))
    return base64.b64encode(raw).decode("ascii")
