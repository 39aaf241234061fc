"""The model's recommended sampling defaults (--generation-config), as vLLM applies them:
to the fields a request leaves unset, offline and served."""
from __future__ import annotations

import json

import httpx
import pytest

from inflight.engine.generation_config import default_sampling_params
from inflight.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

RECOMMENDED = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "max_new_tokens": 3, "bos_token_id": 1,
               "do_sample": True}


def write_config(folder, config=RECOMMENDED) -> str:
    with open(f"{folder}/generation_config.json", "w") as f:
        json.dump(config, f)
    return str(folder)


def test_the_recommended_fields_are_read_and_overridden(tmp_path):
    folder = write_config(tmp_path)
    want = {"temperature": 0.0, "top_p": 0.95, "top_k": 20, "max_tokens": 3}
    assert default_sampling_params(folder) == want
    assert default_sampling_params(folder, "vllm") == {}
    assert default_sampling_params(folder, override='{"temperature": 0.7}') == {**want, "temperature": 0.7}
    assert default_sampling_params(str(tmp_path / "model.gguf")) == {}  # a file has no generation config
    assert default_sampling_params(folder, "vllm", {"min_p": 0.1}) == {"min_p": 0.1}
    with pytest.raises(ValueError, match="unknown"):
        default_sampling_params(folder, override={"do_sample": False})
    with pytest.raises(ValueError, match="no generation_config.json"):
        default_sampling_params(folder, str(tmp_path / "elsewhere"))
    write_config(tmp_path, {"temperature": -1})
    with pytest.raises(ValueError, match="temperature"):
        default_sampling_params(folder)


def test_requests_take_the_defaults_for_unset_fields_only():
    d = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 3}
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]).to_sampling_params(d)
    assert (chat.temperature, chat.top_p, chat.top_k, chat.max_tokens) == (0.6, 0.95, 20, 3)
    own = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=1.0, top_k=5,
                                max_tokens=10).to_sampling_params(d)
    assert (own.temperature, own.top_k, own.max_tokens) == (1.0, 5, 3)  # vLLM caps max_tokens by the default too
    assert CompletionRequest(prompt="x").to_sampling_params(d).max_tokens == 3  # min(16, 3)
    assert CompletionRequest(prompt="x").to_sampling_params({}).max_tokens == 16
    assert ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}]).to_sampling_params({}).max_tokens \
        is None


@pytest.mark.slow
def test_offline_and_served_defaults_come_from_the_model_folder(tmp_path_factory):
    from inflight import LLM
    from inflight.entrypoints.openai.server_thread import ServerThread
    from test_disagg import tiny_checkpoint

    folder = write_config(tiny_checkpoint(str(tmp_path_factory.mktemp("gen"))))
    llm = LLM(model=folder, dtype="float32", kv_cache_memory=4 * 2**20)
    sp = llm.get_default_sampling_params()
    assert (sp.temperature, sp.top_k, sp.max_tokens) == (0.0, 20, 3)
    out = llm.generate([[5, 6, 7]], use_tqdm=False)[0].outputs[0]  # no params: the model's
    assert len(out.token_ids) == 3
    with ServerThread(llm.llm_engine, "m", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        chat = h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert chat["usage"]["completion_tokens"] == 3
        greedy = {"prompt": [5, 6, 7, 8], "max_tokens": 3, "temperature": 0}
        unset = h.post("/v1/completions", json={"prompt": [5, 6, 7, 8]}).json()
        assert unset["choices"][0]["text"] == h.post("/v1/completions", json=greedy).json()["choices"][0]["text"]
    plain = LLM(model=folder, dtype="float32", kv_cache_memory=4 * 2**20, generation_config="vllm")
    assert plain.get_default_sampling_params().temperature == 1.0
