"""Request checks beyond field types: unsupported features, template arguments,
and the limits that depend on the server (``--max-n``, the vocabulary).

Every failure raises InvalidRequestError (a 400 naming the field and the limit).
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Optional

from pydantic import AfterValidator

from inflight.entrypoints.openai.limits import MAX_PROMPTS_PER_REQUEST
from inflight.errors import InvalidRequestError
from inflight.inputs import require_unicode
from inflight.sampling_params import MAX_STOP_STRING_CHARS, truncate_prompt


def _no_lone_surrogates(value: str) -> str:
    return require_unicode(value, "text")


SafeStr = Annotated[str, AfterValidator(_no_lone_surrogates)]

ROLES = ("system", "developer", "user", "assistant", "tool")
ROLES_NEEDING_CONTENT = ("system", "developer", "user", "tool")

# Template variables a client may set; anything else (above all `chat_template`)
# is the operator's, through --chat-template.
TEMPLATE_KWARGS = frozenset({"enable_thinking", "thinking", "reasoning_effort"})

# Fields that change the output which this server does not implement: accepting
# them silently would answer something other than what was asked.
_UNSUPPORTED = ("tools", "functions", "function_call", "tool_choice",
                "suffix", "best_of", "chat_template", "documents",
                "use_beam_search", "length_penalty", "logits_processors", "vllm_xargs",
                "spaces_between_special_tokens",
                "add_special_tokens", "mm_processor_kwargs", "prompt_embeds")
# The value of each that asks for nothing beyond what the server does anyway (vLLM's defaults;
# a chat prompt gets no added special tokens: the template writes them).
_DEFAULTS = {"use_beam_search": False, "length_penalty": 1.0, "spaces_between_special_tokens": True,
             "add_special_tokens": False}

# vLLM's structured-output fields before 0.12, which removed them (it now ignores them,
# so the output silently goes unconstrained): a 400 naming what replaces each.
_REMOVED = {"guided_json": "structured_outputs.json (or response_format json_schema)",
            "guided_regex": "structured_outputs.regex", "guided_choice": "structured_outputs.choice",
            "guided_grammar": "structured_outputs.grammar",
            "guided_decoding_backend": "nothing: the server chooses the grammar backend (xgrammar)"}


def _harmless(name: str, value: Any, req: Any) -> bool:
    """True for the values of an unsupported field that ask for nothing."""
    if value is None or value == [] or value == {} or value == "":
        return True
    if name == "tool_choice":
        return value == "none"
    if name == "best_of":
        return value == getattr(req, "n", 1)
    default = _DEFAULTS.get(name)
    return default is not None and isinstance(value, bool) == isinstance(default, bool) and value == default


def check_unsupported(req: Any) -> None:
    """400 "not supported" for a field this server would otherwise ignore."""
    fields = dict(req.model_extra or {})
    declared = type(req).model_fields  # a field the request model declares is implemented
    for name, replacement in _REMOVED.items():
        if fields.get(name) not in (None, "", [], {}):
            raise InvalidRequestError(f"{name}: removed in vLLM 0.12 and not supported here; use {replacement}")
    for name in _UNSUPPORTED:
        if name in declared:
            continue
        value = fields.get(name, getattr(req, name, None))
        if not _harmless(name, value, req):
            if name == "chat_template":
                raise InvalidRequestError("chat_template: a per-request template is not allowed; "
                                          "the operator sets it with --chat-template")
            raise InvalidRequestError(f"{name}: not supported by this server")


_TOKEN_ID_KEY = re.compile(r"-?[0-9]+")


def logit_bias_of(raw: Optional[dict[str, float]]) -> Optional[dict[int, float]]:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys) with integer keys;
    the ranges are SamplingParams' to check."""
    if not raw:
        return None
    for key in raw:  # ASCII digits only: int() would also take "²"-like digits, "+5" and "5_0"
        if not _TOKEN_ID_KEY.fullmatch(key):
            raise InvalidRequestError(f"logit_bias keys must be token ids (decimal digits), got {key[:50]!r}")
    return {int(key): value for key, value in raw.items()}


def check_template_kwargs(kwargs: Optional[dict[str, Any]]) -> None:
    """chat_template_kwargs may only set allow-listed variables, to short scalar values."""
    for key, value in (kwargs or {}).items():
        if key not in TEMPLATE_KWARGS:
            allowed = ", ".join(sorted(TEMPLATE_KWARGS))
            raise InvalidRequestError(f"chat_template_kwargs: only {allowed} may be set "
                                      f"(the template itself is the operator's: --chat-template)")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise InvalidRequestError(f"chat_template_kwargs.{key}: must be a boolean, number or string")
        if isinstance(value, str) and len(value) > MAX_STOP_STRING_CHARS:
            raise InvalidRequestError(f"chat_template_kwargs.{key}: at most {MAX_STOP_STRING_CHARS} characters")


