"""Sequence classifiers (``LlamaForSequenceClassification``) as vLLM serves them: label
probabilities equal transformers' on a tiny random model, offline (``LLM.classify``) and over
``/classify``; a classifier of one label is a cross-encoder for ``LLM.score``, ``/score`` and
``/rerank``; each endpoint refuses a model of the other kind with a 404."""
from __future__ import annotations

import json

import httpx
import pytest
import torch
import transformers

from inflight import LLM, PoolingParams
from inflight.loader.testing import tiny_model, write_tiny_gguf

PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(3 + 17 * i)] for i in range(5)]
SMALL = dict(dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _classifier(root, name: str, num_labels: int, arch: str = "llama"):
    cfg = tiny_model(arch, seed=3).config
    cfg.num_labels, cfg.pad_token_id = num_labels, 0
    cfg.id2label = {i: LABELS[i] for i in range(num_labels)} if num_labels == 3 else {0: "relevant"}
    cfg.label2id = {v: k for k, v in cfg.id2label.items()}
    torch.manual_seed(num_labels)
    cfg.architectures = [cfg.architectures[0].replace("ForCausalLM", "ForSequenceClassification")]
    model = transformers.AutoModelForSequenceClassification.from_config(cfg).eval()
    model.save_pretrained(root / name)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(root, tokenizer, {name: transformers model}) with a 3-label classifier and a cross-encoder."""
    root = tmp_path_factory.mktemp("cls")
    write_tiny_gguf(str(root / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(root, gguf_file="tok.gguf")
    models = {name: _classifier(root, name, n) for name, n in (("three", 3), ("cross", 1))}
    for name in models:
        tok.save_pretrained(root / name)
    return root, tok, models


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("budget", [256, 16])
def test_label_probabilities_equal_transformers(folders, backend, budget):
    root, _, models = folders
    llm = LLM(str(root / "three"), attention_backend=backend, **{**SMALL, "max_num_batched_tokens": budget})
    assert llm.llm_engine.pooler_config.task == "classify"  # the architecture picked pooling by itself
    outs = llm.classify([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        want = torch.softmax(_logits(models["three"], p), -1)
        torch.testing.assert_close(torch.tensor(o.outputs.probs), want, atol=2e-5, rtol=1e-4)
    raw = llm.classify([{"prompt_token_ids": PROMPTS[2]}], pooling_params=PoolingParams(use_activation=False),
                       use_tqdm=False)[0]
    torch.testing.assert_close(torch.tensor(raw.outputs.probs), _logits(models["three"], PROMPTS[2]),
                               atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="serves the pooling task 'classify', not 'embed'"):
        llm.embed("hello")
    with pytest.raises(ValueError, match="generative model"):
        llm.generate("hello")


def test_a_cross_encoder_scores_pairs(folders):
    root, tok, models = folders
    llm = LLM(str(root / "cross"), **SMALL)
    query, docs = "the cat sat", ["a cat sat down", "stock prices fell"]
    want = [torch.sigmoid(_logits(models["cross"], tok(query, text_pair=d).input_ids))[0].item() for d in docs]
    assert [s.outputs.score for s in llm.score(query, docs, use_tqdm=False)] == pytest.approx(want, abs=1e-5)
    three = LLM(str(root / "three"), **SMALL)
    with pytest.raises(ValueError, match="a classifier of one label"):
        three.score(query, docs)


def test_served_classify_score_and_rerank(folders, tmp_path):
    from inflight.entrypoints.openai.server_thread import ServerThread

    root, tok, models = folders
    three = LLM(str(root / "three"), max_model_len=100, **SMALL)
    with ServerThread(three.llm_engine, "cls", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/classify", json={"model": "cls", "input": PROMPTS[:3]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == sum(map(len, PROMPTS[:3]))
        for p, d in zip(PROMPTS, body["data"]):
            want = torch.softmax(_logits(models["three"], p), -1)
            torch.testing.assert_close(torch.tensor(d["probs"]), want, atol=2e-5, rtol=1e-4)
            assert d["num_classes"] == 3 and d["label"] == LABELS[int(want.argmax())]
        raw = h.post("/classify", json={"input": [PROMPTS[1]], "use_activation": False}).json()["data"][0]
        torch.testing.assert_close(torch.tensor(raw["probs"]), _logits(models["three"], PROMPTS[1]),
                                   atol=2e-5, rtol=1e-4)
        assert h.post("/classify", json={"input": [list(range(3, 104))]}).status_code == 400
        assert h.post("/v1/embeddings", json={"input": "hi"}).status_code == 404
        assert h.post("/score", json={"text_1": "a", "text_2": "b"}).status_code == 404  # three labels
    cross = LLM(str(root / "cross"), **SMALL)
    query, docs = "the cat sat", ["a cat sat down", "stock prices fell", "the cat sat"]
    want = [torch.sigmoid(_logits(models["cross"], tok(query, text_pair=d).input_ids))[0].item() for d in docs]
    with ServerThread(cross.llm_engine, "ce", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/v1/score", json={"text_1": query, "text_2": docs}).json()
        assert [d["score"] for d in r["data"]] == pytest.approx(want, abs=1e-5)
        r = h.post("/rerank", json={"query": query, "documents": docs, "top_n": 2}).json()
        assert [x["index"] for x in r["results"]] == sorted(range(3), key=lambda i: -want[i])[:2]
        assert r["usage"]["prompt_tokens"] == sum(len(tok(query, text_pair=d).input_ids) for d in docs)
        assert h.post("/classify", json={"input": "hi"}).status_code == 200
    emb = LLM(str(root / "three"), **SMALL)  # the same folder, asked to embed: its task is the architecture's
    assert emb.llm_engine.pooler_config.task == "classify"


def test_classify_on_an_embedding_model_is_404(folders, tmp_path):
    from inflight.entrypoints.openai.server_thread import ServerThread

    root, tok, _ = folders
    model = tiny_model("llama", seed=2)
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    llm = LLM(str(tmp_path / "lm"), runner="pooling", **SMALL)
    with ServerThread(llm.llm_engine, "emb", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/classify", json={"input": "hello"})
        assert r.status_code == 404 and "not a sequence classifier" in r.json()["error"]["message"]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_other_llama_shaped_classifiers(folders, tmp_path, arch):
    root, tok, _ = folders
    model = _classifier(tmp_path, arch, 3, arch)
    tok.save_pretrained(tmp_path / arch)
    llm = LLM(str(tmp_path / arch), **SMALL)
    for p, o in zip(PROMPTS, llm.classify([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)):
        torch.testing.assert_close(torch.tensor(o.outputs.probs), torch.softmax(_logits(model, p), -1),
                                   atol=2e-5, rtol=1e-4)


# Qwen3-Reranker's recipe in vLLM: the causal LM read as a classifier from two of its tokens
RERANKER = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["n", "y"],
            "is_original_qwen3_reranker": True}


@pytest.mark.parametrize("tie", [True, False])
def test_causal_lm_as_a_reranker_from_two_tokens(tmp_path, folders, tie):
    """hf_overrides with classifier_from_token (Qwen3-Reranker's form): a pair's score is the
    softmax of the causal LM's own "n" and "y" logits at the last token, taken "y"; the head
    is read from the lm_head, or from the embedding where the two are tied."""
    _, tok, _ = folders
    model = tiny_model("qwen3", seed=4, tie=tie).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    no, yes = tok.convert_tokens_to_ids(["n", "y"])
    llm = LLM(str(tmp_path), hf_overrides=RERANKER, **SMALL)
    assert llm.llm_engine.pooler_config.task == "classify" and len(llm.llm_engine.pooler_config.labels) == 1
    query, docs = "the cat sat", ["a cat sat down", "stock prices fell", "cats"]
    with torch.no_grad():
        want = [torch.softmax(model(torch.tensor([tok(query, text_pair=d).input_ids])).logits[0, -1, [no, yes]],
                              -1)[1].item() for d in docs]
    assert [s.outputs.score for s in llm.score(query, docs, use_tqdm=False)] == pytest.approx(want, abs=1e-5)


def test_causal_lm_as_a_classifier_of_its_tokens(tmp_path, folders):
    """method no_post_processing: one label per token, the probabilities the softmax of
    those tokens' logits; bad settings are refused by name."""
    _, tok, _ = folders
    model = tiny_model("llama", seed=5).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    tokens = ["a", "b", "c"]
    overrides = {"architectures": ["LlamaForSequenceClassification"], "classifier_from_token": tokens,
                 "method": "no_post_processing"}
    llm = LLM(str(tmp_path), hf_overrides=json.dumps(overrides), **SMALL)
    ids = tok.convert_tokens_to_ids(tokens)
    for p, o in zip(PROMPTS, llm.classify([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)):
        with torch.no_grad():
            want = torch.softmax(model(torch.tensor([p])).logits[0, -1, ids], -1)
        torch.testing.assert_close(torch.tensor(o.outputs.probs), want, atol=2e-5, rtol=1e-4)
    for bad, match in (({**overrides, "architectures": ["LlamaForCausalLM"]}, "ForSequenceClassification"),
                       ({**overrides, "method": "from_2_way_softmax"}, "two tokens"),
                       ({**overrides, "classifier_from_token": ["a", "not-a-token"]}, "not-a-token"),
                       ({**overrides, "method": "sideways"}, "method must be")):
        with pytest.raises(Exception, match=match):
            LLM(str(tmp_path), hf_overrides=bad, **SMALL)
