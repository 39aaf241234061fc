"""The simulator's HTML/PNG output and the engine-trace viewer."""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from inflight.sim.cli import add_simulate_parser, add_trace_parser, run_simulate, run_trace
from inflight.sim.render import render_html
from inflight.sim.report import to_document
from inflight.sim.simulator import Workload, simulate
from inflight.sim.trace import load_trace, parse_trace, trace_page
from inflight.sim.views import sim_page

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_simulate_parser(sub)
    add_trace_parser(sub)
    return parser.parse_args(argv)


def page_data(html: str) -> dict:
    m = re.search(r'<script id="page-data" type="application/json">(.*?)</script>', html, re.S)
    assert m, "embedded data missing"
    return json.loads(m.group(1))


def assert_self_contained(html: str) -> None:
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*//""", html)
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert not re.search(r"<script[^>]*\bsrc=", html)


def test_simulate_html_and_png(tmp_path: Path, capsys):
    html_path, png_path = tmp_path / "page.html", tmp_path / "out.png"
    args = _args(["simulate", "--lengths", "2,5,1,3,2", "--arrivals", "0,1,1,2,6",
                  "--slots", "3", "--html", str(html_path), "--png", str(png_path)])
    assert run_simulate(args) == 0
    html = html_path.read_text()
    assert_self_contained(html)
    for control in ("reset", "back", "forward", "play"):
        assert f'id="{control}"' in html
    data = page_data(html)
    res = simulate(Workload.make([2, 5, 1, 3, 2], [0, 1, 1, 2, 6], slots=3))
    assert data["extra"]["simulation"] == json.loads(json.dumps(to_document(res)))
    static, cont = data["panels"]
    assert (static["title"], cont["title"]) == ("static batching", "continuous batching")
    assert data["num_steps"] == 9
    # per-step utilisation bars and hand-back steps are the simulator's numbers
    assert cont["charts"][0]["values"] == [1 / 3, 1, 2 / 3, 2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3]
    # hand-back and step titles count steps done, as the table and --json do
    assert static["handed_back"] == {"0": 6, "1": 6, "2": 6, "3": 9, "4": 9}
    assert cont["handed_back"] == {"0": 2, "1": 6, "2": 2, "3": 5, "4": 8}
    assert static["step_labels"] == [str(n) for n in range(1, 10)]
    assert cont["status"][1] == "step 2: 3 tokens; handed back at its end: r0, r2"
    assert [0, 0, "0", "r0", "decode"] in cont["cells"]
    assert [3, 2, "2", "r2", "pad"] in static["cells"]  # r2 finished at 1, slot held
    png = png_path.read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5000


def test_png_is_readable(tmp_path: Path):
    import matplotlib.image

    from inflight.sim.render import write_png

    res = simulate(Workload.make([4, 1, 3], slots=2, prefill_cost=2))
    path = write_png(sim_page(res), tmp_path / "t.png")
    img = matplotlib.image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


# A hand-written trace: 3 requests under an 8-token budget, 10 KV blocks.
# Engine steps are 0-based in the file; the viewer titles them by steps done.
# r0: 12-token prompt in chunks 8 + 4, then 2 decodes, finishes at step 3.
# r1: 6-token prompt in chunks 4 + 2, decodes at 3, 4, 5, finishes at step 5.
# r2: 5-token prompt at step 2, one decode at 3, preempted at 4, recomputed
#     (5 prompt + 1 generated = 6) at step 5, last decode at 6.
FIXTURE = [
    {"step": 0, "time": 100.00, "duration_s": 0.05,
     "requests": [{"id": "r0", "num_tokens": 8, "kind": "prefill"}],
     "num_tokens": 8, "kv_blocks_used": 1, "kv_blocks_free": 9,
     "num_waiting": 2, "num_running": 1, "finished": [], "preempted": []},
    {"step": 1, "time": 100.05, "duration_s": 0.05,
     "requests": [{"id": "r0", "num_tokens": 4, "kind": "prefill"},
                  {"id": "r1", "num_tokens": 4, "kind": "prefill"}],
     "num_tokens": 8, "kv_blocks_used": 2, "kv_blocks_free": 8,
     "num_waiting": 1, "num_running": 2, "finished": [], "preempted": []},
    {"step": 2, "time": 100.10, "duration_s": 0.05,
     "requests": [{"id": "r0", "num_tokens": 1, "kind": "decode"},
                  {"id": "r1", "num_tokens": 2, "kind": "prefill"},
                  {"id": "r2", "num_tokens": 5, "kind": "prefill"}],
     "num_tokens": 8, "kv_blocks_used": 3, "kv_blocks_free": 7,
     "num_waiting": 0, "num_running": 3, "finished": [], "preempted": []},
    {"step": 3, "time": 100.15, "duration_s": 0.02,
     "requests": [{"id": "r0", "num_tokens": 1, "kind": "decode"},
                  {"id": "r1", "num_tokens": 1, "kind": "decode"},
                  {"id": "r2", "num_tokens": 1, "kind": "decode"}],
     "num_tokens": 3, "kv_blocks_used": 3, "kv_blocks_free": 7,
     "num_waiting": 0, "num_running": 3, "finished": ["r0"], "preempted": []},
    {"step": 4, "time": 100.17, "duration_s": 0.02,
     "requests": [{"id": "r1", "num_tokens": 1, "kind": "decode"}],
     "num_tokens": 1, "kv_blocks_used": 1, "kv_blocks_free": 9,
     "num_waiting": 1, "num_running": 1, "finished": [], "preempted": ["r2"]},
    {"step": 5, "time": 100.19, "duration_s": 0.04,
     "requests": [{"id": "r1", "num_tokens": 1, "kind": "decode"},
                  {"id": "r2", "num_tokens": 6, "kind": "prefill"}],
     "num_tokens": 7, "kv_blocks_used": 2, "kv_blocks_free": 8,
     "num_waiting": 0, "num_running": 2, "finished": ["r1"], "preempted": []},
    {"step": 6, "time": 100.23, "duration_s": 0.02,
     "requests": [{"id": "r2", "num_tokens": 1, "kind": "decode"}],
     "num_tokens": 1, "kv_blocks_used": 0, "kv_blocks_free": 10,
     "num_waiting": 0, "num_running": 0, "finished": ["r2"], "preempted": []},
]


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in FIXTURE) + "\n")
    return path


