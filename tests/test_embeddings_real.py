"""The embedded SmolLM2 served as an embedding model: its last-token embeddings equal
transformers' final hidden states in float32, offline and over /v1/embeddings, including
vLLM's chat form (the conversation rendered with the model's chat template)."""
from __future__ import annotations

import httpx
import pytest
import torch
import torch.nn.functional as F

from hf_reference import load_hf_reference
from inflight import LLM

pytestmark = pytest.mark.slow

TEXTS = ["The capital of France is", "Embeddings turn text into vectors.", "a"]
MESSAGES = [{"role": "system", "content": "Represent the question for retrieval."},
            {"role": "user", "content": "What is the tallest mountain on Earth?"}]


@pytest.fixture(scope="module")
def llm():
    return LLM(runner="pooling", dtype="float32", kv_cache_memory=64 << 20, max_model_len=512)


def _reference(ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return F.normalize(load_hf_reference().model(torch.tensor([ids])).last_hidden_state[0, -1], dim=-1)


def test_embeddings_equal_transformers(llm):
    assert llm.llm_engine.runner.model.lm_head is None  # tied, and no packed copy for logits nobody computes
    outs = llm.embed(TEXTS, use_tqdm=False)
    for text, out in zip(TEXTS, outs):
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), _reference(out.prompt_token_ids),
                                   atol=1e-4, rtol=1e-3, msg=text)


def test_served_chat_form_embeds_the_rendered_conversation(llm):
    from inflight.entrypoints.openai.server_thread import ServerThread

    tok = llm.get_tokenizer()
    ids = tok(tok.apply_chat_template(MESSAGES, tokenize=False), add_special_tokens=False).input_ids
    with ServerThread(llm.llm_engine, "smol", log_stats=False) as srv, httpx.Client(base_url=srv.base_url) as h:
        r = h.post("/v1/embeddings", json={"model": "smol", "messages": MESSAGES})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        got = torch.tensor(r.json()["data"][0]["embedding"])
    torch.testing.assert_close(got, _reference(ids), atol=1e-4, rtol=1e-3)
