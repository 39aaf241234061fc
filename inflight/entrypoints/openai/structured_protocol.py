"""Structured output in request bodies: OpenAI's ``response_format`` and vLLM's
``structured_outputs`` extension, mapped onto StructuredOutputsParams."""
from __future__ import annotations

import json
import re
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from inflight.errors import InvalidRequestError
from inflight.structured_output.params import StructuredOutputsParams


class _Model(BaseModel):
    # As OpenAIBaseModel: unknown fields kept, NaN and infinities refused; fields by name or alias.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)


class JsonSchemaFormat(_Model):
    """``response_format.json_schema``: the schema and its name (``strict`` is always honoured)."""

    name: str = Field(max_length=64)
    description: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Model):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON following a schema;
    vLLM's ``structural_tag`` (xgrammar's ``format``, or ``structures`` with ``triggers``)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: Optional[JsonSchemaFormat] = None
    structures: Optional[list[dict[str, Any]]] = None
    triggers: Optional[list[str]] = None
    format: Optional[dict[str, Any]] = None


class StructuredOutputsRequest(_Model):
    """vLLM's ``structured_outputs`` field: exactly one constraint."""

    json_: Optional[Union[str, dict[str, Any]]] = Field(default=None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    structural_tag: Optional[str] = None  # JSON text, as vLLM takes it


class StructuredOutputFields(_Model):
    """The structured-output fields of completions and chat completions."""

    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[StructuredOutputsRequest] = None

    def structured_outputs_field(self) -> str:
        """The request field that set the constraint, for errors found compiling it."""
        so = self.structured_outputs
        if so is None:
            return "response_format" if self.response_format is not None else "structured_outputs"
        kinds = (("json", so.json_), ("regex", so.regex), ("choice", so.choice), ("grammar", so.grammar),
                 ("json_object", so.json_object), ("structural_tag", so.structural_tag))
        return next((f"structured_outputs.{k}" for k, v in kinds if v is not None), "structured_outputs")

    def structured_outputs_params(self) -> Optional[StructuredOutputsParams]:
        """What the request constrains its output to; None for free text."""
        fmt, so = self.response_format, self.structured_outputs
        if fmt is not None and fmt.type == "text":
            fmt = None
        if fmt is not None and so is not None:
            raise InvalidRequestError("response_format: cannot be combined with structured_outputs")
        if so is not None:
            return StructuredOutputsParams(json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar,
                                           json_object=so.json_object, structural_tag=so.structural_tag)
        if fmt is None:
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.type == "json_schema" and (fmt.json_schema is None or fmt.json_schema.json_schema is None):
            raise InvalidRequestError("response_format: type json_schema needs json_schema.schema")
        try:  # the checks name structured_outputs' fields: the client set response_format's
            if fmt.type == "structural_tag":
                tag = fmt.model_dump(exclude={"type", "json_schema"}, exclude_none=True)
                return StructuredOutputsParams(structural_tag=json.dumps(tag))
            return StructuredOutputsParams(json=fmt.json_schema.json_schema)
        except InvalidRequestError as e:
            raise InvalidRequestError(re.sub(r"^structured_outputs\.\w+", "response_format", str(e))) from None
