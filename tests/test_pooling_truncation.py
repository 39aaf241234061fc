"""``truncate_prompt_tokens`` on pooling models keeps a prompt's *first* tokens, as vLLM's pooling
runner cuts: a text is cut by the tokenizer, so a BERT keeps ``[CLS] ... [SEP]`` and a
cross-encoder's pair keeps its query; token ids are sliced. ``truncation_side`` (vLLM's field)
picks the side; a generating model keeps the prompt's last tokens unless asked otherwise."""
from __future__ import annotations

import httpx
import pytest
import torch
import torch.nn.functional as F

from encoder_models import wordpiece_bert

from inflight import LLM

SMALL = dict(dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
QUERY, DOC = "where is the lighthouse", "in the harbour at dawn the keeper is on the rock"
TEXT = "where is the keeper of the lighthouse in the harbour at dawn"


@pytest.fixture(scope="module")
def cross(tmp_path_factory):
    return wordpiece_bert(tmp_path_factory.mktemp("ce"), cross_encoder=True)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return wordpiece_bert(tmp_path_factory.mktemp("bert"), cross_encoder=False)


def _pair_score(model, enc) -> float:
    with torch.no_grad():
        return torch.sigmoid(model(**{k: torch.tensor([v]) for k, v in enc.items()}).logits[0, 0]).item()


def _cls(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return F.normalize(model(torch.tensor([ids])).last_hidden_state[0, 0], dim=-1)


def test_a_cut_pair_keeps_cls_and_its_query(cross):
    """LLM.score, /score and /rerank cut a pair as the tokenizer does (the document's tail
    goes; [CLS], the query and the last [SEP] stay) and score what is left."""
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, tok, model = cross
    full = tok(QUERY, text_pair=DOC)
    keep = len(full.input_ids) - 4
    cut = tok(QUERY, text_pair=DOC, truncation=True, max_length=keep)
    assert cut.input_ids[0] == tok.cls_token_id and cut.input_ids[-1] == tok.sep_token_id
    want = _pair_score(model, cut)
    last = _pair_score(model, {k: v[-keep:] for k, v in full.items()})
    assert abs(want - last) > 1e-3  # keeping the last tokens instead ([CLS] and the query lost) shows
    llm = LLM(str(folder), **SMALL)
    out = llm.score(QUERY, [DOC], truncate_prompt_tokens=keep, use_tqdm=False)[0]
    assert out.outputs.score == pytest.approx(want, abs=2e-5)
    assert len(out.prompt_token_ids) == keep
    with ServerThread(llm.llm_engine, "ce", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        body = {"model": "ce", "truncate_prompt_tokens": keep}
        r = h.post("/score", json={**body, "text_1": QUERY, "text_2": [DOC]})
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["score"] == pytest.approx(want, abs=2e-5)
        assert r.json()["usage"]["prompt_tokens"] == keep
        r = h.post("/rerank", json={**body, "query": QUERY, "documents": [DOC]})
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["relevance_score"] == pytest.approx(want, abs=2e-5)
    assert llm.llm_engine.scheduler.kv.usage == 0.0


def test_cls_embeddings_of_cut_texts_and_ids(bert):
    """A cut text keeps [CLS] (the pooled token) and ends with [SEP], as the tokenizer cuts it;
    token ids keep their first N; truncation_side="left" keeps the last N instead."""
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, tok, model = bert
    ids = tok(TEXT).input_ids
    keep = 6
    cut = tok(TEXT, truncation=True, max_length=keep).input_ids
    assert cut[0] == tok.cls_token_id and cut[-1] == tok.sep_token_id and len(ids) > keep + 2
    llm = LLM(str(folder), **SMALL)
    out = llm.embed(TEXT, truncate_prompt_tokens=keep, use_tqdm=False)[0]
    assert out.prompt_token_ids == cut
    torch.testing.assert_close(torch.tensor(out.outputs.embedding), _cls(model, cut), atol=2e-5, rtol=1e-4)
    out = llm.embed({"prompt_token_ids": ids}, truncate_prompt_tokens=keep, use_tqdm=False)[0]
    assert out.prompt_token_ids == ids[:keep]
    with ServerThread(llm.llm_engine, "bert", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        cases = [(TEXT, {}, cut), (ids, {}, ids[:keep]), (TEXT, {"truncation_side": "left"}, ids[-keep:]),
                 (TEXT, {"truncation_side": "right"}, ids[:keep])]
        for item, extra, want in cases:
            body = {"model": "bert", "input": [item], "truncate_prompt_tokens": keep, **extra}
            r = h.post("/v1/embeddings", json=body)
            assert r.status_code == 200, (extra, r.text)
            assert r.json()["usage"]["prompt_tokens"] == keep
            got = torch.tensor(r.json()["data"][0]["embedding"])
            torch.testing.assert_close(got, _cls(model, want), atol=2e-5, rtol=1e-4, msg=str(extra))
        r = h.post("/v1/embeddings", json={"model": "bert", "input": TEXT, "truncation_side": "middle"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncation_side"
    assert llm.llm_engine.scheduler.kv.usage == 0.0
