"""Per-request sampling settings, named as in vLLM."""
from __future__ import annotations

import ctypes
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from inflight.errors import InvalidRequestError
from inflight.structured_output.params import StructuredOutputsParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The sampler works in float32: a temperature, top_p or repetition penalty that rounds
# to 0 or overflows there would turn every logit of the row into inf or NaN.
FLOAT32_MAX = 3.4028234663852886e38
# As vLLM: below this a temperature is greedy; up to MIN_TEMPERATURE it is raised to that
# (dividing logits by less overflows float32).
GREEDY_TEMPERATURE = 1e-5
MIN_TEMPERATURE = 1e-2
# Stop strings are scanned on every generated token and stop ids checked per token,
# all on the step thread: their number bounds every request's per-token cost.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
# OpenAI's bounds for logit_bias: each entry is a scatter in the sampler, on the step thread.
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0
# allowed_token_ids become a row of the sampler's mask every step, on the step thread
MAX_ALLOWED_TOKEN_IDS = 4096
logger = logging.getLogger(__name__)
_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


@dataclass
class SamplingParams:
    """How to sample one request's output tokens and when to stop.

    Field names and defaults follow vLLM's ``SamplingParams`` so code written
    for vLLM runs unchanged. ``temperature == 0`` means greedy.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: Optional[StructuredOutputsParams] = None  # JSON schema, regex, choice or grammar
    logit_bias: Optional[dict[int, float]] = None  # token id -> added to its logit before sampling
    allowed_token_ids: Optional[list[int]] = None  # only these may be sampled (deduplicated, sorted)
    truncate_prompt_tokens: Optional[int] = None  # keep the prompt's last N tokens (-1: max_model_len)
    bad_words: Optional[list[str]] = None  # never generated (each word with and without a leading space)
    # set by the engine from bad_words with its tokenizer (vLLM's _bad_words_token_ids)
    bad_words_token_ids: Optional[list[list[int]]] = field(default=None, repr=False)
    # vLLM's extra_args: settings for engine plug-ins, e.g. {"kv_transfer_params": ...} for disaggregation
    extra_args: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k < 0:
            self.top_k = 0
        self._validate()
        if GREEDY_TEMPERATURE <= self.temperature < MIN_TEMPERATURE:
            logger.warning("temperature %s is below %s, which overflows float32 logits: raised to %s",
                           self.temperature, MIN_TEMPERATURE, MIN_TEMPERATURE)
            self.temperature = MIN_TEMPERATURE

    def _validate(self) -> None:
        self._validate_types()
        self._validate_ranges()
        self._validate_stops()
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise InvalidRequestError("structured_outputs must be a StructuredOutputsParams")
        self._validate_logit_bias()
        self._validate_allowed_token_ids()

    def _validate_types(self) -> None:
        # NaN compares false against every bound, so finiteness is checked before the ranges.
        for name in _FLOATS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidRequestError(f"{name} must be a finite number, got {_short(value)}")
        for name in ("n", "top_k", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "seed"):
            value = getattr(self, name)
            if value is None and name in ("max_tokens", "logprobs", "prompt_logprobs", "seed"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not INT64_MIN <= value <= INT64_MAX:
                raise InvalidRequestError(f"{name} must be an integer within int64, got {_short(value)}")
        if self.seed is not None and self.seed + self.n - 1 > INT64_MAX:
            # Sample i is seeded with seed + i: the last one must still be an int64.
            raise InvalidRequestError(f"seed + n - 1 must be at most {INT64_MAX} (int64), "
                                      f"got seed={self.seed}, n={self.n}")

    def _validate_stops(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_STRING_CHARS:
                raise InvalidRequestError(f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters long")
        words = self.bad_words
        if words is not None and (not isinstance(words, list) or len(words) > MAX_STOP_STRINGS or not all(
                isinstance(w, str) and 1 <= len(w.strip()) and len(w) <= MAX_STOP_STRING_CHARS for w in words)):
            raise InvalidRequestError(f"bad_words must be a list of at most {MAX_STOP_STRINGS} words of 1 to "
                                      f"{MAX_STOP_STRING_CHARS} characters")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, "
                             f"got {len(self.stop_token_ids)}")
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT64_MAX:
                raise InvalidRequestError(f"stop_token_ids must be non-negative integers, got {_short(t)}")

    def verify_vocab(self, vocab_size: int) -> None:
        """Raise InvalidRequestError unless every stop token id, logit_bias key and allowed token id
        is inside the vocabulary (the engine would otherwise never see them, silently)."""
        for t in self.stop_token_ids:
            if not t < vocab_size:
                raise InvalidRequestError(f"stop_token_ids must be in [0, {vocab_size}), got {t}")
        for t in self.logit_bias or ():
            if not t < vocab_size:
                raise InvalidRequestError(f"logit_bias token ids must be in [0, {vocab_size}), got {t}")
        if self.allowed_token_ids and not self.allowed_token_ids[-1] < vocab_size:
            raise InvalidRequestError(f"allowed_token_ids must be in [0, {vocab_size}), "
                                      f"got {self.allowed_token_ids[-1]}")

    def _validate_ranges(self) -> None:
        if self.n < 1:
            raise InvalidRequestError(f"n must be at least 1, got {self.n}")
        if not 0.0 <= self.temperature <= FLOAT32_MAX:
            raise InvalidRequestError(f"temperature must be in [0, {FLOAT32_MAX:.7g}] (float32), "
                                      f"got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0 or _float32(self.top_p) == 0.0:
            raise InvalidRequestError(f"top_p must be in (0, 1] and above 0 as a float32, got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be 0 (disabled) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise InvalidRequestError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise InvalidRequestError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not 0.0 < _float32(self.repetition_penalty) <= FLOAT32_MAX:
            raise InvalidRequestError(f"repetition_penalty must be positive and finite as a float32, "
                                      f"got {self.repetition_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise InvalidRequestError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequestError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        keep = self.truncate_prompt_tokens
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or not (keep == -1 or keep >= 1)):
            raise InvalidRequestError(f"truncate_prompt_tokens must be -1 or positive, got {_short(keep)}")
        for name in ("logprobs", "prompt_logprobs"):  # the upper bound is the engine's max_logprobs
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidRequestError(f"{name} must be non-negative, got {value}")

    def verify_max_logprobs(self, max_logprobs: int) -> None:
        """Raise InvalidRequestError past the engine's ``max_logprobs`` (-1: no cap), as vLLM does."""
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and max_logprobs != -1 and value > max_logprobs:
                raise InvalidRequestError(f"{name} must be at most {max_logprobs} (max_logprobs), got {value}")

    def _validate_logit_bias(self) -> None:
        if not self.logit_bias:
            self.logit_bias = None
            return
        if not isinstance(self.logit_bias, dict):
            raise InvalidRequestError(f"logit_bias must map token ids to numbers, got {_short(self.logit_bias)}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidRequestError(f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries, "
                                      f"got {len(self.logit_bias)}")
        for t, v in self.logit_bias.items():
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT64_MAX:
                raise InvalidRequestError(f"logit_bias keys must be non-negative token ids, got {_short(t)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS:
                raise InvalidRequestError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, "
                                          f"{MAX_LOGIT_BIAS:g}], got {_short(v)} for token {t}")

    def _validate_allowed_token_ids(self) -> None:
        ids = self.allowed_token_ids
        if ids is None:
            return
        if not isinstance(ids, (list, tuple)) or not ids:
            raise InvalidRequestError("allowed_token_ids must be a non-empty list of token ids")
        if len(ids) > MAX_ALLOWED_TOKEN_IDS:
            raise InvalidRequestError(f"allowed_token_ids may hold at most {MAX_ALLOWED_TOKEN_IDS} ids, got {len(ids)}")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT64_MAX:
                raise InvalidRequestError(f"allowed_token_ids must be non-negative token ids, got {_short(t)}")
        self.allowed_token_ids = sorted(set(ids))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


