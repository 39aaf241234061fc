"""Structured output through ``inflight serve`` (a real server process on the embedded
model), driven by the official openai client: ``chat.completions.parse`` with a
pydantic model, response_format json_schema at temperature 1.0, the extension
field, and a schema that cannot be compiled answered with a 400."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.slow

MODEL = "smollm2"


class City(BaseModel):
    name: str = Field(max_length=12)
    country: str = Field(max_length=12)
    population_millions: int = Field(ge=0, le=50)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_url():
    port = _free_port()
    cli = os.path.join(os.path.dirname(sys.executable), "inflight")
    proc = subprocess.Popen([cli, "serve", "--port", str(port), "--dtype", "float32", "--served-model-name", MODEL,
                             "--kv-cache-memory", str(64 * 2**20), "--max-model-len", "512"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "inflight serve did not come up"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_parse_with_a_pydantic_model(client):
    r = client.chat.completions.parse(model=MODEL, response_format=City, max_tokens=60, temperature=0,
                                      messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(msg.parsed, City) and msg.parsed == City.model_validate_json(msg.content)


def test_json_schema_at_temperature_1_always_validates(client):
    schema = City.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    r = client.chat.completions.create(model=MODEL, response_format=fmt, max_tokens=60, temperature=1.0, n=4,
                                       seed=11, messages=[{"role": "user", "content": "Invent a city, as JSON."}])
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)
    stream = client.completions.create(model=MODEL, prompt="A colour:", max_tokens=8, stream=True,
                                       extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    assert "".join(c.choices[0].text for c in stream if c.choices) in ("red", "blue")


@pytest.mark.parametrize("body, param, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format", "invalid JSON schema: .*strin"),
    ({"structured_outputs": {"json": {"type": "strin"}}}, "structured_outputs.json", "invalid JSON schema: .*strin"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "invalid regex"),
    ({"structured_outputs": {"grammar": "root ::= missing_rule"}}, "structured_outputs.grammar", "invalid grammar"),
])
def test_a_constraint_that_cannot_compile_is_a_400(base_url, client, body, param, message):
    r = httpx.post(base_url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert re.search(message, err["message"]) and err["message"].startswith(param + ": "), err
    ok = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].finish_reason == "length"
