"""vllm serve's HTTP flags: CORS, root path, docs pages, response role, request logs."""
from __future__ import annotations

import logging
import time

import httpx
import pytest

from inflight.entrypoints.openai.http_options import HttpOptions
from inflight.entrypoints.openai.server_thread import ServerThread
from test_async_engine import SCRIPT, make_fake_engine
from test_server import wait_until_idle

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server():
    http = HttpOptions(allowed_origins=["https://app.example"], root_path="/api", disable_fastapi_docs=True)
    with ServerThread(make_fake_engine(), "m", log_stats=False, http=http, response_role="bot",
                      log_requests=True, max_log_len=4) as srv:
        yield srv


def test_cors_answers_the_allowed_origin_only(server):
    with httpx.Client(base_url=server.base_url) as h:
        pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        ok = h.options("/v1/completions", headers={"Origin": "https://app.example", **pre})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        bad = h.options("/v1/completions", headers={"Origin": "https://evil.example", **pre})
        assert "access-control-allow-origin" not in bad.headers
        r = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"


def test_docs_pages_are_off_and_the_root_path_is_announced(server):
    with httpx.Client(base_url=server.base_url) as h:
        assert h.get("/docs").status_code == 404 and h.get("/openapi.json").status_code == 404
    assert server.server.config.root_path == "/api"
    with httpx.Client(base_url=server.base_url) as h:  # a proxy strips the prefix; the app still answers
        assert h.get("/v1/models").json()["data"][0]["id"] == "m"


def test_the_answer_role_and_the_request_log(server, caplog):
    with caplog.at_level(logging.INFO, logger="inflight.entrypoints.openai.http_options"), \
            httpx.Client(base_url=server.base_url) as h:
        r = h.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3}).json()
        assert r["choices"][0]["message"]["role"] == "bot"
        lines = h.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3, "stream": True}).text
        assert '"delta":{"role":"bot"' in lines
        h.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 2})
    logged = [rec.getMessage() for rec in caplog.records if "Received request" in rec.getMessage()]
    assert len(logged) == 3 and "prompt: 'Hell'" in logged[-1] and "prompt_token_ids: [72, 101, 108, 108]" in logged[-1]
    wait_until_idle(server)


def test_forced_usage_ends_every_stream():
    with ServerThread(make_fake_engine(), "m", log_stats=False, force_include_usage=True) as srv, \
            httpx.Client(base_url=srv.base_url) as h:
        for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": USER})):
            events = [line for line in h.post(path, json={**body, "max_tokens": 2, "stream": True}).text.splitlines()
                      if line.startswith("data: {")]
            assert '"completion_tokens":2' in events[-1] and '"choices":[]' in events[-1], (path, events[-1])


def test_vllm_defaults_allow_every_origin():
    with ServerThread(make_fake_engine(), "m", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={"Origin": "https://x.example"})
        assert r.headers["access-control-allow-origin"] == "*" and r.json()["choices"][0]["text"] == SCRIPT[:2]
        assert h.get("/docs").status_code == 200


def test_several_served_model_names():
    from inflight.entrypoints.cli import build_parser

    args = build_parser("serve").parse_args(["serve", "some/model", "--served-model-name", "main", "alias"])
    assert args.model == "some/model" and args.served_model_name == ["main", "alias"]
    with ServerThread(make_fake_engine(), "main", log_stats=False, model_aliases=["alias"]) as srv, \
            httpx.Client(base_url=srv.base_url) as h:
        assert [m["id"] for m in h.get("/v1/models").json()["data"]] == ["main", "alias"]
        r = h.post("/v1/completions", json={"model": "alias", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "alias"  # the name asked for, as vLLM
        chat = h.post("/v1/chat/completions", json={"model": "alias", "messages": USER, "max_tokens": 2,
                                                    "stream": True}).text
        assert '"model":"alias"' in chat and '"model":"main"' not in chat
        assert h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).json()["model"] == "main"
        assert h.post("/v1/completions", json={"model": "other", "prompt": "Hi", "max_tokens": 2}).status_code == 404


def test_tls_with_a_key_and_certificate():
    """A self-signed pair made for this test only (tests/data: openssl req -x509 ... -days 36500)."""
    import pathlib
    import ssl

    data = pathlib.Path(__file__).parent / "data"
    tls = {"ssl_keyfile": str(data / "tls_test_key.pem"), "ssl_certfile": str(data / "tls_test_cert.pem")}
    with ServerThread(make_fake_engine(), "m", log_stats=False, http=HttpOptions(ssl=tls)) as srv:
        url = srv.base_url.replace("http://", "https://")
        trust = ssl.create_default_context(cafile=str(data / "tls_test_cert.pem"))
        assert httpx.get(url + "/health", verify=trust).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.base_url + "/health", timeout=5)  # plain HTTP is not spoken


def test_load_counts_the_requests_the_engine_holds():
    import threading

    engine = make_fake_engine()
    engine.runner.step_delay = 0.05
    with ServerThread(engine, "m", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        body = {"prompt": "Hi", "max_tokens": 20}
        threads = [threading.Thread(target=httpx.post, args=(srv.base_url + "/v1/completions",),
                                    kwargs={"json": body, "timeout": 30}) for _ in range(3)]
        for t in threads:
            t.start()
        seen = 0
        for _ in range(40):
            seen = max(seen, h.get("/load").json()["server_load"])
            time.sleep(0.02)
        for t in threads:
            t.join()
        assert seen >= 1 and h.get("/load").json() == {"server_load": 0}
