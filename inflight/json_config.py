"""The one way a dataclass setting is given as a dict or JSON text (vLLM's
``--speculative-config``, ``--kv-transfer-config``); no torch here."""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Optional, TypeVar

T = TypeVar("T")


def parse_json_config(cls: type[T], value: Any, name: str) -> Optional[T]:
    """None, an instance of ``cls``, a dict, or its JSON text (the CLI's form) as ``cls``;
    a ValueError naming ``name`` for text that is not a JSON object or for unknown keys."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {value!r}")
    unknown = set(value) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {name} keys: {sorted(unknown)}")
    return cls(**value)
