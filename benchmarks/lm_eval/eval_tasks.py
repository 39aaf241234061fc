"""lm-evaluation-harness against `inflight serve`, and lm-eval's own `hf` model on the
same weights, on the local tasks in tasks/ (no dataset download).

    .venv/bin/python benchmarks/lm_eval/eval_tasks.py [--limit N] [--hf-folder DIR] [--out FILE]

Starts `inflight serve --dtype float32` on a free port, runs `local-completions`
(loglikelihood: echo + logprobs) on inflight_mc, then `hf` (float32) on the HF
folder that benchmarks/peers/make_hf_folder.py writes (made here when missing),
and prints both accuracies; with --chat, also `local-chat-completions` against
`hf` with the chat template on the generate-until task inflight_gen. The two
must agree: the server runs the same float32 weights.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Optional

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = os.path.join(HERE, "tasks")
sys.path.insert(0, os.path.join(HERE, "..", "peers"))
from make_hf_folder import DEFAULT_OUT as DEFAULT_HF_FOLDER, make_hf_folder  # noqa: E402

MODEL = "smollm2"


def hf_folder(path: str = DEFAULT_HF_FOLDER) -> str:
    """The float32 HF folder of the embedded model, written on first use."""
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        make_hf_folder(path)
    return path


def evaluate(model: str, model_args: dict[str, Any], task: str, limit: Optional[int] = None,
             batch_size: int = 16, **kwargs: Any) -> dict[str, Any]:
    """lm_eval.simple_evaluate on one local task; returns its full result dict (samples included)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    args = ",".join(f"{k}={v}" for k, v in model_args.items())
    return lm_eval.simple_evaluate(model=model, model_args=args, tasks=[task], limit=limit,
                                   task_manager=TaskManager(include_path=TASKS, include_defaults=False),
                                   batch_size=batch_size,
                                   log_samples=True, **kwargs)


def server_args(base_url: str, endpoint: str, folder: str) -> dict[str, Any]:
    """local-completions / local-chat-completions arguments: lm-eval tokenizes with the same tokenizer."""
    return {"model": MODEL, "base_url": f"{base_url}/v1/{endpoint}", "tokenizer": folder,
            "num_concurrent": 4, "max_retries": 1}


def hf_args(folder: str) -> dict[str, Any]:
    return {"pretrained": folder, "dtype": "float32", "device": "cpu"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(timeout: float = 300.0) -> tuple[subprocess.Popen, str]:
    """`inflight serve --dtype float32` on a free port; returns (process, base URL) once healthy."""
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "inflight")
    proc = subprocess.Popen([exe, "serve", "--dtype", "float32", "--port", str(port),
                             "--served-model-name", MODEL])
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"inflight serve exited with {proc.returncode}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise TimeoutError("inflight serve did not become healthy")


def metrics(result: dict[str, Any], task: str) -> dict[str, float]:
    return {k.split(",")[0]: v for k, v in result["results"][task].items()
            if isinstance(v, float) and "stderr" not in k}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="questions per task (default: all)")
    ap.add_argument("--hf-folder", default=DEFAULT_HF_FOLDER)
    ap.add_argument("--chat", action="store_true", help="also local-chat-completions on inflight_gen")
    ap.add_argument("--out", default=None, help="write the accuracies here as JSON")
    args = ap.parse_args()
    folder = hf_folder(args.hf_folder)
    proc, base = start_server()
    runs: dict[str, dict[str, float]] = {}
    try:
        t0 = time.time()
        res = evaluate("local-completions", server_args(base, "completions", folder), "inflight_mc", args.limit)
        runs["inflight local-completions inflight_mc"] = {**metrics(res, "inflight_mc"), "seconds": time.time() - t0}
        if args.chat:
            t0 = time.time()
            res = evaluate("local-chat-completions", server_args(base, "chat/completions", folder), "inflight_gen",
                           args.limit, batch_size=1, apply_chat_template=True)
            runs["inflight local-chat-completions inflight_gen"] = {**metrics(res, "inflight_gen"),
                                                                    "seconds": time.time() - t0}
    finally:
        proc.terminate()
        proc.wait(30)
    t0 = time.time()
    res = evaluate("hf", hf_args(folder), "inflight_mc", args.limit)
    runs["hf inflight_mc"] = {**metrics(res, "inflight_mc"), "seconds": time.time() - t0}
    if args.chat:
        t0 = time.time()
        res = evaluate("hf", hf_args(folder), "inflight_gen", args.limit, apply_chat_template=True)
        runs["hf inflight_gen"] = {**metrics(res, "inflight_gen"), "seconds": time.time() - t0}
    for name, m in runs.items():
        print(f"{name:48s} " + "  ".join(f"{k} {v:.4f}" for k, v in m.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
