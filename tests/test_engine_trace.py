"""--trace-file from a real engine run: one JSON line per step, readable by `inflight trace view`."""
import json

import pytest

from inflight import LLM, SamplingParams
from inflight.entrypoints.cli import main as cli_main

pytestmark = pytest.mark.slow


def test_engine_trace_records_steps_and_renders(tmp_path):
    trace = tmp_path / "trace.jsonl"
    llm = LLM(dtype="float32", kv_cache_memory=16 * 2**20, max_num_batched_tokens=8, max_model_len=128,
              trace_file=str(trace))
    outs = llm.generate(["The capital of France is", "One, two, three,"],
                        SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    llm.llm_engine.shutdown()  # closes the trace file
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    for s in steps:
        assert s["num_tokens"] == sum(r["num_tokens"] for r in s["requests"]) <= 8
        assert s["kv_blocks_used"] + s["kv_blocks_free"] == llm.llm_engine.num_blocks
    kinds = {(r["id"], r["kind"]) for s in steps for r in s["requests"]}
    assert {k for _, k in kinds} == {"prefill", "decode"}
    # Per request, the tokens computed over all steps are its prompt plus every output
    # token but the last (sampled at the end, never fed back).
    for o in outs:
        computed = sum(r["num_tokens"] for s in steps for r in s["requests"] if r["id"] == o.request_id)
        assert computed == len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1
    decodes = sum(1 for s in steps for r in s["requests"] if r["kind"] == "decode")
    assert decodes == sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    assert sorted(f for s in steps for f in s["finished"]) == ["0", "1"]
    page = tmp_path / "page.html"
    assert cli_main(["trace", "view", str(trace), "--out", str(page)]) == 0
    html = page.read_text()
    assert "<script" in html and "http://" not in html and "https://" not in html
