"""BERT and XLM-RoBERTa encoders served as embedding models (all-MiniLM, bge, e5 and bge-m3
ship as ``BertModel`` / ``XLMRobertaModel``): on tiny random checkpoints the embeddings equal
transformers' (CLS by default, MEAN from a sentence-transformers folder), many prompts of
different lengths in one step; each prompt runs whole (chunked prefill and prefix caching
off, as vLLM does), a prompt over the step's budget is refused by name, and the server
answers ``/v1/embeddings`` on it."""
from __future__ import annotations

import json

import httpx
import pytest
import torch
import torch.nn.functional as F
import transformers

from encoder_models import CONFIGS, distinct, encoder_model, wordpiece_bert
from isa_levels import kernel_test_levels, level_id

from inflight import LLM
from inflight.errors import InvalidRequestError
from inflight.loader.testing import write_tiny_gguf

PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(2 + 23 * i)] for i in range(5)]  # 2 .. 94 tokens
SMALL = dict(dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
@pytest.fixture(scope="module", params=list(CONFIGS))
def encoder(request, tmp_path_factory):
    """(folder, transformers' last hidden states of each prompt)."""
    root = tmp_path_factory.mktemp(request.param)
    write_tiny_gguf(str(root / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(root, gguf_file="tok.gguf")
    model = encoder_model(request.param)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    with torch.no_grad():
        hidden = [model(torch.tensor([p])).last_hidden_state[0] for p in PROMPTS]
    return root / "model", hidden


def _transformers_model(folder):
    return transformers.AutoModel.from_pretrained(folder).eval()


def _embed(llm: LLM, prompts=PROMPTS) -> list[torch.Tensor]:
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    return [torch.tensor(o.outputs.embedding) for o in outs]


def _close(got, want) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w.float(), atol=2e-5, rtol=1e-4, msg=f"prompt {i}")


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_cls_embeddings_equal_transformers(encoder, backend):
    folder, hidden = encoder
    llm = LLM(str(folder), attention_backend=backend, **SMALL)  # runner "auto": an encoder pools by itself
    eng = llm.llm_engine
    assert eng.pooler_config.pooling_type == "CLS" and eng.pooler_config.task == "embed"
    assert not eng.config.scheduler_config.enable_chunked_prefill and not eng.config.cache_config.enable_prefix_caching
    assert eng.runner.kv_caches[0][0].shape[0] == 1  # no KV pool behind the scheduler's blocks
    _close(_embed(llm), [F.normalize(h[0], dim=-1) for h in hidden])
    assert eng.scheduler.kv.usage == 0.0
    # every position the model has (XLM-RoBERTa's start past its padding id: 130 rows, 128 positions)
    assert eng.max_model_len == 128
    longest = [7 + (j * 11) % 250 for j in range(128)]
    with torch.no_grad():
        want = _transformers_model(folder)(torch.tensor([longest])).last_hidden_state[0, 0]
    _close(_embed(llm, [longest]), [F.normalize(want, dim=-1)])
    with pytest.raises(ValueError, match="runner='pooling'"):
        LLM(str(folder), runner="generate", **SMALL)


def test_sentence_transformers_mean_equals_transformers(encoder):
    folder, hidden = encoder
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    try:
        llm = LLM(str(folder), **SMALL)
        assert llm.llm_engine.pooler_config.pooling_type == "MEAN"
        _close(_embed(llm), [F.normalize(h.mean(0), dim=-1) for h in hidden])
    finally:
        (folder / "modules.json").unlink()


def test_prompt_over_the_step_budget_is_refused(encoder):
    folder, hidden = encoder
    llm = LLM(str(folder), **{**SMALL, "max_num_batched_tokens": 64})
    with pytest.raises((ValueError, InvalidRequestError), match="max_num_batched_tokens"):
        _embed(llm, [PROMPTS[-1]])  # 94 tokens: it cannot be split
    _close(_embed(llm, PROMPTS[:3]), [F.normalize(h[0], dim=-1) for h in hidden[:3]])  # and the engine goes on
    assert llm.llm_engine.scheduler.kv.usage == 0.0


def test_served_embeddings(encoder):
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, hidden = encoder
    llm = LLM(str(folder), **SMALL)
    with ServerThread(llm.llm_engine, "enc", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/v1/embeddings", json={"model": "enc", "input": PROMPTS[:3], "encoding_format": "float"})
        assert r.status_code == 200, r.text
        got = [torch.tensor(d["embedding"]) for d in r.json()["data"]]
        _close(got, [F.normalize(x[0], dim=-1) for x in hidden[:3]])
        r = h.post("/v1/chat/completions", json={"model": "enc", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 404


def test_checkpoint_saved_inside_a_task_model_loads(encoder, tmp_path):
    """A BERT saved from BertForMaskedLM: every name under ``bert.``, plus heads an embedding
    model does not run (the masked-LM head, the next-sentence pooler)."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder, hidden = encoder
    copy = tmp_path / "prefixed"
    shutil.copytree(folder, copy)
    tensors = {f"bert.{k}": v for k, v in load_file(str(folder / "model.safetensors")).items()}
    tensors["cls.predictions.bias"] = torch.zeros(261)
    save_file(tensors, str(copy / "model.safetensors"))
    assert any(k.startswith("bert.pooler.") for k in tensors)
    llm = LLM(str(copy), **SMALL)
    _close(_embed(llm, PROMPTS[:2]), [F.normalize(h[0], dim=-1) for h in hidden[:2]])


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    """(folder, tokenizer, transformers' model) of a one-label XLMRobertaForSequenceClassification:
    bge-reranker's form."""
    root = tmp_path_factory.mktemp("reranker")
    write_tiny_gguf(str(root / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(root, gguf_file="tok.gguf")
    cfg = encoder_model("xlm-roberta").config
    # one token type, as XLM-RoBERTa ships: its pairs carry none
    cfg.num_labels, cfg.architectures, cfg.type_vocab_size = 1, ["XLMRobertaForSequenceClassification"], 1
    torch.manual_seed(3)
    model = transformers.XLMRobertaForSequenceClassification(cfg).eval()
    distinct(model)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model", tok, model


def test_xlm_roberta_cross_encoder_equals_transformers(reranker):
    folder, tok, model = reranker
    llm = LLM(str(folder), **SMALL)
    assert llm.llm_engine.pooler_config.task == "classify" and not llm.llm_engine.pooler_config.token_types
    outs = llm.classify([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)
    with torch.no_grad():
        want = [torch.sigmoid(model(torch.tensor([p])).logits[0]) for p in PROMPTS]
    _close([torch.tensor(o.outputs.probs) for o in outs], want)
    query, docs = "where is the lighthouse", ["on the rock", "in the harbour at dawn"]
    scores = [o.outputs.score for o in llm.score(query, docs, use_tqdm=False)]
    for doc, got in zip(docs, scores):
        ids = tok(query, text_pair=doc)["input_ids"]
        with torch.no_grad():
            assert got == pytest.approx(torch.sigmoid(model(torch.tensor([ids])).logits[0, 0]).item(), abs=2e-5)
    with pytest.raises(ValueError, match="pooling_type must be CLS"):
        LLM(str(folder), pooler_config={"pooling_type": "MEAN"}, **SMALL)


@pytest.fixture(scope="module")
def bert_cross_encoder(tmp_path_factory):
    """(folder, tokenizer, transformers' model) of a one-label BertForSequenceClassification with
    a WordPiece tokenizer, whose pairs carry token types (ms-marco-MiniLM's form)."""
    return wordpiece_bert(tmp_path_factory.mktemp("bert-ce"), cross_encoder=True)


def test_bert_cross_encoder_reads_token_types(bert_cross_encoder):
    """LLM.score and /rerank give transformers' scores of (query, document) pairs, each pair
    read with the tokenizer's token types; the prompts carry them, so a plain prompt's
    ids past the vocabulary are still refused."""
    from inflight.entrypoints.openai.server_thread import ServerThread

    folder, tok, model = bert_cross_encoder
    llm = LLM(str(folder), **SMALL)
    assert llm.llm_engine.pooler_config.token_types
    query, docs = "where is the lighthouse", ["on the rock", "in the harbour at dawn", "keeper light"]
    want = []
    for doc in docs:
        enc = tok(query, text_pair=doc, return_tensors="pt")
        assert enc["token_type_ids"].max() == 1
        with torch.no_grad():
            want.append(torch.sigmoid(model(**enc).logits[0, 0]).item())
    got = [o.outputs.score for o in llm.score(query, docs, use_tqdm=False)]
    assert got == pytest.approx(want, abs=2e-5)
    with ServerThread(llm.llm_engine, "ce", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/rerank", json={"model": "ce", "query": query, "documents": docs})
        assert r.status_code == 200, r.text
        served = {d["index"]: d["relevance_score"] for d in r.json()["results"]}
        assert [served[i] for i in range(len(docs))] == pytest.approx(want, abs=2e-5)
        r = h.post("/classify", json={"model": "ce", "input": [[2, 5, 7, 3, 10 ** 6]]})
        assert r.status_code == 400


@pytest.mark.parametrize("tiles", [False, True], ids=["dot-product", "tiles"])
def test_encoder_attention_bf16_path_equals_sdpa(tiles, monkeypatch):
    """The CPU's bf16 path gives float32 SDPA's rows, per request, to bf16 rounding, whether the
    step runs in the C kernel (a CPU with AMX tiles) or in torch (batched GEMMs around softmax,
    SDPA for the short requests); a request not whole in the step is refused."""
    from inflight.attention.base import AttentionMetadata
    from inflight.kernels.cpu.encoder_attention import load_encoder_attention
    from inflight.layers import encoder_attention
    from inflight.layers.encoder_attention import EncoderAttention

    kernel = load_encoder_attention()
    assert kernel is not None
    kernel.tiles = tiles  # whether the layer takes it; its products are this CPU's either way
    monkeypatch.setattr(encoder_attention, "cpu_encoder_attention", lambda: kernel)

    lens = [5, 130, 37]
    qsl = [0, 5, 135, 172]
    md = AttentionMetadata(slot_mapping=torch.zeros(0), block_tables=torch.zeros(0), seq_lens=torch.tensor(lens),
                           query_start_loc_list=qsl, seq_lens_list=lens, num_decodes=0, block_size=16)
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 172, 32) for _ in range(3))
    op = EncoderAttention()
    want = op(q, k, v, md)
    for s, e in zip(qsl, qsl[1:]):  # each request alone, both ways
        ref = F.scaled_dot_product_attention(q[None, :, s:e], k[None, :, s:e], v[None, :, s:e])[0]
        torch.testing.assert_close(want[s:e], ref.transpose(0, 1).reshape(e - s, -1))
    op.dispatch_to("cpu")
    got = op(q.bfloat16(), k.bfloat16(), v.bfloat16(), md)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    md.seq_lens_list = [5, 140, 37]  # the second request has 10 tokens before this step
    for dtype in (torch.float32, torch.bfloat16):  # torch's path and the C kernel's
        with pytest.raises(RuntimeError, match="whole in one step"):
            op(q.to(dtype), k.to(dtype), v.to(dtype), md)


ENCODER_LEVELS = [pytest.param(lv, id=level_id(lv)) for lv in kernel_test_levels()]


@pytest.mark.parametrize("level", ENCODER_LEVELS)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 64), (12, 12, 32), (6, 2, 96)])
def test_encoder_attention_kernel_sees_every_row_of_its_request_on_every_level(level, heads, kv_heads, head_dim):
    """The C kernel reads q, k and v in place from one fused qkv output, as BERT hands them over,
    and each row attends over every row of its request, both ways (float32 SDPA's rows to bf16
    rounding), on every ISA level; a lone token and a request of one row included."""
    from inflight.kernels.cpu.encoder_attention import load_encoder_attention

    kernel = load_encoder_attention(level)
    assert kernel is not None
    lens = [1, 5, 70, 130]
    starts = [sum(lens[:i]) for i in range(len(lens))]
    torch.manual_seed(1)
    qkv = torch.randn(sum(lens), heads + 2 * kv_heads, head_dim).bfloat16()
    q, k, v = (t.transpose(0, 1) for t in qkv.split([heads, kv_heads, kv_heads], dim=1))  # [H, T, D] views
    assert kernel.supports(q, k)
    got = kernel(q, k, v, starts, lens, head_dim ** -0.5).float()
    for s, n in zip(starts, lens):
        qf, kf, vf = (t[:, s:s + n].float() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qf[None], kf[None], vf[None], enable_gqa=True)[0]
        torch.testing.assert_close(got[s:s + n], ref.transpose(0, 1).reshape(n, -1), atol=2e-2, rtol=2e-2)


def test_bf16_embeddings_stay_near_float32(encoder):
    """In bf16 on the CPU (the fused add+LayerNorm; the C attention where the build has AMX
    tiles) the embeddings stay within bf16's reach of transformers' float32 ones."""
    folder, hidden = encoder
    llm = LLM(str(folder), **{**SMALL, "dtype": "bfloat16"})
    cos = [F.cosine_similarity(g, F.normalize(h[0], dim=-1), dim=0).item() for g, h in zip(_embed(llm), hidden)]
    assert min(cos) > 0.999, cos
