"""The synchronous engine: add requests, call ``step()``, get RequestOutputs."""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import replace
from typing import Any, Optional, Union

from inflight.config import EngineConfig
from inflight.core.admission import longest_feasible
from inflight.core.request import Request, RequestStatus
from inflight.core.scheduler import Scheduler
from inflight.distributed.kv_transfer.factory import start_step
from inflight.engine.generation_config import default_sampling_params
from inflight.engine.output_processor import OutputProcessor
from inflight.engine.step_trace import StepTrace
from inflight.errors import InvalidRequestError
from inflight.lora.request import LoRARequest
from inflight.outputs import PoolingRequestOutput, RequestOutput
from inflight.pooling.config import PoolerConfig, resolve_pooler, run_prompts_whole
from inflight.pooling.token_types import check_token_types
from inflight.pooling.truncation import cut_length, text_ids
from inflight.pooling_params import PoolingParams
from inflight.inputs import PromptType, as_priority, token_ids
from inflight.sampling_params import SamplingParams, bad_words_token_ids, truncate_prompt
from inflight.structured_output.manager import StructuredOutputManager
from inflight.structured_output.masks import GrammarMasks

logger = logging.getLogger(__name__)



class LLMEngine:
    """Owns the tokenizer, scheduler, model runner and output processor.

    One ``step()`` = schedule, one forward pass over the flattened batch,
    update, detokenize. Not thread-safe: the async engine drives it from one thread.
    """

    pooler_config: Optional[PoolerConfig] = None  # a pooling model's pooler; None: the model generates

    def __init__(self, config: EngineConfig) -> None:
        from inflight.executor import Executor
        from inflight.loader import load_model

        self.config = config
        t0 = time.time()
        loaded = load_model(config.model_config.model, quantization=config.model_config.quantization,
                            hf_overrides=config.model_config.hf_overrides)
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = tuple(loaded.eos_token_ids)
        self.model_source = loaded.source
        mc = config.model_config
        # None: a generative model; else the pooler of a pooling model (inflight/pooling)
        mc.pooler_config = self.pooler_config = resolve_pooler(mc.runner, mc.convert, mc.pooler_config,
                                                               loaded.source, loaded.hf_config,
                                                               config.scheduler_config.scheduling)
        if self.pooler_config is not None:  # NOTE: a pooling model's prompt keeps its first tokens
            self.tokenizer.truncation_side = "right"
        if loaded.hf_config.get("is_encoder_only"):
            run_prompts_whole(config.scheduler_config, config.cache_config)
        self.default_sampling_params = default_sampling_params(loaded.source, mc.generation_config,
                                                               mc.override_generation_config)
        # uni: the runner in this process; mp / ray: a worker per tensor-parallel rank
        self.executor = Executor.get_class(config.parallel_config)(config, loaded.hf_config, loaded.weights)
        del loaded
        built = self.executor.built
        self.runner = self.executor.runner  # None where the ranks run in other processes
        self.arch = built.arch
        self.dtype, self.device = built.dtype, built.device
        self.max_model_len = built.max_model_len
        self.num_blocks = built.num_blocks
        # the batching policy (continuous or static) follows config.scheduler_config.scheduling
        self.scheduler = Scheduler(config.scheduler_config, config.cache_config, built.num_blocks, self.max_model_len,
                                   num_host_blocks=built.num_host_blocks,
                                   speculative_config=config.speculative_config,
                                   sliding_window=built.arch.kv_sliding_window,
                                   layer_windows=built.layer_windows,
                                   max_loras=config.lora_config.max_loras if config.lora_config else None)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.structured_output = StructuredOutputManager(self.tokenizer, self.arch.vocab_size, self.eos_token_ids)
        self.scheduler.grammar_masks = GrammarMasks(self.arch.vocab_size)
        from inflight.distributed.kv_transfer.factory import make_kv_connector
        self.kv_connector = make_kv_connector(config, self.scheduler, self.runner, self.arch)
        self._ids = itertools.count()
        self.step_count = 0
        self.last_num_scheduled_tokens = 0
        self._trace = StepTrace(config.trace_file) if config.trace_file else None
        logger.info("engine ready in %.1f s: %s, %s on %s; KV cache: %d blocks = %d tokens",
                    time.time() - t0, self.model_source, self.dtype, self.device,
                    self.num_blocks, self.num_blocks * config.cache_config.block_size)
        # what a request that sets no max_tokens may be given (the server's chat default)
        self.max_sequence_tokens = longest_feasible(config.scheduler_config, self.scheduler.kv, self.max_model_len)
        if self.max_sequence_tokens < self.max_model_len:
            logger.warning("the KV cache holds one request of at most %d tokens, fewer than max_model_len (%d): "
                           "longer requests are refused; lower --max-model-len or give the cache more memory "
                           "(--kv-cache-memory)", self.max_sequence_tokens, self.max_model_len)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "LLMEngine":
        return cls(EngineConfig.from_kwargs(**kwargs))

    # ------------------------------------------------------------------ intake
    def tokenize_prompt(self, prompt: PromptType,
                        max_length: Optional[int] = None) -> tuple[Optional[str], list[int]]:
        """Accept a string, a token-id list, or {"prompt": ...} / {"prompt_token_ids": ...}; a
        text's ids at most ``max_length`` (cut by the tokenizer) when set."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), token_ids(prompt["prompt_token_ids"])
            if not isinstance(prompt.get("prompt"), str):
                raise ValueError('a dict prompt needs "prompt" (text) or "prompt_token_ids"')
            prompt = prompt["prompt"]
        if isinstance(prompt, str):
            return prompt, text_ids(self.tokenizer, prompt, max_length=max_length)
        return None, token_ids(prompt)

    def _prompt_ids(self, prompt: PromptType, truncate: Optional[int]) -> tuple[Optional[str], list[int]]:
        """Text and token ids, cut to ``truncate`` tokens when set: the last ones for a generating
        model (whose cut prompt has no text: it no longer matches its ids), the first for a
        pooling model, as vLLM cuts for each runner."""
        pooling = self.pooler_config is not None  # pooling/truncation.py
        text, ids = self.tokenize_prompt(prompt, cut_length(truncate, self.max_model_len) if pooling else None)
        cut = truncate_prompt(ids, truncate, self.max_model_len, "right" if pooling else "left")
        return (text, ids) if cut is None else (None, cut)

    def add_request(self, request_id: Optional[str], prompt: PromptType,
                    params: Union[SamplingParams, PoolingParams, None] = None,
                    arrival_time: Optional[float] = None, priority: int = 0,
                    cache_salt: Optional[str] = None, lora_request: Optional[LoRARequest] = None) -> str:
        """Validate and queue a request; raises ValueError naming the limit it breaks.

        ``params``: SamplingParams to generate, PoolingParams for a pooling model's embedding.
        ``cache_salt`` (vLLM's): only requests with the same salt share prefix-cache blocks.
        ``lora_request``: the LoRA adapter to run with (needs ``enable_lora``); it is
        loaded and checked here, so a bad adapter fails this call alone."""
        request_id = request_id if request_id is not None else str(next(self._ids))
        priority = as_priority(priority)
        if request_id in self.output_processor.parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if isinstance(params, PoolingParams) or (params is None and self.pooler_config is not None):
            return self._add_pooling_request(request_id, prompt, params or PoolingParams(), arrival_time, priority,
                                             cache_salt, lora_request)
        if self.pooler_config is not None:
            raise ValueError("this model runs with runner='pooling' (--runner pooling): it returns embeddings or "
                             "classes (LLM.embed, LLM.classify) and does not generate")
        params = params or SamplingParams()
        text, ids = self._prompt_ids(prompt, params.truncate_prompt_tokens)
        self._validate(ids, params)
        if lora_request is not None:
            self.add_lora(lora_request)
        if params.bad_words:
            params = replace(params, bad_words_token_ids=bad_words_token_ids(self.tokenizer, params.bad_words))
        if params.max_tokens is None:  # the rest of the context, or of what the KV pool holds
            params = replace(params, max_tokens=max(1, self.max_sequence_tokens - len(ids)))
        arrival = arrival_time if arrival_time is not None else time.time()
        children = []
        for i in range(params.n):
            cid = request_id if params.n == 1 else f"{request_id}#{i}"
            # the samples share the prompt: only the first computes its logprobs
            p = params if params.n == 1 else replace(params, n=1, seed=None if params.seed is None else params.seed + i,
                                                     prompt_logprobs=params.prompt_logprobs if i == 0 else None)
            children.append(Request(cid, ids, p, self.eos_token_ids, arrival, priority, cache_salt=cache_salt,
                                    lora_request=lora_request))
        for child in children:
            self.scheduler.check_feasible(child)
        if params.structured_outputs is not None:
            for child in children:  # compiled already when the server sent it: a cache hit here
                child.structured_output = self.structured_output.new_state(params.structured_outputs)
        for child in children:  # a request whose prompt KV is pulled waits in the connector first
            if self.kv_connector is None or not self.kv_connector.add_remote_request(child):
                self.scheduler.add_request(child)
        self.output_processor.add_request(request_id, text, children)
        return request_id

    def _add_pooling_request(self, request_id: str, prompt: PromptType, params: PoolingParams,
                             arrival_time: Optional[float], priority: int, cache_salt: Optional[str],
                             lora_request: Optional[LoRARequest]) -> str:
        """Queue a pooling request: its prompt is computed, then it finishes with its embedding."""
        if self.pooler_config is None:
            raise ValueError("embeddings need a pooling model: start the engine with runner='pooling' "
                             "(--runner pooling)")
        params = params.resolve(self.pooler_config, self.arch.hidden_size,
                                self.config.model_config.served_model_name or self.model_source)
        text, ids = self._prompt_ids(prompt, params.truncate_prompt_tokens)
        self._validate(ids, params)
        if lora_request is not None:
            self.add_lora(lora_request)
        # NOTE: max_tokens=1 only sizes the feasibility check; a pooling request samples nothing
        req = Request(request_id, ids, SamplingParams(max_tokens=1, temperature=0.0), (),
                      arrival_time if arrival_time is not None else time.time(), priority, cache_salt=cache_salt,
                      lora_request=lora_request, pooling_params=params)
        self.scheduler.check_feasible(req)
        self.scheduler.add_request(req)
        self.output_processor.add_request(request_id, text, [req])
        return request_id

    def _validate(self, ids: list[int], params: Union[SamplingParams, PoolingParams]) -> None:
        if not ids:
            raise ValueError("the prompt is empty: it must contain at least one token")
        vocab = self.arch.vocab_size
        if self.pooler_config is not None and self.pooler_config.token_types:  # a BERT cross-encoder's pairs
            check_token_types(ids, vocab, self.arch.type_vocab_size)
        elif any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if isinstance(params, PoolingParams):  # nothing is generated: the prompt may fill the context
            if len(ids) > self.max_model_len:
                raise ValueError(f"the prompt ({len(ids)} tokens) exceeds max_model_len ({self.max_model_len})")
            return
        params.verify_vocab(vocab)  # ids past the vocabulary would fail the sampler's scatter: the whole step
        params.verify_max_logprobs(self.config.model_config.max_logprobs)
        total = len(ids) + (params.max_tokens or 0)
        if len(ids) >= self.max_model_len or total > self.max_model_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len ({self.max_model_len})")

    # ------------------------------------------------------------------- LoRA
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load and check an adapter (vLLM's ``add_lora``): ValueError for one that cannot run
        on this model, or when the engine runs without ``enable_lora``."""
        if self.config.lora_config is None or self.runner is None or self.runner.lora is None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} asked for, but the engine runs without "
                             "LoRA: start it with enable_lora=True (--enable-lora)")
        self.runner.lora.add(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop a loaded adapter's weights; requests that name it later load it again."""
        return self.runner is not None and self.runner.lora is not None and self.runner.lora.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        """The ids of the adapters loaded now."""
        lora = self.runner.lora if self.runner is not None else None
        return {r.lora_int_id for r in lora.loaded()} if lora is not None else set()

    def abort_request(self, request_ids: Union[str, list[str]]) -> list[RequestOutput]:
        """Stop requests now; their KV blocks return to the pool before the next step."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        outs = []
        for rid in ids:
            self.scheduler.abort_requests(self.output_processor.child_ids(rid) or [rid])
            if self.kv_connector is not None:
                self.kv_connector.abort(self.output_processor.child_ids(rid) or [rid])
            out = self.output_processor.abort(rid)
            if out is not None:
                outs.append(out)
        return outs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.kv_connector and self.kv_connector.has_pending())

    # -------------------------------------------------------------------- step
    def step(self) -> list[Union[RequestOutput, PoolingRequestOutput]]:
        """Run one engine iteration and return the outputs of requests that progressed."""
        t0 = time.time()
        if self.kv_connector is not None:
            start_step(self.kv_connector, self.scheduler)
        sched = self.scheduler.schedule()
        if self.kv_connector is not None:  # KV loads and saves, before the forward pass
            self.kv_connector.apply(self.kv_connector.build_connector_meta())
        self.last_num_scheduled_tokens = sched.total_num_scheduled_tokens
        batch = StepTrace.batch(self.scheduler) if self._trace is not None else None
        # raises when the forward pass fails or a worker died: no request is to blame
        result = self.executor.execute_model(sched)
        core_outputs = self.scheduler.update_from_output(sched, result)
        outputs, stopped, failed = self.output_processor.process(core_outputs)
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if result.failed or failed:
            outputs += self._fail_requests({**result.failed, **failed})
        if batch:
            self._trace.write(self.step_count, self.scheduler, sched, batch, core_outputs, t0)
        self.step_count += 1
        return outputs

    def _fail_requests(self, errors: dict[str, Exception]) -> list[RequestOutput]:
        """Finish the requests (all samples) whose own processing raised; free their blocks."""
        by_parent: dict[str, Exception] = {}
        for child_id, exc in errors.items():
            parent_id = self.output_processor.child_to_parent.get(child_id, (child_id, 0))[0]
            by_parent.setdefault(parent_id, exc)
        outs = []
        for parent_id, exc in by_parent.items():
            bad_input = isinstance(exc, InvalidRequestError)
            if bad_input:
                logger.warning("request %s failed: %s", parent_id, exc)
            else:
                logger.error("request %s failed; the engine goes on without it", parent_id, exc_info=exc)
            self.scheduler.finish_requests(self.output_processor.child_ids(parent_id) or [parent_id],
                                           RequestStatus.FINISHED_ERROR)
            message = str(exc) if bad_input else f"{type(exc).__name__} while processing the request"
            out = self.output_processor.fail(parent_id, message, bad_input)
            if out is not None:
                outs.append(out)
        return outs

    def shutdown(self) -> None:
        """Stop the executor's workers and close the trace (idempotent; the in-process runner
        needs nothing)."""
        self.executor.shutdown()
        if self._trace is not None:
            self._trace.close()

    def stats(self) -> dict[str, float]:
        kv = self.scheduler.kv
        return {"num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting),
                "num_swapped": len(self.scheduler.swapped),
                "kv_cache_usage": kv.usage, "num_preemptions": self.scheduler.num_preemptions,
                "prefix_cache_queries": kv.prefix_cache_queries, "prefix_cache_hits": kv.prefix_cache_hits,
                "spec_decode_num_drafts": self.scheduler.num_spec_drafts,
                "spec_decode_num_draft_tokens": self.scheduler.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.scheduler.num_accepted_tokens,
                **(self.kv_connector.stats() if self.kv_connector is not None else {})}
