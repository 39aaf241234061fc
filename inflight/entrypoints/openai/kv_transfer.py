"""``kv_transfer_params`` on the OpenAI routes (vLLM's field): a prefill instance's
answer names where its KV waits, a decode instance's request says where to pull it."""
from __future__ import annotations

from typing import Any, Optional

from inflight.entrypoints.openai.errors import bad_request
from inflight.outputs import RequestOutput


def check_kv_transfer(req: Any, num_prompts: int) -> None:
    """400 for what a transfer cannot serve: several prompts or samples, a streamed prefill."""
    kv = getattr(req, "kv_transfer_params", None)
    if not kv:
        return
    if not isinstance(kv, dict):
        raise bad_request("kv_transfer_params must be an object", "kv_transfer_params")
    if num_prompts != 1 or req.n != 1:
        raise bad_request("kv_transfer_params needs one prompt and n=1", "kv_transfer_params")
    if kv.get("do_remote_decode") and req.stream:
        raise bad_request("a prefill with do_remote_decode cannot be streamed", "kv_transfer_params")


def _connector(state: Any) -> Any:
    return getattr(getattr(state.engine, "engine", None), "kv_connector", None)


def add_kv_transfer_params(state: Any, req: Any, request_id: str, outputs: list[RequestOutput],
                           payload: dict[str, Any]) -> dict[str, Any]:
    """The answer of a finished prefill asked for with ``do_remote_decode`` names its KV."""
    kv: Optional[dict] = getattr(req, "kv_transfer_params", None)
    connector = _connector(state)
    if not kv or not kv.get("do_remote_decode") or connector is None:
        return payload
    if all(c.finish_reason in ("stop", "length") for o in outputs for c in o.outputs):
        params = connector.kv_transfer_params(request_id)
        if params is not None:
            payload["kv_transfer_params"] = params
    return payload