@dataclass
class BeamSearchParams:
    """Beam search settings (vLLM's ``BeamSearchParams``, for ``LLM.beam_search``).

    ``beam_width`` sequences are kept; each round extends every one by the top
    ``2 * beam_width`` tokens of its raw distribution. A finished sequence scores
    ``cum_logprob / len ** length_penalty`` (len counts the prompt, not the EOS);
    ``temperature`` is accepted for vLLM's sake and changes nothing (the raw
    logprobs rank the beams).
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT64_MAX:
                raise InvalidRequestError(f"{name} must be a positive integer, got {_short(value)}")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidRequestError(f"{name} must be a finite number, got {_short(value)}")
        if self.temperature < 0.0:
            raise InvalidRequestError(f"temperature must be non-negative, got {self.temperature}")


def _float32(value: float) -> float:
    """``value`` rounded to float32 (0 where it underflows, inf where it overflows)."""
    return ctypes.c_float(value).value


def _short(value: Any, limit: int = 50) -> str:
    """A value for an error message, never longer than ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def truncate_prompt(ids: list[int], keep: Optional[int], max_model_len: int,
                    side: str = "left") -> Optional[list[int]]:
    """``truncate_prompt_tokens`` applied on ``side`` as vLLM cuts: "left" keeps the prompt's
    last ``keep`` tokens (-1: ``max_model_len``), "right" its first; None where it is no longer
    than that (kept whole). InvalidRequestError for ``keep`` past ``max_model_len``."""
    if keep is None:
        return None
    if keep > max_model_len:
        raise InvalidRequestError(f"truncate_prompt_tokens must be at most max_model_len ({max_model_len}), "
                                  f"got {keep}")
    keep = max_model_len if keep == -1 else keep
    if len(ids) <= keep:
        return None
    return ids[:keep] if side == "right" else ids[-keep:]


def bad_words_token_ids(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """The token sequences of ``words`` the sampler bans, as vLLM finds them: each word
    as written, and with a leading space where that tokenizes to a different first
    token in as many tokens (a word starting the text, and one inside it)."""
    out: list[list[int]] = []
    for word in words:
        bare = tokenizer(word.lstrip(), add_special_tokens=False).input_ids
        spaced = tokenizer(" " + word.lstrip(), add_special_tokens=False).input_ids
        out.append(bare)
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return out
