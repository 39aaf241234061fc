"""What a request constrains its output to (vLLM's ``StructuredOutputsParams``); no torch."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Union

from inflight.errors import InvalidRequestError

# A grammar is compiled before the request is admitted, and its compile time grows
# with its size: these bound what one request can make the server compile.
MAX_GRAMMAR_CHARS = 65536
MAX_CHOICES = 1024
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """Exactly one of: ``json`` (a JSON schema, as a dict or JSON text), ``regex``,
    ``choice`` (the output is one of these strings), ``grammar`` (EBNF/GBNF with
    ``::=`` rules, else Lark), ``json_object`` (any JSON object) or ``structural_tag``
    (JSON text: free text where tagged parts follow their schemas; xgrammar's format, or
    the older ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}``)."""

    json: Optional[Union[str, dict[str, Any]]] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[str] = None
    # Set by a server with --reasoning-parser (a reasoning model's thinking is free): the
    # end-of-thinking token id after which the constraint starts (None: from the first token),
    # and the start-of-thinking id when the model thinks only if it opens with that token.
    after_reasoning: Optional[int] = None
    optional_reasoning_start: Optional[int] = None

    def __post_init__(self) -> None:
        if self.json_object is False:
            self.json_object = None
        given = [k for k in _KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise InvalidRequestError("structured_outputs must set exactly one of json, regex, choice, grammar, "
                                      f"json_object; got {', '.join(given) or 'none'}")
        for name in ("after_reasoning", "optional_reasoning_start"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidRequestError(f"structured_outputs.{name}: must be a token id")
        self._validate()

    @property
    def kind(self) -> str:
        """Which constraint is set: one of json, regex, choice, grammar, json_object."""
        return next(k for k in _KINDS if getattr(self, k) is not None)

    def _validate(self) -> None:
        kind = self.kind
        if kind == "json":
            if isinstance(self.json, str):
                try:
                    parsed = json.loads(self.json)
                except ValueError as e:
                    raise InvalidRequestError(f"structured_outputs.json: not valid JSON ({e})") from None
                if not isinstance(parsed, (dict, bool)):
                    raise InvalidRequestError("structured_outputs.json: a JSON schema must be an object")
            elif not isinstance(self.json, dict):
                raise InvalidRequestError("structured_outputs.json: a JSON schema must be an object or JSON text")
        elif kind == "structural_tag":
            try:
                tag = json.loads(self.structural_tag) if isinstance(self.structural_tag, str) else None
            except ValueError as e:
                raise InvalidRequestError(f"structured_outputs.structural_tag: not valid JSON ({e})") from None
            if not isinstance(tag, dict):
                raise InvalidRequestError("structured_outputs.structural_tag: must be a JSON object as text")
        elif kind in ("regex", "grammar"):
            if not isinstance(getattr(self, kind), str) or not getattr(self, kind):
                raise InvalidRequestError(f"structured_outputs.{kind}: must be a non-empty string")
        elif kind == "choice":
            if (not isinstance(self.choice, list) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise InvalidRequestError("structured_outputs.choice: must be a non-empty list of non-empty strings")
            if len(self.choice) > MAX_CHOICES:
                raise InvalidRequestError(f"structured_outputs.choice: at most {MAX_CHOICES} choices, "
                                          f"got {len(self.choice)}")
        elif self.json_object is not True:
            raise InvalidRequestError("structured_outputs.json_object: must be true")
        try:
            size = len(self.cache_key()[1])
        except (TypeError, ValueError) as e:  # a dict schema holding values JSON cannot spell
            raise InvalidRequestError(f"structured_outputs.{kind}: not JSON-serializable ({e})") from None
        if size > MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(f"structured_outputs.{kind}: at most {MAX_GRAMMAR_CHARS} characters, "
                                      f"got {size}")

    def cache_key(self) -> tuple[str, str]:
        """(kind, text) identifying the compiled grammar. Key order is kept: a
        schema's property order is the order the output follows."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json" and not isinstance(value, str):
            return kind, json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        if kind == "choice":
            return kind, json.dumps(value, ensure_ascii=False)
        return kind, "" if kind == "json_object" else value
