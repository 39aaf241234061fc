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
