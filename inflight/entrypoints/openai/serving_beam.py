"""``use_beam_search`` on completions and chat completions (vLLM's): ``n`` is the beam
width and the answer's choices are the ``n`` best sequences, best first, not streamed.

Each prompt's search runs its rounds as engine requests (``inflight.beam_search``),
admitted whole: the rounds skip the waiting-queue check the request passed once. A
client that leaves aborts the round in flight, and no more are added.
"""
from __future__ import annotations

import asyncio
from typing import Any

from inflight.beam_search import BeamSearch
from inflight.entrypoints.openai.errors import bad_request
from inflight.entrypoints.openai.http_options import log_request
from inflight.entrypoints.openai.serving_common import ServerState, add_engine_requests, final_outputs
from inflight.outputs import CompletionOutput, Logprob, RequestOutput
from inflight.sampling_params import BeamSearchParams, SamplingParams


async def beam_search(state: ServerState, request_id: str, prompts: list[dict[str, Any]], params: SamplingParams,
                      req: Any) -> list[RequestOutput]:
    """Every prompt's search at once; one finished RequestOutput each, its outputs the
    ``n`` best sequences. 400 for a prompt that leaves no room for ``max_tokens``."""
    searches = []
    for prompt in prompts:
        ids = prompt["prompt_token_ids"]
        max_tokens = params.max_tokens or state.max_model_len - len(ids)
        if len(ids) + max_tokens > state.max_model_len:
            raise bad_request(f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds max_model_len "
                              f"({state.max_model_len})", "max_tokens")
        beam = BeamSearchParams(beam_width=params.n, max_tokens=max_tokens, ignore_eos=params.ignore_eos,
                                temperature=params.temperature, length_penalty=req.length_penalty,
                                include_stop_str_in_output=params.include_stop_str_in_output,
                                skip_special_tokens=params.skip_special_tokens)
        searches.append(BeamSearch(ids, beam, state.eos_token_ids, params.logprobs))
    if state.log_requests:
        log_request(request_id, prompts, params, state.max_log_len)
    tasks = [asyncio.ensure_future(_run(state, f"{request_id}-{i}", s, prompt, req))
             for i, (s, prompt) in enumerate(zip(searches, prompts))]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:  # one search failed (or the client left): the others add no more rounds
            task.cancel()


async def _run(state: ServerState, search_id: str, search: BeamSearch, prompt: dict[str, Any],
               req: Any) -> RequestOutput:
    while not search.done:
        ids = [f"{search_id}-{search.rounds}-{j}" for j in range(len(search.beams))]
        streams = await add_engine_requests(state, ids, search.step_prompts(), search.step_params(), req.priority,
                                            req.cache_salt, req.model)
        search.advance(await final_outputs(streams))
    return _answer(state, search_id, search, prompt)


def _answer(state: ServerState, search_id: str, search: BeamSearch, prompt: dict[str, Any]) -> RequestOutput:
    params, top = search.params, search.num_logprobs_asked
    outputs = []
    for i, seq in enumerate(search.best()):
        tokens, logprobs = search.generated(seq)
        shown = None if top is None else [_top(entry, tok, top) for tok, entry in zip(tokens, logprobs)]
        outputs.append(CompletionOutput(
            index=i, text=state.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens),
            token_ids=tokens, cumulative_logprob=seq.cum_logprob, logprobs=shown,
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
    return RequestOutput(search_id, prompt.get("prompt"), list(prompt["prompt_token_ids"]), outputs, finished=True)


def _top(entry: dict[int, Logprob], token: int, k: int) -> dict[int, Logprob]:
    """A token's logprobs as the client asked: the token itself and the top ``k``."""
    ranked = sorted(entry.items(), key=lambda kv: -kv[1].logprob)
    return {token: entry[token], **dict(ranked[:k])}

