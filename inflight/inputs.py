"""What the engine takes from a caller besides the sampling settings: a prompt's token ids,
a request's priority and text that must encode, checked as the server's schema checks them
(the offline API has no schema in front of it; the server's renderer checks its text too)."""
from __future__ import annotations

import operator
from typing import Any, Union

from inflight.errors import InvalidRequestError
from inflight.sampling_params import INT64_MAX, INT64_MIN

PromptType = Union[str, list[int], dict[str, Any]]


def require_unicode(text: str, what: str) -> str:
    """``text``, or InvalidRequestError naming ``what`` where it holds a lone UTF-16 surrogate
    (JSON may spell "\\ud800"): such text cannot be encoded, tokenized or echoed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{what} must be valid Unicode (it contains a lone surrogate)") from None
    return text


def token_ids(values: Any) -> list[int]:
    """``values`` as a list of ints (numpy's integers too); ValueError for anything else,
    e.g. floats, which would pass the vocabulary check and fail later in the detokenizer."""
    if isinstance(values, (str, bytes)):
        raise ValueError("prompt_token_ids must be a list of integers, not a string")
    try:
        return [operator.index(t) for t in values]
    except TypeError:
        raise ValueError("prompt_token_ids must be a list of integers") from None


def as_priority(value: Any) -> int:
    """A request's priority as an int64; ValueError otherwise (under the priority policy the
    scheduler compares priorities: a str or None there would fail the whole step)."""
    try:
        priority = operator.index(value)
    except TypeError:
        raise ValueError(f"priority must be an integer, got {str(value)[:50]!r}") from None
    if not INT64_MIN <= priority <= INT64_MAX:
        raise ValueError(f"priority must be within int64, got {priority}")
    return priority
