"""compare.py's sitting order: by default one server at a time; with --interleave every
server up first, then each workload on each server in turn, the order reversed from one
workload to the next (a host that drifts weighs on both sides of every ratio)."""
import argparse
import importlib.util
import json
import pathlib
import sys

PEERS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "peers"


def load_compare():
    sys.path.insert(0, str(PEERS))  # compare.py imports its neighbours, as a script does
    try:
        spec = importlib.util.spec_from_file_location("compare", PEERS / "compare.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(PEERS))
    return mod


def compare_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


def sitting(interleave: bool, monkeypatch, repeats: int = 1, names=("chat", "decode", "longprompt"),
            out=None, rates=None) -> tuple[list, dict]:
    compare = load_compare()
    events = []

    def start_server(system, args, log_dir, stack):
        events.append(("start", system))
        stack.callback(events.append, ("stop", system))
        return {"url": f"http://{system}", "startup_s": 1.0}

    def run_workload(system, url, name, reqs, args):
        assert url == f"http://{system}"
        events.append((name, system))
        return {"output_throughput": rates[system].pop(0) if rates else 1.0, "ttft_p99_ms": len(events),
                "engine": system}

    monkeypatch.setattr(compare, "start_server", start_server)
    monkeypatch.setattr(compare, "run_workload", run_workload)
    monkeypatch.setattr(compare.time, "sleep", lambda s: None)
    results = {"systems": {}, "workloads": {n: {} for n in names}}
    args = argparse.Namespace(interleave=interleave, idle_after_start=0.0, repeats=repeats, out=out)
    compare.run_sitting(["vllm", "inflight"], args, {n: [] for n in names}, "/tmp", results)
    return events, results


def test_interleaved_sitting_alternates_who_goes_first(monkeypatch):
    events, results = sitting(True, monkeypatch)
    assert events == [("start", "vllm"), ("start", "inflight"),
                      ("chat", "vllm"), ("chat", "inflight"),
                      ("decode", "inflight"), ("decode", "vllm"),
                      ("longprompt", "vllm"), ("longprompt", "inflight"),
                      ("stop", "inflight"), ("stop", "vllm")]
    assert set(results["systems"]) == {"vllm", "inflight"} and "url" not in results["systems"]["vllm"]
    assert all({k for k in per if not k.startswith("ratio")} == {"vllm", "inflight"}
               for per in results["workloads"].values())


def test_repeats_flip_the_order_and_report_each_figure_s_median(monkeypatch, tmp_path):
    out = tmp_path / "sitting.json"
    rates = {"vllm": [100.0, 80.0, 120.0], "inflight": [150.0, 210.0, 160.0]}
    events, results = sitting(True, monkeypatch, repeats=3, names=("decode",), out=str(out), rates=rates)
    assert events[2:-2] == [("decode", "vllm"), ("decode", "inflight"), ("decode", "inflight"), ("decode", "vllm"),
                            ("decode", "vllm"), ("decode", "inflight")]
    per = results["workloads"]["decode"]
    assert per["vllm"]["output_throughput"] == 100.0 and per["inflight"]["output_throughput"] == 160.0
    assert per["vllm"]["ttft_p99_ms"] == 6  # the runs' own values 3, 6 and 7: their median, not the mean
    assert per["inflight"]["repeats"] == 3 and [r["output_throughput"] for r in per["inflight"]["runs"]] == \
        [150.0, 210.0, 160.0]
    assert per["inflight"]["engine"] == "inflight"  # a field alike in every run stays
    assert per["ratio_output_throughput"] == 1.6
    assert per["ratio_output_throughput_runs"] == [1.5, 210.0 / 80.0, 160.0 / 120.0]
    saved = compare_json(out)  # written after every repeat: the last holds all three
    assert saved["workloads"]["decode"]["inflight"]["repeats"] == 3


def test_default_sitting_runs_one_server_at_a_time(monkeypatch):
    events, _ = sitting(False, monkeypatch)
    assert events == [("start", "vllm"), ("chat", "vllm"), ("decode", "vllm"), ("longprompt", "vllm"),
                      ("stop", "vllm"),
                      ("start", "inflight"), ("chat", "inflight"), ("decode", "inflight"),
                      ("longprompt", "inflight"), ("stop", "inflight")]


def test_a_repeat_that_finds_its_prompts_cached_is_flagged(monkeypatch):
    """Repeats of one workload back to back: the server's prefix cache still holds the first
    run's prompts, so the later runs measure a warm cache and say so."""
    compare = load_compare()
    hits = iter([10.0, 10.0, 900.0, 10.0])  # the first run's own sharing, then one warm run

    def run_workload(system, url, name, reqs, args):
        return {"output_throughput": 1.0, "prefix_cache_hit_tokens": next(hits)}

    monkeypatch.setattr(compare, "start_server", lambda system, args, log_dir, stack: {"url": "u", "startup_s": 1})
    monkeypatch.setattr(compare, "run_workload", run_workload)
    monkeypatch.setattr(compare.time, "sleep", lambda s: None)
    results = {"systems": {}, "workloads": {"decode": {}}}
    args = argparse.Namespace(interleave=False, idle_after_start=0.0, repeats=4, out=None)
    compare.run_sitting(["inflight"], args, {"decode": []}, "/tmp", results)
    record = results["workloads"]["decode"]["inflight"]
    assert [r.get("warm_prefix_cache", False) for r in record["runs"]] == [False, False, True, False]
    assert record["warm_prefix_cache_runs"] == 1


def test_default_sitting_repeats_every_workload_on_one_server_before_the_next(monkeypatch):
    rates = {"vllm": [1.0, 2.0, 3.0, 4.0], "inflight": [5.0, 6.0, 7.0, 8.0]}
    events, results = sitting(False, monkeypatch, repeats=2, names=("chat", "decode"), rates=rates)
    assert events == [("start", "vllm"), ("chat", "vllm"), ("decode", "vllm"), ("chat", "vllm"), ("decode", "vllm"),
                      ("stop", "vllm"), ("start", "inflight"), ("chat", "inflight"), ("decode", "inflight"),
                      ("chat", "inflight"), ("decode", "inflight"), ("stop", "inflight")]
    assert results["workloads"]["decode"]["inflight"]["output_throughput"] == 7.0  # the median of 6 and 8


def test_llamacpp_serves_the_embedded_gguf_with_slots_of_the_model_length(monkeypatch):
    compare = load_compare()
    servers = sys.modules["servers"]
    from inflight.loader.api import default_model_path
    monkeypatch.setattr(servers.os, "sched_getaffinity", lambda pid: {0, 1})
    args = argparse.Namespace(llama_server="/opt/llama-server", llamacpp_model=None, llamacpp_parallel=32,
                              llamacpp_args="--temp 0")
    cmd, env = servers.llamacpp_server(args, 8123)
    assert env == {}
    assert cmd[:3] == ["/opt/llama-server", "-m", default_model_path()] and cmd[-2:] == ["--temp", "0"]
    flag = {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("-")}
    assert (flag["--port"], flag["-t"], flag["-tb"], flag["-np"]) == ("8123", "2", "2", "32")
    assert flag["-c"] == str(32 * 4096) and "--no-kv-unified" in cmd  # each slot holds a 4,096-token request
    assert flag["--alias"] == servers.SERVED_NAME
    results = {"workloads": {"chat": {"llamacpp": {"output_throughput": 50.0},
                                      "inflight": {"output_throughput": 75.0}}}}
    compare.add_ratios(results)
    assert results["workloads"]["chat"]["ratio_llamacpp"] == 1.5
    assert "ratio_output_throughput" not in results["workloads"]["chat"]
