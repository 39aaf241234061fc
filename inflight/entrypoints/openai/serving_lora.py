"""LoRA adapters as models clients name (vLLM's ``OpenAIServingModels``): those of
``--lora-modules`` at start, and, where ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is set,
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``. A request whose ``model``
is an adapter's name runs with that adapter."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, StringConstraints

from inflight.entrypoints.openai.errors import OpenAIError, bad_request
from inflight.entrypoints.openai.limits import clip
from inflight.entrypoints.openai.validation import SafeStr
from inflight.lora.request import LoRARequest

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
MAX_LORA_NAME_CHARS = 256


def parse_lora_module(value: str) -> LoRARequest:
    """One ``--lora-modules`` entry: ``name=path`` or vLLM's JSON ``{"name", "path", "base_model_name"}``
    (its id is set when it is registered)."""
    value = value.strip()
    if value.startswith("{"):
        try:
            d = json.loads(value)
            return LoRARequest(d["name"], 1, d["path"], d.get("base_model_name"))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"--lora-modules {value!r}: JSON needs \"name\" and \"path\" ({e})") from None
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {value!r}: expected name=path or JSON")
    return LoRARequest(name, 1, path)


@dataclass
class LoRAModels:
    """The adapters this server answers for, by name, each with its own id."""

    enabled: bool = False  # the engine runs with enable_lora
    adapters: dict[str, LoRARequest] = field(default_factory=dict)
    next_id: int = 1

    def get(self, name: Optional[str]) -> Optional[LoRARequest]:
        return self.adapters.get(name) if name is not None else None

    def __contains__(self, name: Optional[str]) -> bool:
        return name in self.adapters

    @classmethod
    def from_modules(cls, modules: list[LoRARequest]) -> "LoRAModels":
        """LoRA on, with ``--lora-modules``' adapters registered (each with its own id)."""
        models = cls(enabled=True)
        for m in modules:
            models.register(m)
        return models

    def register(self, req: LoRARequest) -> LoRARequest:
        """Give ``req`` the next id and answer for its name from now on."""
        req = self.numbered(req.lora_name, req.lora_path, req.base_model_name)
        self.adapters[req.lora_name] = req
        return req

    def numbered(self, name: str, path: str, base_model_name: Optional[str] = None) -> LoRARequest:
        """A request for this adapter under an id no other adapter of this server has had."""
        req = LoRARequest(name, self.next_id, path, base_model_name)
        self.next_id += 1
        return req


# a name is served as a model and written into the log: printable, and short
LoRAName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_LORA_NAME_CHARS,
                                            pattern=r"^[^\x00-\x1f\x7f]+$")]


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: LoRAName
    lora_path: SafeStr


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: Optional[int] = None


runtime = APIRouter()


@runtime.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    state = request.app.state.server
    models: LoRAModels = state.lora
    if not models.enabled:
        raise bad_request("LoRA is not enabled: start the server with --enable-lora", "lora_name")
    taken = lambda: body.lora_name in models or body.lora_name in (state.model_name, *state.model_aliases)  # noqa: E731
    if taken():
        raise _already_loaded(body.lora_name)
    try:
        req = models.numbered(body.lora_name, body.lora_path)
    except ValueError as e:
        raise bad_request(str(e), "lora_name") from None
    await check_adapter(state.engine, req)
    if taken():  # loaded by a concurrent call meanwhile
        raise _already_loaded(body.lora_name)
    models.adapters[req.lora_name] = req
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


def _already_loaded(name: str) -> OpenAIError:
    return bad_request(f"The lora adapter '{clip(name)}' has already been loaded.", "lora_name")


@runtime.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    models: LoRAModels = request.app.state.server.lora
    req = models.get(body.lora_name)
    if req is None:
        raise OpenAIError(404, f"The lora adapter '{clip(body.lora_name)}' cannot be found.", param="lora_name",
                          code="model_not_found")
    if body.lora_int_id is not None and body.lora_int_id != req.lora_int_id:
        raise bad_request(f"lora_int_id {body.lora_int_id} is not the id of '{clip(body.lora_name)}' "
                          f"({req.lora_int_id})", "lora_int_id")
    del models.adapters[body.lora_name]
    engine = request.app.state.server.engine
    if hasattr(engine, "call"):  # its weights go now; requests already queued with it reload them
        await engine.call(lambda e: e.remove_lora(req.lora_int_id))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


async def check_adapter(engine: Any, req: LoRARequest) -> None:
    """Load the adapter on the step thread, so a bad one is a 400 now and never a failed request later.
    Data-parallel replicas each load it with its first request (a bad one fails that request)."""
    if not hasattr(engine, "call"):
        return
    try:
        await engine.call(lambda e: e.add_lora(req))
    except (ValueError, TypeError, KeyError, OSError) as e:  # what a folder's contents can make the reader raise
        raise bad_request(clip(str(e) or type(e).__name__, 500), "lora_path") from None


def runtime_updates_allowed() -> bool:
    return os.environ.get(RUNTIME_UPDATES_ENV, "").strip().lower() in ("1", "true")
