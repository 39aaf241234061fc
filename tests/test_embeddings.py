"""Pooling models: embeddings equal transformers' final hidden states (LAST, MEAN, CLS;
normalized or not; Matryoshka cuts) on a tiny random Llama, chunked, prefix-cached and
preempted alike; a sentence-transformers folder picks its own pooling; served over
``/v1/embeddings`` as OpenAI's client reads it, with 4xx answers that name the limit."""
from __future__ import annotations

import base64
import json
import socket
import time

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
import transformers

from inflight import LLM, SamplingParams
from inflight.errors import InvalidRequestError
from inflight.loader.testing import tiny_model, write_tiny_gguf
from inflight.pooling_params import PoolingParams

PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(3 + 17 * i)] for i in range(5)]  # 3 .. 71 tokens
SMALL = dict(dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(folder, transformers' final hidden states of each prompt)."""
    root = tmp_path_factory.mktemp("emb")
    write_tiny_gguf(str(root / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(root, gguf_file="tok.gguf")
    model = tiny_model("llama", seed=5).eval()
    folder = root / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    with torch.no_grad():
        hidden = [model.model(torch.tensor([p])).last_hidden_state[0] for p in PROMPTS]
    return folder, hidden


def _embed(llm: LLM, prompts=PROMPTS, params=None) -> list[torch.Tensor]:
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], pooling_params=params, use_tqdm=False)
    return [torch.tensor(o.outputs.embedding) for o in outs]


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w.float(), atol=2e-5, rtol=1e-4, msg=f"prompt {i}")


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("budget", [256, 16])
def test_last_token_embedding_equals_transformers(tiny, backend, budget):
    folder, hidden = tiny
    llm = LLM(str(folder), runner="pooling", attention_backend=backend, **{**SMALL, "max_num_batched_tokens": budget})
    _close(_embed(llm), [F.normalize(h[-1], dim=-1) for h in hidden])
    raw = _embed(llm, params=PoolingParams(use_activation=False))
    _close(raw, [h[-1] for h in hidden])
    assert llm.llm_engine.scheduler.kv.usage == 0.0


def _sentence_transformers(folder, tmp_path, mode: str, normalize: bool):
    """A copy of the model folder with sentence-transformers' modules.json and pooling config."""
    import shutil

    st = tmp_path / f"st-{mode}-{normalize}"
    shutil.copytree(folder, st)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (st / "modules.json").write_text(json.dumps(modules))
    (st / "1_Pooling").mkdir()
    flags = {f"pooling_mode_{m}": m == mode for m in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")}
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **flags}))
    return st


@pytest.mark.parametrize("mode,normalize", [("mean_tokens", True), ("cls_token", False), ("lasttoken", True)])
def test_a_sentence_transformers_folder_picks_pooling_and_its_mode(tiny, tmp_path, mode, normalize):
    folder, hidden = tiny
    llm = LLM(str(_sentence_transformers(folder, tmp_path, mode, normalize)), **{**SMALL, "max_num_batched_tokens": 16})
    assert llm.llm_engine.pooler_config is not None  # runner "auto" became "pooling"
    pick = {"mean_tokens": lambda h: h.mean(0), "cls_token": lambda h: h[0], "lasttoken": lambda h: h[-1]}[mode]
    want = [F.normalize(pick(h), dim=-1) if normalize else pick(h) for h in hidden]
    _close(_embed(llm), want)
    with pytest.raises(ValueError, match="LLM.generate needs a generative model"):
        llm.generate("hi", SamplingParams(max_tokens=2))


def test_pooler_config_overrides_the_folder(tiny, tmp_path):
    folder, hidden = tiny
    st = _sentence_transformers(folder, tmp_path, "mean_tokens", True)
    llm = LLM(str(st), pooler_config='{"pooling_type": "CLS", "use_activation": false}', **SMALL)
    _close(_embed(llm), [h[0] for h in hidden])
    with pytest.raises(ValueError, match="use `use_activation` instead"):
        LLM(str(folder), runner="pooling", pooler_config={"normalize": True}, **SMALL)


def test_prefix_cache_and_preemption_keep_the_embeddings(tiny):
    folder, hidden = tiny
    want = [F.normalize(h.mean(0), dim=-1) for h in hidden]
    # 12 blocks of 16 tokens for 5 prompts of up to 71: mid-prompt preemptions
    llm = LLM(str(folder), runner="pooling", pooler_config={"pooling_type": "MEAN"}, num_gpu_blocks_override=12,
              long_prefill_token_threshold=16, **SMALL)
    _close(_embed(llm, PROMPTS * 3), want * 3)
    assert llm.llm_engine.scheduler.num_preemptions > 0, "the test must preempt"
    last = LLM(str(folder), runner="pooling", **SMALL)
    first = last.embed([{"prompt_token_ids": PROMPTS[4]}], use_tqdm=False)[0]
    again = last.embed([{"prompt_token_ids": PROMPTS[4]}], use_tqdm=False)[0]
    assert again.num_cached_tokens == 64 and first.num_cached_tokens == 0
    _close([torch.tensor(again.outputs.embedding)], [F.normalize(hidden[4][-1], dim=-1)])


