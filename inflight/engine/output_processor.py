"""Turns EngineCoreOutputs into RequestOutputs: detokenize, stop strings,
logprobs, and fan-in of the ``n`` samples of one request."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from inflight.core.outputs import EngineCoreOutput
from inflight.core.request import Request
from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.outputs import (CompletionOutput, Logprob, PoolingOutput, PoolingRequestOutput, PromptLogprobs,
                              RequestMetrics, RequestOutput)
from inflight.pooling.pooler import finish_pooled


@dataclass
class _SampleState:
    request: Request
    index: int
    detok: IncrementalDetokenizer
    completion: CompletionOutput


@dataclass
class _ParentState:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    samples: list[_SampleState] = field(default_factory=list)
    prompt_logprobs: Optional[PromptLogprobs] = None
    pooled: Optional[PoolingOutput] = None  # a pooling request's embedding or class probabilities, once finished


class OutputProcessor:
    """Per-request output state, owned by the engine."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, _ParentState] = {}
        self.child_to_parent: dict[str, tuple[str, int]] = {}

    def add_request(self, parent_id: str, prompt: Optional[str], children: list[Request]) -> None:
        state = _ParentState(parent_id, prompt, children[0].prompt_token_ids)
        for i, req in enumerate(children):
            p = req.sampling_params
            detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, p.skip_special_tokens,
                                           p.stop, p.include_stop_str_in_output, p.min_tokens)
            comp = CompletionOutput(index=i, logprobs=[] if p.logprobs is not None else None,
                                    cumulative_logprob=0.0 if p.logprobs is not None else None)
            state.samples.append(_SampleState(req, i, detok, comp))
            self.child_to_parent[req.request_id] = (parent_id, i)
        self.parents[parent_id] = state

    def child_ids(self, parent_id: str) -> list[str]:
        st = self.parents.get(parent_id)
        return [s.request.request_id for s in st.samples] if st else []

    def process(self, outputs: list[EngineCoreOutput]
                ) -> tuple[list[RequestOutput], list[str], dict[str, Exception]]:
        """Returns the step's RequestOutputs, child ids stopped by a stop string (the
        engine must finish those in the scheduler), and child ids whose detokenization
        or stop check raised, with the error (the engine fails their requests alone)."""
        touched: dict[str, _ParentState] = {}
        stopped: list[str] = []
        failed: dict[str, Exception] = {}
        for parent in self.parents.values():
            for s in parent.samples:
                s.completion.delta_token_ids = []
                s.completion.delta_text = ""
                s.completion.delta_logprobs = None
        for o in outputs:
            key = self.child_to_parent.get(o.request_id)
            if key is None:
                continue
            parent = self.parents[key[0]]
            sample = parent.samples[key[1]]
            try:
                if o.pooling_output is not None:
                    parent.pooled = PoolingOutput(finish_pooled(o.pooling_output, sample.request.pooling_params))
                if o.prompt_logprobs is not None and parent.prompt_logprobs is None:
                    parent.prompt_logprobs = [None] + [self._to_logprob_dict(e) for e in o.prompt_logprobs]
                if self._apply(sample, o):
                    stopped.append(o.request_id)
            except Exception as e:  # this request's text alone: it fails, the step goes on
                failed[o.request_id] = e
                continue
            touched[parent.request_id] = parent
        failed_parents = {self.child_to_parent[c][0] for c in failed}
        results = [self._make_output(p) for p in touched.values()
                   if p.request_id not in failed_parents and not _owed_prompt_logprobs(p)]
        return results, stopped, failed

    def _apply(self, s: _SampleState, o: EngineCoreOutput) -> bool:
        comp = s.completion
        if comp.finished:
            return False
        stop_str = None
        # As vLLM: the token that stopped the request (EOS or one of stop_token_ids) is not
        # text, unless include_stop_str_in_output (it shows with skip_special_tokens false).
        text_ids = o.new_token_ids[:-1] if o.finish_reason == "stop" and not s.detok.include_stop else o.new_token_ids
        for i, tok in enumerate(o.new_token_ids):
            comp.token_ids.append(tok)
            comp.delta_token_ids.append(tok)
            if i == len(text_ids):
                break
            stop_str = s.detok.add_token(tok)
            if stop_str is not None:
                break
        if o.new_logprobs and comp.logprobs is not None:
            new = [self._to_logprob_dict(entry) for entry in o.new_logprobs]
            comp.logprobs.extend(new)
            comp.delta_logprobs = new
            comp.cumulative_logprob += sum(entry[0][1] for entry in o.new_logprobs)
        if stop_str is not None:
            comp.finish_reason, comp.stop_reason = "stop", stop_str
        elif o.finish_reason is not None:
            comp.finish_reason, comp.stop_reason = o.finish_reason, o.stop_reason
        comp.delta_text = s.detok.take_delta(comp.finished)
        comp.text = s.detok.text if comp.finished else s.detok.text[:s.detok._emitted]
        return stop_str is not None and o.finish_reason is None

    def _to_logprob_dict(self, entry) -> dict[int, Logprob]:
        d: dict[int, Logprob] = {}
        for tok, lp, rank in entry:
            if tok not in d:
                d[tok] = Logprob(lp, rank, self.tokenizer.decode([tok]))
        return d

    def abort(self, parent_id: str) -> Union[RequestOutput, PoolingRequestOutput, None]:
        """Mark every unfinished sample aborted and return the final output."""
        parent = self.parents.get(parent_id)
        if parent is None:
            return None
        for s in parent.samples:
            s.completion.delta_token_ids, s.completion.delta_text = [], ""
            if not s.completion.finished:
                s.completion.finish_reason = "abort"
        return self._make_output(parent)

    def fail(self, parent_id: str, error: str, bad_input: bool) -> Union[RequestOutput, PoolingRequestOutput, None]:
        """Finish every sample of a request with finish_reason "error"; returns the final output."""
        parent = self.parents.get(parent_id)
        if parent is None:
            return None
        for s in parent.samples:
            s.completion.delta_token_ids, s.completion.delta_text = [], ""
            s.completion.finish_reason, s.completion.stop_reason = "error", None
        out = self._make_output(parent)
        out.error, out.error_is_bad_input = error, bad_input
        return out

    def _make_output(self, parent: _ParentState) -> Union[RequestOutput, PoolingRequestOutput]:
        comps = [s.completion for s in parent.samples]
        finished = all(c.finished for c in comps)
        first = parent.samples[0].request
        t = first.times
        metrics = RequestMetrics(t.arrival_time, t.first_scheduled_time, t.first_token_time,
                                 t.last_token_time, t.finished_time,
                                 sum(s.request.num_preemptions for s in parent.samples))
        if first.pooling_params is not None:
            out = PoolingRequestOutput(parent.request_id, parent.pooled, parent.prompt_token_ids, finished,
                                       max(first.num_cached_tokens, 0), parent.prompt, metrics)
        else:
            out = RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids,
                                [_snapshot(c) for c in comps], finished, metrics,
                                max(first.num_cached_tokens, 0), prompt_logprobs=parent.prompt_logprobs)
        if finished:
            del self.parents[parent.request_id]
            for s in parent.samples:
                self.child_to_parent.pop(s.request.request_id, None)
        return out


def _owed_prompt_logprobs(parent: _ParentState) -> bool:
    """True while another sample ran ahead of the one computing the prompt logprobs
    (it may skip the prompt through the prefix cache): its output waits, so the
    first output a client sees carries them. The handlers read the cumulative fields,
    so nothing is lost."""
    first = parent.samples[0]
    return (parent.prompt_logprobs is None and first.request.sampling_params.prompt_logprobs is not None
            and not first.completion.finished)


def _snapshot(c: CompletionOutput) -> CompletionOutput:
    """Copy so later steps do not mutate outputs already handed to the user."""
    return CompletionOutput(c.index, c.text, list(c.token_ids), c.cumulative_logprob,
                            list(c.logprobs) if c.logprobs is not None else None, c.finish_reason,
                            c.stop_reason, c.delta_text, list(c.delta_token_ids), c.delta_logprobs)
