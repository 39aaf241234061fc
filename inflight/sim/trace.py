"""Engine step traces (``--trace-file``): load them and turn them into a Page.

The engine writes one JSON object per line, one line per engine step::

    {"step": 0, "time": 1732900000.123, "duration_s": 0.05,
     "requests": [{"id": "r0", "num_tokens": 12, "kind": "prefill"},
                  {"id": "r1", "num_tokens": 1, "kind": "decode"}],
     "num_tokens": 13, "kv_blocks_used": 5, "kv_blocks_free": 95,
     "num_waiting": 2, "num_running": 2, "finished": ["r2"], "preempted": []}

``kind`` is "prefill" for a prompt chunk and "decode" for one generated token;
``step`` is the engine's 0-based step index (the steps it had done before).
In the viewer a row is a request (in order of first appearance) and a column
is one line of the file. Like the simulator, the viewer counts steps done:
the column of engine step ``s`` is titled ``s + 1``, and a request is handed
back once the line that lists it in ``finished`` has run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from inflight.sim.views import Chart, Page, Panel, colour


@dataclass
class ScheduledChunk:
    """Tokens one request computed in one step."""

    id: str
    num_tokens: int
    kind: str  # "prefill" | "decode"


@dataclass
class TraceStep:
    """One line of a trace file."""

    step: int
    time: float
    duration_s: float
    requests: list[ScheduledChunk]
    num_tokens: int
    kv_blocks_used: int
    kv_blocks_free: int
    num_waiting: int
    num_running: int
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> "TraceStep":
        reqs = [ScheduledChunk(str(r["id"]), int(r["num_tokens"]), str(r["kind"]))
                for r in d.get("requests", [])]
        for r in reqs:
            if r.kind not in ("prefill", "decode"):
                raise ValueError(f"step {d.get('step')}: unknown kind {r.kind!r}")
        return cls(
            step=int(d["step"]), time=float(d.get("time", 0.0)),
            duration_s=float(d.get("duration_s", 0.0)), requests=reqs,
            num_tokens=int(d.get("num_tokens", sum(r.num_tokens for r in reqs))),
            kv_blocks_used=int(d.get("kv_blocks_used", 0)),
            kv_blocks_free=int(d.get("kv_blocks_free", 0)),
            num_waiting=int(d.get("num_waiting", 0)),
            num_running=int(d.get("num_running", len(reqs))),
            finished=[str(x) for x in d.get("finished", [])],
            preempted=[str(x) for x in d.get("preempted", [])],
        )


def parse_trace(lines: Iterable[str]) -> list[TraceStep]:
    """Parse JSON lines; blank lines are skipped, a bad line names its number."""
    steps = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            steps.append(TraceStep.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"trace line {n}: {e}") from e
    if not steps:
        raise ValueError("trace is empty")
    return steps


def load_trace(path: str | Path) -> list[TraceStep]:
    """Read a ``--trace-file`` written by the engine."""
    with open(path, encoding="utf-8") as f:
        return parse_trace(f)


def _request_order(steps: list[TraceStep]) -> list[str]:
    seen: dict[str, None] = {}
    for s in steps:
        for r in s.requests:
            seen.setdefault(r.id, None)
        for rid in s.finished + s.preempted:
            seen.setdefault(rid, None)
    return list(seen)


def _charts(steps: list[TraceStep]) -> list[Chart]:
    totals = [s.kv_blocks_used + s.kv_blocks_free for s in steps]
    kv = [s.kv_blocks_used / t if t else 0.0 for s, t in zip(steps, totals)]
    peak = max(range(len(steps)), key=lambda i: kv[i])
    kv_chart = Chart("KV used", kv,
                     [f"{s.kv_blocks_used}/{t} blocks = {v:.1%}"
                      for s, t, v in zip(steps, totals, kv)],
                     f"peak {steps[peak].kv_blocks_used}/{totals[peak]} = {kv[peak]:.1%}")
    most = max(s.num_tokens for s in steps) or 1
    mean = sum(s.num_tokens for s in steps) / len(steps)
    tok_chart = Chart("tokens", [s.num_tokens / most for s in steps],
                      [f"{s.num_tokens} in the step" for s in steps],
                      f"max {most}, mean {mean:.1f}/step")
    return [kv_chart, tok_chart]


def _status(s: TraceStep) -> str:
    pre = sum(r.num_tokens for r in s.requests if r.kind == "prefill")
    dec = sum(r.num_tokens for r in s.requests if r.kind == "decode")
    noun = "token" if s.num_tokens == 1 else "tokens"
    text = (f"step {s.step + 1}: {s.num_tokens} {noun} ({pre} prefill, {dec} decode), "
            f"running {s.num_running}, waiting {s.num_waiting}, "
            f"{s.duration_s * 1000:.1f} ms")
    if s.finished:
        text += "; finished " + ", ".join(s.finished)
    if s.preempted:
        text += "; preempted " + ", ".join(s.preempted)
    return text


def trace_page(steps: list[TraceStep], title: str = "Engine trace") -> Page:
    """Rows = requests, columns = engine steps; prefill chunks hatched with their size."""
    ids = _request_order(steps)
    row = {rid: i for i, rid in enumerate(ids)}
    cells: list[list] = []
    handed: dict[str, int] = {}
    for t, s in enumerate(steps):
        for r in s.requests:
            label = str(r.num_tokens) if r.kind == "prefill" else ""
            cells.append([t, row[r.id], r.id, label, r.kind])
        for rid in s.preempted:
            cells.append([t, row[rid], rid, "x", "preempted"])
        for rid in s.finished:
            handed.setdefault(rid, t + 1)  # columns done once this one has run
    wall = steps[-1].time - steps[0].time + steps[-1].duration_s
    panel = Panel(
        title=title, row_title="request", rows=ids, num_steps=len(steps), cells=cells,
        colours={rid: colour(i) for i, rid in enumerate(ids)},
        key_labels={rid: rid for rid in ids}, charts=_charts(steps),
        handed_back=handed, status=[_status(s) for s in steps],
        summary=(f"{len(steps)} steps, {len(ids)} requests, "
                 f"{sum(s.num_tokens for s in steps)} tokens, {wall:.2f} s"),
        step_labels=[str(s.step + 1) for s in steps],
    )
    notes = ("One column per engine step, one row per request. Hatched cells are "
             "prefill chunks labelled with their size; solid cells are decode "
             "tokens; a red cross marks a preemption.")
    return Page(title, notes, [panel])
