"""`inflight bench sweep`: CSV and plots from a synthetic result set, the CLI wiring,
and one whole sweep against a fake server subprocess (no model)."""
from __future__ import annotations

import csv
import json
import random
import sys
import textwrap

import pytest

from inflight.bench.common import make_run
from inflight.bench.metrics import RequestRecord, summarize
from inflight.bench.plots import compare_groups, knee_series, plot_all
from inflight.bench.sweep import pick_max_num_seqs, write_csv
from inflight.entrypoints.cli import build_parser, main

PNG = b"\x89PNG\r\n\x1a\n"


def synthetic_run(scheduling: str, mns: int, rate: float = float("inf"), n: int = 20) -> dict:
    """A run whose throughput saturates and TPOT grows with max_num_seqs (a knee at 16)."""
    rng = random.Random(mns)
    step = 0.02 * (1 + mns / 16)  # seconds per step
    recs = []
    for i in range(n):
        out = rng.randint(5, 50)
        start = 0.0 if rate == float("inf") else i / rate
        wait = (i // mns) * 50 * step
        ttft = wait + step if scheduling == "continuous" else wait + 50 * step
        e2e = ttft + (out - 1) * step if scheduling == "continuous" else ttft
        recs.append(RequestRecord(f"r{i}", 10, out, out, True, "", start, ttft, e2e, [step] * (out - 1)))
    duration = max(r.end for r in recs)
    server = {"scheduling": scheduling, "max_num_seqs": mns, "request_rate": rate}
    return make_run(f"{scheduling} mns={mns}", "serve", {"server": server},
                    summarize(recs, duration, {"tpot": 40}), recs)


@pytest.fixture
def runs():
    return [synthetic_run(s, m) for s in ("continuous", "static") for m in (1, 4, 16, 64)]


def test_csv_has_one_row_per_setting(runs, tmp_path):
    path = write_csv(runs, str(tmp_path / "sweep.csv"))
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert [r["max_num_seqs"] for r in rows[:4]] == ["1", "4", "16", "64"]
    assert {r["scheduling"] for r in rows} == {"continuous", "static"}
    for row, run in zip(rows, runs):
        assert float(row["output_throughput"]) == pytest.approx(run["summary"]["output_throughput"])
        assert float(row["tpot_p99_ms"]) == pytest.approx(run["summary"]["tpot_p99_ms"])
        assert row["request_rate"] == "inf" and "goodput" in row


def test_plots_are_valid_pngs(runs, tmp_path):
    assert list(knee_series(runs)) == ["continuous, all at once", "static, all at once"]
    assert len(compare_groups(runs)) == 4  # static vs continuous at each max_num_seqs
    paths = plot_all(runs, str(tmp_path), tpot_slo_ms=40)
    names = sorted(p.rsplit("/", 1)[1] for p in paths)
    assert names == ["compare_mns16_rateall.png", "compare_mns1_rateall.png", "compare_mns4_rateall.png",
                     "compare_mns64_rateall.png", "knee.png"]
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        assert data.startswith(PNG) and len(data) > 10_000
    # Runs without the settings: one side-by-side plot of them all.
    plain = [dict(r, config={"mode": r["label"]}) for r in runs[:3]]
    assert [p.rsplit("/", 1)[1] for p in plot_all(plain, str(tmp_path / "p"))] == ["compare.png"]
    # An offline comparison (`bench throughput --compare`): no knee, one comparison.
    offline = [dict(r, kind="throughput", config={"max_num_seqs": 16, "scheduling": s})
               for r, s in zip(runs[:3], ("continuous", "static", "static"))]
    assert [p.rsplit("/", 1)[1] for p in plot_all(offline, str(tmp_path / "o"))] == ["compare_mns16_rateall.png"]


def test_pick_max_num_seqs_meets_the_tpot_slo(runs):
    best = pick_max_num_seqs(runs, tpot_slo_ms=40)
    assert best["config"]["server"]["max_num_seqs"] == 16  # tpot 40 ms at 16, 100 ms at 64
    assert pick_max_num_seqs(runs, tpot_slo_ms=1) is None


def test_bench_cli_wiring():
    parser = build_parser()
    for argv in (["bench", "serve", "--request-rate", "2", "--goodput", "ttft:100", "tpot:20"],
                 ["bench", "throughput", "--compare", "--max-num-seqs", "8", "--seed", "3"],
                 ["bench", "sweep", "--max-num-seqs", "1,2", "--schedulings", "continuous,static"],
                 ["bench", "plot", "x.json"]):
        args = parser.parse_args(argv)
        assert callable(args.handler)
    args = parser.parse_args(["bench", "throughput"])
    assert args.workload == "decode" and args.scheduling == "continuous"
    # The benchmarks measure the dtype a server runs with its defaults: "auto" is float32 on a
    # CPU without bf16 units, where bfloat16 matmuls run many times slower.
    serve_dtype = parser.parse_args(["serve"]).dtype
    assert serve_dtype == "auto"
    assert args.dtype == serve_dtype
    assert parser.parse_args(["bench", "sweep"]).dtype == serve_dtype


FAKE_SERVER = textwrap.dedent('''
    import asyncio, json, sys
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse
    port, limit = int(sys.argv[1]), int(sys.argv[2])
    app, sem = FastAPI(), asyncio.Semaphore(limit)

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "fake"}]}

    async def events(n):
        async with sem:
            for i in range(n):
                await asyncio.sleep(0.005 * limit)
                yield "data: " + json.dumps({"choices": [{"text": "x"}]}) + "\\n\\n"
        yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}) + "\\n\\n"
        yield "data: [DONE]\\n\\n"

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        return StreamingResponse(events(body["max_tokens"]), media_type="text/event-stream")

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
''')


def test_sweep_end_to_end_with_a_fake_server(tmp_path, capsys):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    work = tmp_path / "w.jsonl"
    work.write_text("".join(json.dumps({"prompt": f"p{i}", "max_tokens": 4 + i % 3}) + "\n" for i in range(8)))
    out = tmp_path / "out"
    rc = main(["bench", "sweep", "--server-cmd", f"{sys.executable} {script} {{port}} {{max_num_seqs}}",
               "--max-num-seqs", "1,4", "--request-rates", "inf,50", "--workload-file", str(work),
               "--out-dir", str(out), "--goodput", "tpot:1000", "--disable-tqdm", "--startup-timeout", "60"])
    assert rc == 0
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["max_num_seqs"], r["request_rate"]) for r in rows] == [("1", "inf"), ("1", "50.0"),
                                                                      ("4", "inf"), ("4", "50.0")]
    assert all(r["failed"] == "0" and r["completed"] == "8" and r["total_output_tokens"] == "39" for r in rows)
    report = json.loads((out / "sweep.json").read_text())
    assert len(report["runs"]) == 4 and report["runs"][0]["config"]["server"]["max_num_seqs"] == 1
    assert (out / "knee.png").read_bytes().startswith(PNG)
    assert (out / "workload.jsonl").exists() and (out / "server-continuous-mns1.log").exists()
    assert "max_num_seqs=" in capsys.readouterr().out
    # The saved report replots on its own.
    assert main(["bench", "plot", str(out / "sweep.json"), "--out-dir", str(tmp_path / "re")]) == 0
    assert (tmp_path / "re" / "knee.png").exists()