def check_continuation(add_generation_prompt: bool, continue_final_message: bool) -> None:
    """A generation prompt opens a new turn; continuing the final message keeps the last one open."""
    if add_generation_prompt and continue_final_message:
        raise InvalidRequestError("continue_final_message: cannot be true while add_generation_prompt is true "
                                  "(set add_generation_prompt to false to continue the final message)")


def check_message(role: str, content: Any) -> None:
    """System, developer, user and tool turns need content."""
    if role in ROLES_NEEDING_CONTENT and content is None:
        raise InvalidRequestError(f"a {role} message needs content")


def check_prompt_count(count: int) -> None:
    """At most MAX_PROMPTS_PER_REQUEST prompts in one completion request."""
    if count > MAX_PROMPTS_PER_REQUEST:
        raise InvalidRequestError(f"prompt: at most {MAX_PROMPTS_PER_REQUEST} prompts per request, got {count}")


def check_server_limits(req: Any, params: Any, max_n: int, vocab_size: Optional[int], max_logprobs: int = 20) -> None:
    """The checks that need the server's settings: ``n`` against --max-n, logprobs against
    --max-logprobs, stop token ids against the vocabulary."""
    if req.n > max_n:
        raise InvalidRequestError(f"n: at most {max_n} (--max-n), got {req.n}")
    for name, value in (("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)):
        if value is not None and max_logprobs != -1 and value > max_logprobs:
            field = "top_logprobs" if name == "logprobs" and hasattr(req, "top_logprobs") else name
            raise InvalidRequestError(f"{field}: at most {max_logprobs} (--max-logprobs), got {value}")
    if vocab_size is not None:
        params.verify_vocab(vocab_size)


# Request fields a beam search does not apply, with the value that asks for nothing:
# a search ranks beams by the model's raw logprobs, so sampling filters, penalties and
# stop conditions other than EOS would be silently ignored.
_IGNORED = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "repetition_penalty": 1.0, "min_tokens": 0, "stop": None, "stop_token_ids": None, "logit_bias": None,
            "allowed_token_ids": None, "bad_words": None, "prompt_logprobs": None, "kv_transfer_params": None}


def check_beam_search(req: Any, params: Any, max_logprobs: int) -> None:
    """InvalidRequestError naming the field a beam search cannot honour."""
    if req.stream:
        raise InvalidRequestError("stream: streaming is not supported with use_beam_search")
    for name, neutral in _IGNORED.items():
        value = getattr(req, name, None)
        if value not in (None, [], {}, neutral) and not (name == "top_k" and value == -1):
            raise InvalidRequestError(f"{name}: not supported with use_beam_search")
    if params.structured_outputs is not None:
        raise InvalidRequestError(f"{req.structured_outputs_field()}: structured output is not supported "
                                  "with use_beam_search")
    if getattr(req, "echo", False) and params.logprobs is not None:
        raise InvalidRequestError("echo: echo with logprobs is not supported with use_beam_search")
    if max_logprobs != -1 and 2 * params.n > max_logprobs:
        raise InvalidRequestError(f"n: a beam search of width {params.n} reads the top {2 * params.n} logprobs "
                                  f"of every token, more than --max-logprobs ({max_logprobs}) allows")


def check_truncation(keep: Optional[int], max_model_len: int) -> None:
    """vLLM's ``truncate_prompt_tokens``: -1 (max_model_len) or 1 to max_model_len tokens."""
    if keep is not None and not (keep == -1 or 1 <= keep <= max_model_len):
        raise InvalidRequestError(f"truncate_prompt_tokens must be -1 or in [1, {max_model_len}] "
                                  f"(max_model_len), got {keep}")


def truncated(prompt: dict[str, Any], keep: Optional[int], max_model_len: int,
              side: str = "left") -> dict[str, Any]:
    """The engine prompt cut to ``keep`` tokens on ``side`` (sampling_params.truncate_prompt);
    a cut prompt loses its text (echo decodes the kept ids)."""
    cut = truncate_prompt(prompt["prompt_token_ids"], keep, max_model_len, side)
    return prompt if cut is None else {**prompt, "prompt": None, "prompt_token_ids": cut}


def check_token_prompt(ids: list[int], max_model_len: int, vocab_size: Optional[int]) -> None:
    """A token-id prompt must fit max_model_len and the vocabulary (checked here,
    not on the step thread, so a huge list costs the engine nothing)."""
    if len(ids) >= max_model_len:
        raise InvalidRequestError(f"prompt: {len(ids)} tokens do not fit max_model_len ({max_model_len})")
    if vocab_size is not None and any(not 0 <= t < vocab_size for t in ids):
        raise InvalidRequestError(f"prompt: token ids must be in [0, {vocab_size})")
