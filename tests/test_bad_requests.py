"""Requests meant to hurt the server, over the fake engine: each gets an OpenAI-shaped
4xx naming the limit, and afterwards good requests still succeed with every KV block
back in the pool. Connection-level abuse (body and header sizes, slow sockets,
concurrency) and the special-token guard of chat rendering: test_server_limits.py."""
from __future__ import annotations

import json

import httpx
import pytest

from bad_request_cases import BIG, C, CASES, CH, INVALID, MODEL, TOOL, U, chat, cmpl
from inflight.entrypoints.openai.server_thread import ServerThread
from test_async_engine import SCRIPT, make_fake_engine
from test_server import wait_until_idle


@pytest.fixture(scope="module")
def server():
    engine = make_fake_engine(num_blocks=256, block_size=4, max_model_len=128, max_num_seqs=32,
                              max_num_batched_tokens=256)
    with ServerThread(engine, MODEL, log_stats=False) as srv:
        srv.engine = engine
        yield srv


@pytest.fixture(autouse=True)
def _reset(server):
    yield
    server.state.max_waiting_requests = None
    server.state.limits.max_concurrent_requests = 1024
    server.engine.runner.step_delay = 0.0


def post(h: httpx.Client, path: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return h.post(path, content=body, headers={"content-type": "application/json"})
    return h.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def assert_error(r: httpx.Response, status: int, kind: str, case=None) -> dict:
    assert r.status_code == status, (case, r.status_code, r.text[:500])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], (case, err)
    assert err["type"] == kind, (case, err)
    assert len(err["message"]) <= 1000 and "Traceback" not in err["message"], (case, err["message"][:300])
    return err


def good_requests_succeed(server, h: httpx.Client) -> None:
    r = post(h, C, cmpl(max_tokens=3, temperature=0))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == SCRIPT[:3], r.text
    r = post(h, CH, chat(max_tokens=3, seed=2**63 - 16, n=16, stop=["zz"] * 16, stop_token_ids=list(range(200, 256))))
    assert r.status_code == 200 and len(r.json()["choices"]) == 16, r.text
    wait_until_idle(server)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_request(server, case):
    path, body, status, kind = CASES[case]
    with httpx.Client(base_url=server.base_url, timeout=30) as h:
        err = assert_error(post(h, path, body), status, kind, CASES[case][:1] + (str(body)[:200],))
    if status == 404 and path == C:
        assert len(err["message"]) < 400  # the 200 KB name is clipped


def test_table_is_big_enough():
    assert len(CASES) >= 80