def test_trace_page_model(trace_file: Path):
    steps = load_trace(trace_file)
    assert [s.num_tokens for s in steps] == [sum(r.num_tokens for r in s.requests) for s in steps]
    (panel,) = trace_page(steps).panels
    assert panel.rows == ["r0", "r1", "r2"] and panel.num_steps == 7
    r0 = [(t, label, kind) for t, row, key, label, kind in panel.cells if key == "r0"]
    assert r0 == [(0, "8", "prefill"), (1, "4", "prefill"), (2, "", "decode"), (3, "", "decode")]
    assert [4, 2, "r2", "x", "preempted"] in panel.cells
    assert [5, 2, "r2", "6", "prefill"] in panel.cells
    assert panel.handed_back == {"r0": 4, "r1": 6, "r2": 7}
    assert panel.step_labels == ["1", "2", "3", "4", "5", "6", "7"]
    kv, tokens = panel.charts
    assert kv.values == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.1, 0.2, 0.0])
    assert kv.overall == "peak 3/10 = 30.0%"
    assert tokens.values == pytest.approx([1, 1, 1, 3 / 8, 1 / 8, 7 / 8, 1 / 8])
    assert "preempted r2" in panel.status[4] and "finished r0" in panel.status[3]
    assert panel.status[3].startswith("step 4: 3 tokens")


def test_trace_view_cli(trace_file: Path, tmp_path: Path, capsys):
    out, png = tmp_path / "trace.html", tmp_path / "trace.png"
    args = _args(["trace", "view", str(trace_file), "--out", str(out), "--png", str(png)])
    assert run_trace(args) == 0
    html = out.read_text()
    assert_self_contained(html)
    assert 'id="forward"' in html and 'id="play"' in html
    data = page_data(html)
    assert data["panels"][0]["handed_back"] == {"r0": 4, "r1": 6, "r2": 7}
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_trace_errors_and_hostile_ids(tmp_path: Path, capsys):
    with pytest.raises(ValueError, match="line 2"):
        parse_trace([json.dumps(FIXTURE[0]), "{not json"])
    assert run_trace(_args(["trace", "view", str(tmp_path / "none.jsonl"),
                            "--out", str(tmp_path / "x.html")])) == 2
    evil = "</script><script>alert(1)</script>"
    step = dict(FIXTURE[0], requests=[{"id": evil, "num_tokens": 3, "kind": "prefill"}])
    html = render_html(trace_page(parse_trace([json.dumps(step)]), title=evil))
    assert html.count("</script>") == 2  # only the page's own two script elements
    assert page_data(html)["panels"][0]["rows"] == [evil]


CHROMIUM = shutil.which("chromium")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")
@pytest.mark.parametrize("step", [3, 7])
def test_page_in_headless_chromium(tmp_path: Path, step: int):
    # page.html#step=N presses "step forward" N times: N steps done. At 7 the
    # continuous panel (6 steps) is over; static has handed back r0 and r1 (at 6).
    res = simulate(Workload.make([6, 2, 1, 3], slots=2))
    doc = to_document(res)
    path = tmp_path / "page.html"
    path.write_text(render_html(sim_page(res, doc)))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update",
         "--dump-dom", f"{path.as_uri()}#step={step}"],
        capture_output=True, text=True, timeout=60).stdout
    assert f'data-step="{step}"' in dom
    for i, name in enumerate(("static", "continuous")):
        per_step = doc[name]["per_step"]
        shown = re.search(rf'id="p{i}-c0"[^>]*data-value="([^"]*)"|data-value="([^"]*)"[^>]*id="p{i}-c0"', dom)
        value = next(g for g in shown.groups() if g is not None)
        expected = per_step[step - 1]["utilisation"] if step <= len(per_step) else None
        assert (float(value) if value else None) == expected
        count = re.search(rf'id="p{i}-handed"[^>]*data-count="(\d+)"|data-count="(\d+)"[^>]*id="p{i}-handed"', dom)
        n = int(next(g for g in count.groups() if g is not None))
        assert n == per_step[min(step, len(per_step)) - 1]["handed_back_total"]
        done = sum(r["handed_back"] <= step for r in doc[name]["requests"])
        assert n == done == {(3, "static"): 0, (3, "continuous"): 2,
                             (7, "static"): 2, (7, "continuous"): 4}[step, name]
