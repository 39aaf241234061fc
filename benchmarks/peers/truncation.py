"""`truncate_prompt_tokens` on a pooling model, inflight against vLLM's CPU build: the same
requests to both servers, the scores and prompt token counts compared.

    .venv/bin/python benchmarks/peers/make_bert_folder.py --reranker bert
    .venv/bin/python benchmarks/peers/truncation.py [--out benchmarks/results/peers_vllm_truncation.json]

The model is make_bert_folder.py's BERT cross-encoder (WordPiece, [CLS] ... [SEP] ... [SEP],
token types), where the side a prompt is cut on changes the answer: a CLS-pooled model that
lost [CLS], or a cross-encoder that lost its query, still answers, with other numbers. Cases:
/rerank, /score and /classify with texts cut by the tokenizer, /classify with token ids, and
each with vLLM's `truncation_side` request field. Exits 1 when a case differs.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import httpx  # noqa: E402

from embeddings import report, sitting_args, sitting_parser, start_servers  # noqa: E402
from make_bert_folder import RERANKER_OUT  # noqa: E402
from inflight.bench.common import machine_info  # noqa: E402
from servers import SERVED_NAME, cpu_facts  # noqa: E402

QUERY = "which ocean is the largest on earth"
DOCS = ["the pacific ocean is the largest and deepest of the five oceanic divisions on earth " * 4,
        "mountains rise where plates collide and the himalayas are the highest range " * 4,
        "a short one"]


def cases() -> list[tuple[str, str, dict]]:
    """(name, path, body) of every request; 24 tokens cut every text above it."""
    ids = list(range(1000, 1060))
    out = []
    for side in (None, "left", "right"):
        extra = {"truncate_prompt_tokens": 24, **({"truncation_side": side} if side else {})}
        tag = f" side={side}" if side else ""
        out += [(f"rerank{tag}", "/rerank", {"query": QUERY, "documents": DOCS, **extra}),
                (f"score{tag}", "/score", {"text_1": QUERY, "text_2": DOCS, **extra}),
                (f"classify{tag}", "/classify", {"input": DOCS, **extra}),
                (f"classify ids{tag}", "/classify", {"input": ids, **extra})]
    return out


def answer(client: httpx.Client, path: str, body: dict) -> dict:
    """The numbers a case compares: the scores (or the error's status) and the prompt tokens."""
    r = client.post(path, json={"model": SERVED_NAME, **body})
    if r.status_code != 200:
        return {"status": r.status_code, "error": r.text[:300]}
    j = r.json()
    if path == "/rerank":
        values = [x["relevance_score"] for x in sorted(j["results"], key=lambda x: x["index"])]
    elif path == "/score":
        values = [x["score"] for x in j["data"]]
    else:
        values = [v for x in j["data"] for v in x["probs"]]
    return {"status": 200, "values": values, "prompt_tokens": j["usage"]["prompt_tokens"]}


def compare(a: dict, b: dict) -> tuple[bool, float]:
    """Whether two answers agree (status, token count, values within 1e-3), and the largest difference."""
    if a["status"] != b["status"] or a["status"] != 200:
        return a["status"] == b["status"], 0.0
    diff = max((abs(x - y) for x, y in zip(a["values"], b["values"])), default=0.0)
    same = len(a["values"]) == len(b["values"]) and a["prompt_tokens"] == b["prompt_tokens"] and diff <= 1e-3
    return same, diff


def main() -> int:
    ap = sitting_parser(__doc__)
    ap.add_argument("--reranker-folder", default=RERANKER_OUT.format(arch="bert"))
    args = sitting_args(ap)
    args.hf_folder = args.inflight_model = args.reranker_folder
    args.vllm_args += " --max-model-len 512"
    results: dict = {"argv": sys.argv, "cpu": cpu_facts(), "machine": machine_info(), "systems": {}, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log_dir = os.path.splitext(os.path.abspath(args.out))[0] + "-logs" if args.out else tmp
        os.makedirs(log_dir, exist_ok=True)
        urls = start_servers(args, log_dir, stack, results)
        clients = {s: stack.enter_context(httpx.Client(base_url=u, timeout=600)) for s, u in urls.items()}
        for name, path, body in cases():
            results["cases"][name] = {s: answer(c, path, body) for s, c in clients.items()}
    failed = 0
    for name, got in results["cases"].items():
        if len(got) == 2:
            same, diff = compare(*got.values())
            got["agree"], got["max_difference"] = same, diff
            failed += not same
            print(f"{name:24} {'agree' if same else 'DIFFER'}  max diff {diff:.2e}  "
                  + "  ".join(f"{s}: {a['status']} {a.get('prompt_tokens', a.get('error', ''))}" for s, a in got.items()
                              if s in urls))
    report(results, args.out, ("cases",))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
