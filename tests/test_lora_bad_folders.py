"""Adapter folders and names a client can send to /v1/load_lora_adapter that the checks
missed: each is a 400 naming what is wrong, never a 500, and the server goes on serving
the adapters it has."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest
import safetensors.torch

from test_lora import PROMPTS, _llm, folders  # noqa: F401 (folders: the module's fixture)

pytestmark = pytest.mark.slow


def _variant(folders, tmp_path, name: str, config=None, tensors=None) -> str:
    """Adapter b's folder with its config or its tensors replaced by what the callables make."""
    path = tmp_path / name
    shutil.copytree(folders[1]["b"], path)
    if config is not None:
        cfg = path / "adapter_config.json"
        cfg.write_text(json.dumps(config(json.loads(cfg.read_text()))))
    if tensors is not None:
        weights = path / "adapter_model.safetensors"
        safetensors.torch.save_file(tensors(safetensors.torch.load_file(weights)), weights)
    return str(path)


def _first_a_nan(ts):
    key = next(k for k in sorted(ts) if "lora_A" in k)
    ts[key][0, 0] = float("nan")
    return ts


def test_bad_folders_and_names_are_400s(folders, tmp_path, monkeypatch):
    from inflight.entrypoints.openai.server_thread import ServerThread
    from inflight.entrypoints.openai.serving_lora import LoRAModels

    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    bad = {  # name -> (folder, words of the error)
        "listcfg": (_variant(folders, tmp_path, "listcfg", config=lambda c: [1, 2]), "JSON object"),
        "alpha": (_variant(folders, tmp_path, "alpha", config=lambda c: {**c, "lora_alpha": "x"}), "lora_alpha"),
        "nan": (_variant(folders, tmp_path, "nan", tensors=_first_a_nan), "not finite"),
        "scalar": (_variant(folders, tmp_path, "scalar", tensors=lambda ts: {k: t[0, 0] for k, t in ts.items()}),
                   "matrices"),
    }
    llm = _llm(folders)
    with ServerThread(llm.llm_engine, "base", log_stats=False, lora=LoRAModels(enabled=True)) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as h:
        for name, (path, words) in bad.items():
            r = h.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
            assert r.status_code == 400 and words in r.json()["error"]["message"], (name, r.text)
        for name in ("x" * 257, "a\u0000b", "tab\there"):
            r = h.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": folders[1]["b"]})
            assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name", r.text
        assert h.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": folders[1]["b"]}).status_code == 200
        r = h.post("/v1/unload_lora_adapter", json={"lora_name": "b", "lora_int_id": 999})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_int_id", r.text
        body = {"model": "b", "prompt": PROMPTS[0], "max_tokens": 2, "temperature": 0}
        assert h.post("/v1/completions", json=body).status_code == 200
        assert h.post("/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 200
