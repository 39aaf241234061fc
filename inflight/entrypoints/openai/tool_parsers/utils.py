"""Helpers the tool-call parsers share."""
from __future__ import annotations

import json
from typing import Any, Optional


def call_arguments(value: Any) -> Optional[str]:
    """A call's arguments as the JSON text of an object, or None if they are not one.

    Models write arguments as an object or as a string holding one; clients get
    a JSON string either way, as OpenAI sends it."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def parse_call_objects(text: str) -> Optional[list[tuple[str, str]]]:
    """``(name, arguments JSON)`` for each call in ``text``: one JSON object
    ``{"name": ..., "arguments": {...}}`` or a non-empty list of them (``parameters``
    is accepted for ``arguments``, as some models write it). None if ``text`` is
    anything else: then it is no call, and stays content."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return calls_of(obj if isinstance(obj, list) else [obj])


def complete_array_items(text: str) -> list[Any]:
    """The whole items at the start of a JSON array that was cut short (``[{...}, {...}, {"na``)."""
    decoder, items = json.JSONDecoder(), []
    start = len(text) - len(text.lstrip())
    if not text.startswith("[", start):
        return []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            item, i = decoder.raw_decode(text, i)
        except ValueError:
            return items
        items.append(item)


def calls_of(items: list[Any]) -> Optional[list[tuple[str, str]]]:
    """``(name, arguments JSON)`` for each call object; None unless every item is one."""
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        args = call_arguments(item.get("arguments", item.get("parameters", {})))
        if args is None:
            return None
        calls.append((item["name"], args))
    return calls or None


def partial_prefix_len(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (a tag maybe still arriving)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def parse_separated_calls(text: str, separator: str) -> Optional[list[tuple[str, str]]]:
    """``(name, arguments JSON)`` for calls written as JSON objects (or lists of
    them) one after another, ``separator`` between them; None unless all of ``text`` is that."""
    decoder, items, i = json.JSONDecoder(), [], _skip_ws(text, 0)
    while True:
        try:
            item, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        items.extend(item if isinstance(item, list) else [item])
        i = _skip_ws(text, i)
        if i == len(text):
            return calls_of(items)
        if text[i] != separator:
            return None
        i = _skip_ws(text, i + 1)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
