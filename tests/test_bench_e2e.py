"""`inflight bench throughput` (and `bench serve`, against the real server) on the
embedded SmolLM2-135M: a few tiny requests, exact output token counts."""
from __future__ import annotations

import json

import pytest

from inflight.entrypoints.cli import main

pytestmark = pytest.mark.slow

MAX_TOKENS = [3, 7, 2, 5]


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "tiny.jsonl"
    prompts = ["The capital of France is", "One two three", "Hello", "Write a short poem about the sea"]
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": p, "max_tokens": n}) + "\n"
                            for i, (p, n) in enumerate(zip(prompts, MAX_TOKENS))))
    return path


def test_bench_throughput_continuous_vs_static(workload, tmp_path, capsys):
    out = tmp_path / "tp.json"
    rc = main(["bench", "throughput", "--workload-file", str(workload), "--modes", "continuous,static",
               "--max-num-seqs", "2", "--kv-cache-memory", str(64 * 2**20), "--warmup-requests", "1",
               "--disable-tqdm", "--result-file", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    cont, static = report["runs"]
    assert (cont["label"], static["label"]) == ("continuous", "static")
    assert static["config"]["scheduling"] == "static" and cont["config"]["scheduling"] == "continuous"
    for run in (cont, static):
        assert [r["output_tokens"] for r in run["requests"]] == MAX_TOKENS
        assert all(r["success"] and 0 < r["ttft"] <= r["e2e"] for r in run["requests"])
        s = run["summary"]
        assert s["completed"] == 4 and s["failed"] == 0 and s["exact_output_tokens"] == 1
        assert s["total_output_tokens"] == sum(MAX_TOKENS) and s["output_throughput"] > 0
    # Static hands a batch back only when its longest member ends: with two slots,
    # the 3- and 7-token requests finish together, and the 7-token one gates them.
    def end(r):
        return r["start"] + r["e2e"]

    t = {r["id"]: r for r in static["requests"]}
    assert end(t["t0"]) == pytest.approx(end(t["t1"]), abs=1e-6)
    assert t["t0"]["ttft"] == pytest.approx(t["t0"]["e2e"], abs=1e-6)
    assert end(t["t2"]) > end(t["t1"])  # the next batch starts only then
    c = {r["id"]: r for r in cont["requests"]}
    assert end(c["t0"]) < end(c["t1"])  # continuous: the short one leaves first
    assert "ratio" in capsys.readouterr().out


def test_bench_serve_against_the_real_server():
    """Six tiny requests through `inflight serve` (in-process): every metric present and
    plausible, token counts exact, goodput counts only requests within both SLOs."""
    from inflight.bench.client import ClientConfig
    from inflight.bench.metrics import RequestRecord, meets_slo
    from inflight.bench.serve import bench_once
    from inflight.bench.workload import WorkloadRequest
    from inflight.engine.llm_engine import LLMEngine
    from inflight.entrypoints.openai.server_thread import ServerThread

    engine = LLMEngine.from_kwargs(dtype="float32", kv_cache_memory=64 * 2**20, max_num_seqs=4)
    work = [WorkloadRequest(f"s{i}", f"Count to {i}:", -1, n) for i, n in enumerate([4, 9, 2, 6, 1, 5])]
    with ServerThread(engine, "smollm2", log_stats=False) as srv:
        cfg = ClientConfig(base_url=srv.base_url, show_progress=False, warmup_requests=1)
        first = bench_once(cfg, work, "probe")
        # SLOs at the median TTFT and TPOT: some requests meet both, some do not.
        slo = {"ttft": first["summary"]["ttft_p50_ms"], "tpot": first["summary"]["tpot_p50_ms"]}
        run = bench_once(cfg, work, "real", slo)
    assert run["config"]["model"] == "smollm2"  # resolved from /v1/models
    recs = [RequestRecord.from_dict(r) for r in run["requests"]]
    assert [r.output_tokens for r in recs] == [4, 9, 2, 6, 1, 5]
    for r in recs:
        assert r.success and r.prompt_tokens > 0 and 0 < r.ttft <= r.e2e
        assert len(r.itl) <= r.output_tokens - 1
    s = run["summary"]
    assert s["completed"] == 6 and s["failed"] == 0 and s["total_output_tokens"] == 27
    for key in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < s[f"{key}_p50_ms"] <= s[f"{key}_p99_ms"]
    assert s["ttft_p99_ms"] <= s["e2el_p99_ms"]
    assert s["good_requests"] == sum(meets_slo(r, slo) for r in recs)
    assert s["goodput"] == pytest.approx(s["good_requests"] / s["duration_s"])
