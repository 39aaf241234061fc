"""lm-evaluation-harness against the server, with lm-eval's own `hf` model on the same
float32 weights as the reference: the local tasks of benchmarks/lm_eval/tasks, a
few questions each (benchmarks/lm_eval/eval_tasks.py runs them whole against `inflight serve`).
"""
from __future__ import annotations

import contextlib
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "lm_eval"))
lm_eval_run = pytest.importorskip("eval_tasks")
pytest.importorskip("lm_eval")

MC_LIMIT, GEN_LIMIT = 10, 3


@contextlib.contextmanager
def one_torch_thread():
    """hf's decode steps (3 rows of a 135M model) are too small to split: on a busy machine
    the threads' barriers cost several times the work (70 s against 17 s here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def folder():
    return lm_eval_run.hf_folder()


@pytest.fixture(scope="module")
def server():
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread

    engine = LLMEngine.from_kwargs(dtype="float32", kv_cache_memory=64 * 2**20)
    with ServerThread(engine, lm_eval_run.MODEL, log_stats=False) as srv:
        yield srv


def _per_sample(result: dict, task: str) -> list:
    return [s["filtered_resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def test_local_completions_loglikelihoods_equal_hf(server, folder):
    """Multiple choice through echo + logprobs: every choice's loglikelihood within 1e-3
    of transformers', the same greedy flags, the same accuracies."""
    ours = lm_eval_run.evaluate("local-completions", lm_eval_run.server_args(server.base_url, "completions", folder),
                                "inflight_mc", MC_LIMIT)
    ref = lm_eval_run.evaluate("hf", lm_eval_run.hf_args(folder), "inflight_mc", MC_LIMIT)
    a, b = _per_sample(ours, "inflight_mc"), _per_sample(ref, "inflight_mc")
    assert len(a) == len(b) == MC_LIMIT
    for doc_a, doc_b in zip(a, b):
        assert len(doc_a) == len(doc_b) == 4
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(doc_a, doc_b):
            assert abs(ll_a - ll_b) < 1e-3 and greedy_a == greedy_b
    assert lm_eval_run.metrics(ours, "inflight_mc") == lm_eval_run.metrics(ref, "inflight_mc")


def test_local_chat_completions_generations_equal_hf(server, folder):
    """generate_until through the chat template: the same greedy replies as hf --apply_chat_template."""
    ours = lm_eval_run.evaluate("local-chat-completions",
                                lm_eval_run.server_args(server.base_url, "chat/completions", folder),
                                "inflight_gen", GEN_LIMIT, batch_size=1, apply_chat_template=True)
    with one_torch_thread():
        ref = lm_eval_run.evaluate("hf", lm_eval_run.hf_args(folder), "inflight_gen", GEN_LIMIT,
                                   apply_chat_template=True)
    replies = _per_sample(ours, "inflight_gen")
    assert replies == _per_sample(ref, "inflight_gen") and all(r[0] for r in replies)
