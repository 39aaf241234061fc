"""Offline inference: ``LLM(...).generate(prompts, params)``."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Optional, Sequence, Union

from tqdm.auto import tqdm

from inflight.beam_search import BeamSearch, BeamSearchOutput
from inflight.engine.llm_engine import LLMEngine
from inflight.inputs import PromptType, require_unicode
from inflight.lora.request import LoRARequest
from inflight.outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, PoolingRequestOutput,
                              RequestOutput, ScoringOutput, ScoringRequestOutput)
from inflight.pooling.pooler import cosine_scores
from inflight.pooling.token_types import pair_ids
from inflight.pooling.truncation import cut_length
from inflight.pooling_params import PoolingParams
from inflight.sampling_params import BeamSearchParams, SamplingParams


# apply_chat_template's own parameters: set by LLM.chat's arguments, never through chat_template_kwargs
_TEMPLATE_ARGS = frozenset({"conversation", "tokenize", "add_generation_prompt", "continue_final_message",
                            "chat_template", "tools", "return_dict", "return_tensors"})


class LLM:
    """Runs batches of prompts through the continuous-batching engine.

    ``LLM()`` loads the embedded SmolLM2-135M-Instruct; every vLLM engine
    argument (``max_num_seqs``, ``block_size``, ...) is accepted by keyword.
    """

    def __init__(self, model: Optional[str] = None, **kwargs: Any) -> None:
        if kwargs.get("data_parallel_size", 1) > 1:
            raise ValueError("data_parallel_size > 1 is served by `inflight serve --data-parallel-size N`; "
                             "the offline LLM runs one engine")
        self.llm_engine = LLMEngine.from_kwargs(model=model, **kwargs)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` uses without sampling params: the model's generation config
        recommendations (``generation_config="auto"``), else SamplingParams()."""
        return SamplingParams(**getattr(self.llm_engine, "default_sampling_params", {}))

    def generate(self, prompts: Union[PromptType, Sequence[PromptType], None] = None,
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 *, prompt_token_ids: Optional[Sequence[Sequence[int]]] = None, use_tqdm: bool = True,
                 priority: Optional[Sequence[int]] = None,
                 lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in input order. ``lora_request``:
        one adapter for every prompt, or one (or None) per prompt (needs ``enable_lora``)."""
        if getattr(self.llm_engine, "pooler_config", None) is not None:
            raise ValueError("LLM.generate needs a generative model; this one runs with runner='pooling': "
                             "use LLM.embed")
        items = self._normalise(prompts, prompt_token_ids)
        params = self._params_for(sampling_params, len(items))
        loras = self._per_prompt(lora_request, len(items), LoRARequest)
        engine = self.llm_engine
        vocab = getattr(getattr(engine, "arch", None), "vocab_size", None)
        if vocab:
            for p in params:
                p.verify_vocab(vocab)  # the sampler would silently drop out-of-vocabulary stop ids
        return self._add_and_run(items, params, loras, priority, use_tqdm)

    def _add_and_run(self, items: list, params: list, loras: list, priority: Optional[Sequence[int]],
                     use_tqdm: bool) -> list:
        engine = self.llm_engine
        ids = []
        if priority is not None and len(priority) != len(items):
            raise ValueError(f"priority has {len(priority)} values for {len(items)} prompts")
        try:
            for i, (prompt, p) in enumerate(zip(items, params)):
                pr = priority[i] if priority is not None else 0
                ids.append(engine.add_request(None, prompt, p, priority=pr,
                                              **({"lora_request": loras[i]} if loras[i] is not None else {})))
        except Exception:
            engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams,
                    lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
                    use_tqdm: bool = False, concurrency_limit: Optional[int] = None) -> list[BeamSearchOutput]:
        """Beam search for each prompt (vLLM's ``LLM.beam_search``): its ``beam_width`` best
        sequences, best first. As in vLLM, a sequence's ``tokens`` and ``text`` include the
        prompt. Every round runs the live beams of up to ``concurrency_limit`` prompts
        (None: all) as engine requests in the same steps."""
        if getattr(self.llm_engine, "pooler_config", None) is not None:
            raise ValueError("LLM.beam_search needs a generative model; this one runs with runner='pooling'")
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"beam_search takes BeamSearchParams, got {type(params).__name__}")
        if concurrency_limit is not None and (isinstance(concurrency_limit, bool) or not isinstance(
                concurrency_limit, int) or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be a positive integer or None, got {concurrency_limit!r}")
        items = self._normalise(prompts, None)
        loras = self._per_prompt(lora_request, len(items), LoRARequest)
        engine, tok = self.llm_engine, self.llm_engine.tokenizer
        max_logprobs = engine.config.model_config.max_logprobs
        if max_logprobs != -1 and 2 * params.beam_width > max_logprobs:
            raise ValueError(f"beam_width {params.beam_width} reads the top {2 * params.beam_width} logprobs a "
                             f"token, more than max_logprobs ({max_logprobs})")
        ids = [engine.tokenize_prompt(p)[1] for p in items]
        for prompt in ids:
            if len(prompt) + params.max_tokens > engine.max_model_len:
                raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                                 f"max_model_len ({engine.max_model_len})")
        searches = [BeamSearch(p, params, engine.eos_token_ids) for p in ids]
        limit = concurrency_limit or max(len(searches), 1)
        for start in range(0, len(searches), limit):
            self._beam_rounds(searches[start:start + limit], loras[start:start + limit], use_tqdm)
        outputs = []
        for search in searches:
            best = search.best()
            for seq in best:
                seq.text = tok.decode(seq.tokens, skip_special_tokens=params.skip_special_tokens)
            outputs.append(BeamSearchOutput(best))
        return outputs

    def _beam_rounds(self, searches: list[BeamSearch], loras: list, use_tqdm: bool) -> None:
        bar = tqdm(desc="Beam search", unit="round", disable=not use_tqdm, dynamic_ncols=True)
        try:
            while live := [s for s in searches if not s.done]:
                items = [p for s in live for p in s.step_prompts()]
                params = [s.step_params() for s in live for _ in s.beams]
                owners = [lora for s, lora in zip(searches, loras) if not s.done for _ in s.beams]
                outs = self._add_and_run(items, params, owners, None, False)
                at = 0
                for s in live:
                    n = len(s.beams)
                    s.advance(outs[at:at + n])
                    at += n
                bar.update(1)
        finally:
            bar.close()

    def chat(self, messages: Union[list[dict], list[list[dict]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             *, use_tqdm: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template: Optional[str] = None,
             tools: Optional[list[dict]] = None,
             chat_template_kwargs: Optional[dict[str, Any]] = None,
             lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate.
        ``continue_final_message`` (with ``add_generation_prompt=False``) leaves the last
        message open, so the model continues it; ``tools`` and ``chat_template_kwargs`` go
        to the template, as in vLLM's ``LLM.chat``."""
        if add_generation_prompt and continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt=False")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        reserved = _TEMPLATE_ARGS & set(chat_template_kwargs or {})
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(reserved))}: LLM.chat's own "
                             "arguments do")
        tok = self.llm_engine.tokenizer
        texts = [tok.apply_chat_template(
            c, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, chat_template=chat_template, tools=tools,
            **(chat_template_kwargs or {})) for c in convs]
        for text in texts:
            require_unicode(text, "messages: the rendered conversation")
        prompts = [{"prompt_token_ids": tok(t, add_special_tokens=False).input_ids} for t in texts]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def encode(self, prompts: Union[PromptType, Sequence[PromptType]],
               pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None, *,
               use_tqdm: bool = True, lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
               pooling_task: Optional[str] = None, truncate_prompt_tokens: Optional[int] = None
               ) -> list[PoolingRequestOutput]:
        """Pool every prompt with a pooling model (``runner="pooling"``); outputs come back in
        input order, each ``outputs.data`` a float32 tensor. ``pooling_task``: embed or
        classify (None: the model's)."""
        if getattr(self.llm_engine, "pooler_config", None) is None:
            raise ValueError("LLM.encode and LLM.embed need a pooling model: LLM(model, runner='pooling')")
        items = self._normalise(prompts, None)
        params = self._per_prompt(pooling_params or PoolingParams(), len(items), PoolingParams)
        params = [replace(p, task=p.task or pooling_task) for p in params]
        if truncate_prompt_tokens is not None:
            params = [replace(p, truncate_prompt_tokens=truncate_prompt_tokens) for p in params]
        return self._add_and_run(items, params, self._per_prompt(lora_request, len(items), LoRARequest), None,
                                 use_tqdm)

    def embed(self, prompts: Union[PromptType, Sequence[PromptType]], *, use_tqdm: bool = True,
              pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
              lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
              truncate_prompt_tokens: Optional[int] = None) -> list[EmbeddingRequestOutput]:
        """An embedding vector for each prompt (vLLM's ``LLM.embed``): ``outputs.embedding``."""
        outs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, lora_request=lora_request,
                           pooling_task="embed", truncate_prompt_tokens=truncate_prompt_tokens)
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def classify(self, prompts: Union[PromptType, Sequence[PromptType]], *, use_tqdm: bool = True,
                 pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
                 lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None
                 ) -> list[ClassificationRequestOutput]:
        """Each prompt's label probabilities with a sequence classifier (vLLM's ``LLM.classify``)."""
        outs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, lora_request=lora_request,
                           pooling_task="classify")
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def score(self, data_1: Union[str, Sequence[str]], data_2: Union[str, Sequence[str]], *, use_tqdm: bool = True,
              truncate_prompt_tokens: Optional[int] = None) -> list[ScoringRequestOutput]:
        """Each pair's score (vLLM's ``LLM.score``): 1:1, 1:N (one ``data_1`` against every
        ``data_2``) or N:N. With an embedding model, the cosine similarity of the two texts'
        embeddings; with a cross-encoder (a classifier of one label), its probability for
        the pair read as one prompt."""
        first, second = (_texts(d, name) for d, name in ((data_1, "data_1"), (data_2, "data_2")))
        if not first or not second or (len(first) > 1 and len(first) != len(second)):
            raise ValueError("Input lengths must be either 1:1, 1:N or N:N")
        pooler = getattr(self.llm_engine, "pooler_config", None)
        if pooler is not None and pooler.task == "classify":
            return self._cross_encode(first * len(second) if len(first) == 1 else first, second, use_tqdm,
                                      truncate_prompt_tokens)
        outs = self.encode(first + second, use_tqdm=use_tqdm, truncate_prompt_tokens=truncate_prompt_tokens)
        a, b = outs[:len(first)], outs[len(first):]
        scores = cosine_scores([o.outputs.data for o in a], [o.outputs.data for o in b])
        a = a * len(b) if len(a) == 1 else a
        return [ScoringRequestOutput(f"{x.request_id}_{y.request_id}", ScoringOutput(s),
                                     x.prompt_token_ids + y.prompt_token_ids) for x, y, s in zip(a, b, scores)]

    def _cross_encode(self, first: list[str], second: list[str], use_tqdm: bool,
                      truncate: Optional[int]) -> list[ScoringRequestOutput]:
        if len(self.llm_engine.pooler_config.labels or []) != 1:
            raise ValueError("LLM.score needs an embedding model or a classifier of one label (a cross-encoder)")
        tok = self.get_tokenizer()
        typed = self.llm_engine.pooler_config.token_types
        cut = cut_length(truncate, self.llm_engine.max_model_len)  # as a text is cut: pooling/truncation.py
        prompts = [{"prompt_token_ids": pair_ids(tok, a, b, typed, cut)} for a, b in zip(first, second)]
        outs = self.encode(prompts, PoolingParams(truncate_prompt_tokens=truncate), use_tqdm=use_tqdm)
        return [ScoringRequestOutput(o.request_id, ScoringOutput(o.outputs.data[0].item()), o.prompt_token_ids)
                for o in outs]

    @staticmethod
    def _normalise(prompts, prompt_token_ids) -> list[PromptType]:
        if prompt_token_ids is not None:
            return [{"prompt_token_ids": list(t)} for t in prompt_token_ids]
        if prompts is None:
            raise ValueError("give prompts or prompt_token_ids")
        if isinstance(prompts, (str, dict)):
            return [prompts]
        prompts = list(prompts)
        if prompts and isinstance(prompts[0], int):
            return [prompts]  # one token-id list
        return prompts

    def _params_for(self, sp, n: int) -> list[SamplingParams]:
        if sp is None:
            return [self.get_default_sampling_params()] * n
        params = self._per_prompt(sp, n, SamplingParams)
        if not all(isinstance(p, SamplingParams) for p in params):
            raise ValueError("sampling_params must be a SamplingParams or a list of one per prompt")
        return params

    @staticmethod
    def _per_prompt(value, n: int, one: type) -> list:
        """One ``one`` (or None) for every prompt, or a sequence of one per prompt (each a
        ``one`` or None)."""
        if value is None or isinstance(value, one):
            return [value] * n
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            raise ValueError(f"expected a {one.__name__} or a list of one per prompt, got {type(value).__name__}")
        value = list(value)
        if len(value) != n:
            raise ValueError(f"got {len(value)} {one.__name__}s for {n} prompts")
        if not all(v is None or isinstance(v, one) for v in value):
            raise ValueError(f"expected a {one.__name__} (or None) for each prompt")
        return value

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        start, n_in, n_out = time.time(), 0, 0
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if isinstance(out, RequestOutput):
                        n_out += sum(len(c.delta_token_ids) for c in out.outputs)
                    if out.finished:
                        done[out.request_id] = out
                        n_in += len(out.prompt_token_ids)
                        bar.update(1)
                        el = max(time.time() - start, 1e-9)
                        bar.set_postfix_str(f"est. speed input: {n_in / el:.1f} toks/s, output: {n_out / el:.1f} toks/s")
        finally:
            bar.close()
            pending = [i for i in ids if i not in done]
            if pending:
                engine.abort_request(pending)
        return [done[i] for i in ids]


def _texts(data: Any, name: str) -> list[str]:
    """One text or a list of texts, as LLM.score takes them; ValueError naming ``name`` otherwise."""
    texts = [data] if isinstance(data, str) else list(data) if isinstance(data, (list, tuple)) else None
    if texts is None or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{name} must be a text or a list of texts")
    return texts