def test_matryoshka_dimensions(tiny, tmp_path):
    folder, hidden = tiny
    plain = LLM(str(folder), runner="pooling", **SMALL)
    with pytest.raises(InvalidRequestError, match="does not support Matryoshka"):
        _embed(plain, params=PoolingParams(dimensions=16))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "is_matryoshka": True}))
    try:
        mat = LLM(str(folder), runner="pooling", **SMALL)
    finally:
        (folder / "config.json").write_text(json.dumps(cfg))
    _close(_embed(mat, params=PoolingParams(dimensions=16)), [F.normalize(h[-1, :16], dim=-1) for h in hidden])
    with pytest.raises(InvalidRequestError, match=r"range \[1, 64\], got 65"):
        _embed(mat, params=PoolingParams(dimensions=65))


def test_each_runner_refuses_the_other_task(tiny):
    folder, _ = tiny
    gen = LLM(str(folder), **SMALL)
    with pytest.raises(ValueError, match="runner='pooling'"):
        gen.embed("hello")
    with pytest.raises(ValueError, match="runner='pooling'"):
        gen.llm_engine.add_request("x", "hello", PoolingParams())
    emb = LLM(str(folder), runner="pooling", max_model_len=32, **SMALL)
    with pytest.raises(ValueError, match=r"exceeds max_model_len \(32\)"):
        emb.embed([{"prompt_token_ids": PROMPTS[2]}])
    assert len(emb.embed([{"prompt_token_ids": PROMPTS[2][:32]}], use_tqdm=False)[0].outputs.embedding) == 64
    with pytest.raises(ValueError, match="does not generate"):
        emb.llm_engine.add_request("y", "hello", SamplingParams())
    with pytest.raises(ValueError, match="needs scheduling='continuous'"):
        LLM(str(folder), runner="pooling", scheduling="static", **SMALL)


