"""The benchmarks' MFU leaves out prompt tokens a prefix cache served: those counts come from
each server's /metrics, in inflight's names and in vLLM's."""
import importlib.util
import pathlib
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

CPU_SERVING = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "cpu_serving.py"

VLLM_METRICS = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 392.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7962385750292048e+09
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 5.0
"""
INFLIGHT_METRICS = """\
# TYPE inflight:prefix_cache_hits_total counter
inflight:prefix_cache_queries_total{engine="0"} 900.0
inflight:prefix_cache_hits_total{engine="0"} 512.0
inflight:prefix_cache_hits_total{engine="1"} 64.0
"""


@pytest.fixture
def metrics_server():
    """A /metrics endpoint that answers whatever text the test sets."""
    body = {"text": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield body, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def load_cpu_serving():
    spec = importlib.util.spec_from_file_location("cpu_serving", CPU_SERVING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("text, hits", [(VLLM_METRICS, 128.0), (INFLIGHT_METRICS, 576.0), ("", 0.0)],
                         ids=["vllm", "inflight-two-engines", "no-counter"])
def test_prefix_cache_hits_read_from_either_server(metrics_server, text, hits):
    body, url = metrics_server
    body["text"] = text
    assert load_cpu_serving().prefix_cache_hits(url) == hits


# SmolLM2-135M's shape: 30 layers, 9 query heads and 3 KV heads of 64, MLP 1,536, vocab 49,152
SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "vocab_size": 49152}
LAYERS = 2 * 30 * (576 * 15 * 64 + 9 * 64 * 576 + 3 * 576 * 1536)  # projections, per token
LM_HEAD = 2 * 49152 * 576
ATTENTION = 4 * 30 * 9 * 64  # QK^T and PV, per key a token reads


def test_flops_per_token_counts_every_parameter():
    assert load_cpu_serving().flops_per_token(SMOLLM2) == LAYERS + LM_HEAD


def test_needed_flops_count_lm_head_per_sampled_token_and_attention_per_key():
    needed = load_cpu_serving().needed_flops
    # one prompt token, one output token: the prompt's forward, logits once, one key
    assert needed(SMOLLM2, [(1, 1)], 0) == LAYERS + LM_HEAD + ATTENTION
    # 3 prompt tokens, 2 output: positions 0-3 computed (the last output token is never fed
    # back), reading 1 + 2 + 3 + 4 keys; logits for the 2 sampled tokens only
    assert needed(SMOLLM2, [(3, 2)], 0) == 4 * LAYERS + 2 * LM_HEAD + 10 * ATTENTION
    # 4 hits over two requests: each one's first 2 prompt tokens were cached
    assert needed(SMOLLM2, [(4, 1), (3, 2)], 4) == (2 + 2) * LAYERS + 3 * LM_HEAD + ((3 + 4) + (3 + 4)) * ATTENTION


def test_mfu_leaves_out_cached_tokens_and_takes_the_higher_peak():
    cpu_serving = load_cpu_serving()
    # 1 + 3 prompt tokens, 1 + 2 out, 2 of them from the prefix cache, in 2 s, bursts of 1 and 2 GFLOP/s
    s = {"total_input_tokens": 4, "total_output_tokens": 3, "duration_s": 2.0}
    cpu_serving.add_mfu(s, 2, [1.0, 2.0], 1e9, SMOLLM2, [(1, 1), (3, 2)])
    assert s["tokens_processed"] == 5 and s["matmul_peak_gflops"] == 2.0
    assert s["mfu"] == pytest.approx(5 * 1e9 / 2.0 / 2e9)
    assert s["mfu_needed"] == pytest.approx(cpu_serving.needed_flops(SMOLLM2, [(1, 1), (3, 2)], 2) / 2.0 / 2e9)
    unknown = {"total_input_tokens": 4, "total_output_tokens": 3, "duration_s": 2.0}
    cpu_serving.add_mfu(unknown, 0, [2.0], 1e9, SMOLLM2, [(-1, 1)])  # a prompt of unknown length
    assert unknown["mfu"] == pytest.approx(7 / 4) and "mfu_needed" not in unknown


def test_repeated_runs_report_medians_and_every_failure():
    median_summary = load_cpu_serving().median_summary
    runs = [{"output_throughput": 100.0, "ttft_p99_ms": 900.0, "failed": 0, "engine": "x", "bursts": [1.0]},
            {"output_throughput": 300.0, "ttft_p99_ms": 100.0, "failed": 2, "engine": "x", "bursts": [2.0]},
            {"output_throughput": 120.0, "ttft_p99_ms": 500.0, "failed": 0, "engine": "x", "bursts": [3.0]}]
    s = median_summary(runs)
    assert (s["output_throughput"], s["ttft_p99_ms"]) == (120.0, 500.0)  # each figure's own median
    assert s["failed"] == 2  # a median of the runs' failures would read 0
    assert s["engine"] == "x" and "bursts" not in s  # kept where alike, else left to the runs
    assert s["repeats"] == 3 and s["runs"] == runs
    assert median_summary(runs[:1]) is runs[0]
