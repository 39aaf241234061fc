"""What the engine takes from a caller besides the sampling settings: a prompt's token ids
and a request's priority, checked as the server's schema checks them (the offline API
has no schema in front of it)."""
from __future__ import annotations

import operator
from typing import Any, Union

PromptType = Union[str, list[int], dict[str, Any]]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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