def test_served_embeddings(tiny):
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, hidden = tiny
    llm = LLM(str(folder), runner="pooling", max_model_len=100, **SMALL)
    offline = _embed(llm)
    with ServerThread(llm.llm_engine, "emb", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x")
        r = client.embeddings.create(model="emb", input=PROMPTS)  # the client asks for base64 by default
        assert [d.index for d in r.data] == list(range(len(PROMPTS)))
        assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, PROMPTS))
        _close([torch.tensor(d.embedding) for d in r.data], offline)
        r = client.embeddings.create(model="emb", input=PROMPTS[1], encoding_format="float")
        _close([torch.tensor(r.data[0].embedding)], offline[1:2])
        body = h.post("/v1/embeddings", json={"input": [PROMPTS[3]], "encoding_format": "base64",
                                              "embed_dtype": "float16", "endianness": "big"}).json()
        half = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype=">f2")
        _close([torch.tensor(half.astype(np.float32))], [offline[3].half().float()])
        raw = h.post("/v1/embeddings", json={"input": [PROMPTS[0]], "use_activation": False}).json()
        _close([torch.tensor(raw["data"][0]["embedding"])], [hidden[0][-1]])

        def error(body: dict, path: str = "/v1/embeddings") -> tuple[int, dict]:
            r = h.post(path, json=body)
            return r.status_code, r.json()["error"]

        status, err = error({"input": [list(range(3, 104))]})
        assert status == 400 and "max_model_len (100)" in err["message"] and err["param"] == "input"
        status, err = error({"input": "hi", "dimensions": 8})
        assert status == 400 and err["param"] == "dimensions" and "Matryoshka" in err["message"]
        assert error({"input": []})[0] == 400
        assert error({"input": ["ok", ""]})[0] == 400
        assert "use_activation" in error({"input": "hi", "normalize": True})[1]["message"]
        assert error({"input": "hi", "model": "other"})[0] == 404
        status, err = error({"prompt": "hi"}, "/v1/completions")
        assert status == 404 and "/v1/embeddings" in err["message"]
        ok = h.post("/v1/embeddings", json={"input": "still serving"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 64
    assert llm.llm_engine.scheduler.kv.usage == 0.0


def test_a_generative_server_answers_embeddings_with_404(tiny):
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, _ = tiny
    llm = LLM(str(folder), **SMALL)
    with ServerThread(llm.llm_engine, "gen", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/v1/embeddings", json={"input": "hello"})
        assert r.status_code == 404 and "--runner pooling" in r.json()["error"]["message"]


@pytest.mark.slow
def test_data_parallel_replicas_serve_the_same_embeddings(tiny):
    from inflight.engine.dp import DPEngineClient
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, hidden = tiny
    want = [F.normalize(h[-1], dim=-1) for h in hidden]
    dp = DPEngineClient(dict(SMALL, model=str(folder), runner="pooling", served_model_name="emb"), data_parallel_size=2)
    with ServerThread(dp, "emb", log_stats=False) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x")
        r = client.embeddings.create(model="emb", input=PROMPTS * 4)
        _close([torch.tensor(d.embedding) for d in r.data], want * 4)
        assert r.usage.prompt_tokens == 4 * sum(map(len, PROMPTS))


def test_score_and_rerank_are_cosine_similarities(tiny):
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, _ = tiny
    llm = LLM(str(folder), runner="pooling", **SMALL)
    query, docs = "the cat sat", ["a cat sat down", "stock prices fell", "the cat sat"]
    emb = {t: torch.tensor(e.outputs.embedding) for t, e in zip([query] + docs, llm.embed([query] + docs,
                                                                                        use_tqdm=False))}
    want = [float(emb[query] @ emb[d]) for d in docs]  # unit vectors
    assert [s.outputs.score for s in llm.score(query, docs, use_tqdm=False)] == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="1:1, 1:N or N:N"):
        llm.score(["a", "b"], docs)
    with ServerThread(llm.llm_engine, "emb", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        for body in ({"text_1": query, "text_2": docs}, {"queries": query, "documents": docs}):
            r = h.post("/v1/score", json=body).json()
            assert [d["score"] for d in r["data"]] == pytest.approx(want, abs=1e-5)
        n = h.post("/score", json={"text_1": docs, "text_2": docs[::-1]}).json()
        assert n["data"][1]["score"] == pytest.approx(1.0, abs=1e-5)
        r = h.post("/v1/rerank", json={"query": query, "documents": docs, "top_n": 2}).json()
        order = sorted(range(3), key=lambda i: -want[i])[:2]
        assert [x["index"] for x in r["results"]] == order and r["results"][0]["document"]["text"] == docs[order[0]]
        ntok = len(llm.get_tokenizer()(query).input_ids)
        assert r["usage"]["prompt_tokens"] == ntok + sum(len(llm.get_tokenizer()(d).input_ids) for d in docs)
        bad = h.post("/v2/rerank", json={"query": query, "documents": []})
        assert bad.status_code == 400
        bad = h.post("/v1/score", json={"text_1": ["a", "b"], "text_2": docs})
        assert bad.status_code == 400 and "1:1, 1:N or N:N" in bad.json()["error"]["message"]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3"])
def test_a_bare_decoder_checkpoint_serves_embeddings(tmp_path, arch):
    """``LlamaModel`` (no logits head, names without ``model.``), as e5-mistral ships: pooling by itself."""
    write_tiny_gguf(str(tmp_path / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf")
    model = tiny_model(arch, seed=8).eval()  # untied: a head the bare checkpoint leaves out
    model.model.save_pretrained(tmp_path / "bare")
    tok.save_pretrained(tmp_path / "bare")
    assert json.loads((tmp_path / "bare" / "config.json").read_text())["architectures"][0].endswith("Model")
    llm = LLM(str(tmp_path / "bare"), **SMALL)
    with torch.no_grad():
        want = [F.normalize(model.model(torch.tensor([p])).last_hidden_state[0, -1], dim=-1) for p in PROMPTS]
    _close(_embed(llm), want)
    with pytest.raises(ValueError, match="has no logits head"):
        LLM(str(tmp_path / "bare"), runner="generate", **SMALL)


def test_a_client_that_leaves_aborts_its_embeddings_and_frees_their_blocks(tiny):
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, _ = tiny
    llm = LLM(str(folder), runner="pooling", **{**SMALL, "max_num_batched_tokens": 16})
    engine = llm.llm_engine
    with ServerThread(engine, "emb", log_stats=False) as srv:
        # 400 inputs of 71 tokens that share no prefix, 16 tokens a step: seconds of work
        inputs = [[5 + (k + j * 13) % 250 for j in range(71)] for k in range(400)]
        body = json.dumps({"input": inputs}).encode()
        host, port = srv.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as client:
            client.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)
            # the client leaves only once the engine holds its inputs: leaving earlier (a loaded
            # host can take a while to parse 400 inputs) would abort nothing
            deadline = time.monotonic() + 30
            while not srv.state.engine.num_unfinished:
                assert time.monotonic() < deadline, "the inputs never reached the engine"
                time.sleep(0.005)
        deadline = time.monotonic() + 5
        while srv.state.engine.num_unfinished and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.state.engine.num_unfinished == 0
        assert srv.state.engine.call_sync(lambda e: e.scheduler.kv.usage) == 0.0
        aborted = [line for line in httpx.get(srv.base_url + "/metrics").text.splitlines()
                   if line.startswith("inflight:request_success_total") and 'finished_reason="abort"' in line]
        assert aborted and float(aborted[0].split()[-1]) >= 1, "the inputs were computed, not aborted"
        ok = httpx.post(srv.base_url + "/v1/embeddings", json={"input": "still serving"})
        assert ok.status_code == 200