def test_the_server_still_serves_after_every_bad_request(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as h:
        for path, body, status, kind in CASES:
            assert post(h, path, body).status_code == status
        assert h.get("/health").status_code == 200
        good_requests_succeed(server, h)


def test_limits_are_named_in_errors(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as h:
        assert "--max-n" in post(h, C, cmpl(n=17)).json()["error"]["message"]
        err = post(h, C, cmpl(seed=2**63 - 1, n=2)).json()["error"]
        assert "int64" in err["message"] and err["param"] == "seed"
        assert "256" in post(h, C, cmpl(prompt=["Hi"] * 257)).json()["error"]["message"]
        assert "16" in post(h, C, cmpl(stop=["a"] * 17)).json()["error"]["message"]
        assert "[0, 257)" in post(h, C, cmpl(stop_token_ids=[300])).json()["error"]["message"]
        err = post(h, CH, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}})).json()
        assert "'g'" in err["error"]["message"] and err["error"]["param"] == "tool_choice"
        assert post(h, CH, chat(logit_bias={"1": 101})).json()["error"]["param"] == "logit_bias"
        assert "[0, 257)" in post(h, C, cmpl(logit_bias={"300": 1})).json()["error"]["message"]
        assert post(h, C, cmpl(prompt_logprobs=1, stream=True)).json()["error"]["param"] == "prompt_logprobs"
        err = post(h, C, cmpl(truncate_prompt_tokens=129)).json()["error"]
        assert err["param"] == "truncate_prompt_tokens" and "128" in err["message"]
        assert "[0, 257)" in post(h, CH, chat(allowed_token_ids=[1, 300])).json()["error"]["message"]
        assert post(h, CH, chat(continue_final_message=True)).json()["error"]["param"] == "continue_final_message"
        assert post(h, C, cmpl(use_beam_search=True, stop=["x"])).json()["error"]["param"] == "stop"
        assert post(h, CH, chat(use_beam_search=True, n=11)).json()["error"]["param"] == "n"
        err = post(h, C, cmpl(structured_outputs={"json": "{not json"})).json()["error"]
        assert err["param"] == "structured_outputs.json" and "not valid JSON" in err["message"]
        big = {"type": "object", "description": "x" * 70000}
        err = post(h, CH, chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": big}}))
        assert err.json()["error"]["param"] == "response_format", err.text
        # min_tokens past the max_tokens the server derives from the prompt: min_tokens is at fault
        err = post(h, CH, {"model": MODEL, "messages": U, "min_tokens": 1000}).json()["error"]
        assert err["param"] == "min_tokens" and "1000" in err["message"], err
        # vLLM 0.12 removed the guided_* fields: the error names what replaces each
        for name, value, replacement in (("guided_json", {"type": "object"}, "structured_outputs.json"),
                                         ("guided_choice", ["a"], "structured_outputs.choice")):
            err = post(h, CH, chat(**{name: value})).json()["error"]
            assert err["param"] == name and replacement in err["message"], err


def test_harmless_values_of_unsupported_fields_are_accepted(server):
    with httpx.Client(base_url=server.base_url, timeout=30) as h:
        for extra in ({"tool_choice": "none"}, {"tools": []}, {"response_format": {"type": "text"}},
                      {"logit_bias": {}}, {"logit_bias": None}, {"chat_template_kwargs": {"enable_thinking": False}},
                      {"use_beam_search": False}, {"length_penalty": 1}, {"bad_words": ["zz"]},
                      {"add_special_tokens": False}, {"spaces_between_special_tokens": True},
                      {"return_tokens_as_token_ids": False}, {"vllm_xargs": None}):
            assert post(h, CH, chat(**extra)).status_code == 200, extra
        assert post(h, C, cmpl(add_special_tokens=False)).status_code == 200
        r = post(h, CH, {"messages": [{"role": "developer", "content": "Be brief."}, *U, {"role": "assistant"}]})
        assert r.status_code == 200, r.text
    wait_until_idle(server)


def test_a_batch_counts_whole_against_max_waiting_requests(server):
    server.state.max_waiting_requests = 4
    with httpx.Client(base_url=server.base_url, timeout=30) as h:
        err = assert_error(post(h, C, cmpl(prompt=["a", "b", "c"], n=2)), 400, INVALID)
        assert "--max-waiting-requests" in err["message"]
        assert post(h, C, cmpl(prompt=["a", "b"], n=2)).status_code == 200
    wait_until_idle(server)


@pytest.mark.parametrize("kwargs", [
    {"seed": BIG}, {"seed": -(2**63) - 1}, {"seed": 2**63 - 1, "n": 2}, {"temperature": float("nan")},
    {"top_p": float("inf")}, {"repetition_penalty": float("nan")}, {"temperature": 1e39}, {"top_p": 1e-46},
    {"repetition_penalty": 1e-46}, {"presence_penalty": float("-inf")},
    {"n": 1.5}, {"n": 0}, {"max_tokens": BIG}, {"stop": ""}, {"stop": ["a"] * 17}, {"stop": ["x" * 257]},
    {"stop_token_ids": [-1]}, {"stop_token_ids": list(range(65))}, {"logprobs": -1}, {"prompt_logprobs": -2},
    {"prompt_logprobs": -1}, {"logit_bias": {1: 101}}, {"logit_bias": {-1: 1}}, {"logit_bias": {"1": 1}},
    {"logit_bias": {i: 1 for i in range(301)}}, {"logit_bias": {1: float("nan")}},
    {"allowed_token_ids": []}, {"allowed_token_ids": [-1]}, {"allowed_token_ids": [True]},
    {"allowed_token_ids": "12"}, {"bad_words": "the"}, {"bad_words": [""]}, {"bad_words": ["x" * 257]},
])
def test_sampling_params_check_the_same_for_offline_use(kwargs):
    from inflight.errors import InvalidRequestError
    from inflight.sampling_params import SamplingParams

    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)
    with pytest.raises(InvalidRequestError):
        SamplingParams(stop_token_ids=[257]).verify_vocab(257)
