"""Stop conditions: whether a request finishes after a sampled token."""
from __future__ import annotations

from typing import Optional

from inflight.core.request import Request, RequestStatus


def check_stop(req: Request, token: int, max_model_len: int) -> Optional[RequestStatus]:
    """The finished status ``token`` (already appended) gives ``req``, or None to go on.

    EOS and ``stop_token_ids`` count only once ``min_tokens`` are out, except that, as
    in vLLM, a grammar that has ended allows only stop tokens, so ``min_tokens`` yields
    to it. A stop token is recorded as ``req.stop_reason``; EOS is not (OpenAI's
    ``stop_reason`` is null for it). ``max_tokens`` and the model length cap every request.
    """
    params = req.sampling_params
    grammar_ended = req.structured_output is not None and req.structured_output.is_terminated
    if req.num_output_tokens >= params.min_tokens or grammar_ended:
        if not params.ignore_eos and token in req.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if token in params.stop_token_ids:
            req.stop_reason = token
            return RequestStatus.FINISHED_STOPPED
    if req.num_output_tokens >= req.max_tokens or req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


def append_tokens(req: Request, tokens: list[int], max_model_len: int) -> tuple[list[int], Optional[RequestStatus]]:
    """Append sampled ``tokens`` to ``req`` up to the first that stops it; returns the tokens
    appended and the finished status (None to go on). Tokens after a stop are dropped."""
    new: list[int] = []
    for token in tokens:
        req.append_output_token(token)
        new.append(token)
        status = check_stop(req, token, max_model_len)
        if status is not None:
            return new, status
    return new, None
