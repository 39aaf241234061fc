"""A renderer-neutral description of a step-by-step page.

Both the simulator and engine traces are turned into a :class:`Page`: one or
more :class:`Panel` grids (rows x steps, one coloured cell per occupant) that
share a step cursor, each with per-step :class:`Chart` bars and a "handed
back" row. :mod:`inflight.sim.render` draws a Page as HTML (interactive) or
PNG (static), so both outputs always show the same data.

Step convention of the page (the simulator's, see :mod:`inflight.sim.simulator`):
columns are steps numbered from 1, so the number of a column is the steps done
at its end, and every step count on the page (``handed_back``, status lines,
labels) is a count of steps done. Cell coordinates are 0-based column indexes.
"""
from __future__ import annotations

import colorsys
from dataclasses import asdict, dataclass, field
from typing import Optional

from inflight.sim.simulator import SCHEDULERS, SimResult


@dataclass
class Chart:
    """Per-step bars drawn under a grid: ``values`` in [0, 1], one per step."""

    name: str
    values: list[float]
    labels: list[str]  # text shown for the step under the cursor
    overall: str  # text shown whatever the cursor


@dataclass
class Panel:
    """One grid. ``cells`` rows are ``[step, row, key, label, kind]``.

    ``step`` is the 0-based column. ``kind`` is "decode" (solid), "prefill"
    (hatched), "pad" (slot held, no work) or "preempted" (outline cross).
    ``key`` picks the colour and the hand-back chip; ``handed_back`` maps a
    key to the steps done (columns run) when the user gets its output.
    """

    title: str
    row_title: str
    rows: list[str]
    num_steps: int
    cells: list[list]
    colours: dict[str, str]
    key_labels: dict[str, str]
    charts: list[Chart]
    handed_back: dict[str, int]
    status: list[str]  # one line per step
    summary: str
    step_labels: Optional[list[str]] = None  # column titles; default 1..n


@dataclass
class Page:
    """Everything a renderer needs; ``to_dict`` is what the HTML embeds."""

    title: str
    notes: str
    panels: list[Panel]
    extra: dict = field(default_factory=dict)  # raw data for scripts and tests

    @property
    def num_steps(self) -> int:
        return max(p.num_steps for p in self.panels)

    def to_dict(self) -> dict:
        return {"title": self.title, "notes": self.notes, "num_steps": self.num_steps,
                "panels": [asdict(p) for p in self.panels], "extra": self.extra}


def colour(i: int) -> str:
    """A distinct, readable colour for the i-th request (golden-angle hues)."""
    h = (i * 0.381966) % 1.0
    light = 0.55 if i % 2 == 0 else 0.68  # alternate lightness so neighbours differ
    r, g, b = colorsys.hls_to_rgb(h, light, 0.62)
    return "#{:02x}{:02x}{:02x}".format(round(r * 255), round(g * 255), round(b * 255))


def sim_panel(result: SimResult) -> Panel:
    """The slots x steps grid of one scheduler."""
    w = result.workload
    stats = result.per_step()
    cells = [[t, s, str(c.request), f"r{c.request}", c.kind]
             for t, row in enumerate(result.timeline)
             for s, c in enumerate(row) if c is not None]
    util = Chart(
        "utilisation",
        [s.utilisation for s in stats],
        [f"{s.busy_slots}/{w.slots} slots busy = {s.utilisation:.1%}; "
         f"so far {s.cumulative_utilisation:.1%}" for s in stats],
        f"overall {result.utilisation:.1%}",
    )
    status = []
    for s in stats:
        back = ", ".join(f"r{i}" for i in s.handed_back) or "none"
        noun = "token" if s.tokens == 1 else "tokens"
        status.append(f"step {s.step}: {s.tokens} {noun}; handed back at its end: {back}")
    return Panel(
        title=f"{result.scheduler} batching",
        row_title="slot",
        rows=[f"slot {s}" for s in range(w.slots)],
        num_steps=result.total_steps,
        cells=cells,
        colours={str(i): colour(i) for i in range(w.num_requests)},
        key_labels={str(i): f"r{i}" for i in range(w.num_requests)},
        charts=[util],
        handed_back={str(r.id): r.handed_back for r in result.requests},
        status=status,
        summary=(f"{result.total_steps} steps, utilisation {result.utilisation:.1%}, "
                 f"{result.tokens_per_step:.2f} tokens/step"),
        step_labels=[str(s.step) for s in stats],
    )


def sim_page(results: dict[str, SimResult], document: Optional[dict] = None) -> Page:
    """Static and continuous side by side; ``document`` (the --json doc) is embedded."""
    w = next(iter(results.values())).workload
    notes = (f"{w.num_requests} requests, {w.slots} slots, prefill cost {w.prefill_cost}. "
             "Lengths " + ",".join(map(str, w.lengths)) + "; arrival steps "
             + ",".join(map(str, w.arrivals)) + ". Solid = a decode step (one token), "
             "hatched = prefill, grey = slot held by a finished request (padding). "
             "Static batching hands a batch back only when its longest member ends. "
             "Steps are numbered from 1: a request with start s and finish f runs in "
             "steps s+1..f, and the user has it after step 'back'.")
    return Page("Static vs continuous batching", notes,
                [sim_panel(results[name]) for name in SCHEDULERS],
                extra={"simulation": document} if document is not None else {})
