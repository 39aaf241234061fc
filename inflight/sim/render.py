"""Draw a :class:`~inflight.sim.views.Page` as a self-contained HTML page or a PNG.

The HTML is ``page_template.html`` (package data, read with
:mod:`importlib.resources`) with the page's JSON embedded in a
``<script type="application/json">`` element; every script and style is
inline, so it opens offline from a file URL. The PNG uses matplotlib's Agg
backend (no display needed) and shows the whole run at once. Its x axis counts
steps done: the cell of step number t spans t - 1 .. t, so a request's start
and finish are the ticks where its cells begin and end.
"""
from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path

from inflight.sim.views import Page, Panel

_PLACEHOLDER = re.compile(r"__(TITLE|DATA)__")


def _template() -> str:
    return resources.files("inflight.sim").joinpath("page_template.html").read_text("utf-8")


def _script_safe_json(data: dict) -> str:
    # Inside <script>, "</script>" or "<!--" in a request id would end the
    # element; escaping <, > and & as JSON \u escapes keeps the JSON identical.
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(page: Page) -> str:
    """The complete HTML document for ``page``."""
    values = {"TITLE": html.escape(page.title), "DATA": _script_safe_json(page.to_dict())}
    # one pass, so a title containing "__DATA__" is not substituted again
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], _template())


def write_html(page: Page, path: str | Path) -> Path:
    """Write :func:`render_html` to ``path``; returns the path."""
    path = Path(path)
    path.write_text(render_html(page), encoding="utf-8")
    return path


def _draw_grid(ax, panel: Panel, num_steps: int) -> None:
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    groups: dict[str, tuple[list, list]] = {k: ([], []) for k in
                                             ("decode", "prefill", "pad", "preempted")}
    show_labels = num_steps <= 60 and len(panel.rows) <= 30
    for t, r, key, label, kind in panel.cells:
        rects, colours = groups[kind]
        rects.append(Rectangle((t, r), 1, 1))
        colours.append(panel.colours[key])
        if show_labels and label and kind != "preempted":
            ax.text(t + 0.5, r + 0.5, label, ha="center", va="center", fontsize=6,
                    color="#777" if kind == "pad" else "#111")
    style = {
        "decode": dict(edgecolor="white", linewidth=0.5),
        "prefill": dict(edgecolor="white", linewidth=0.5, hatch="////", alpha=0.55),
    }
    for kind, (rects, colours) in groups.items():
        if not rects:
            continue
        if kind == "preempted":
            xs = [rc.get_x() + 0.5 for rc in rects]
            ys = [rc.get_y() + 0.5 for rc in rects]
            ax.scatter(xs, ys, marker="x", color="#c00", s=18, zorder=3)
            continue
        if kind == "pad":  # grey, dotted in the colour of the finished request holding it
            ax.add_collection(PatchCollection(rects, facecolors="#ececec", edgecolors=colours,
                                              hatch="..", linewidth=0.3))
        else:
            ax.add_collection(PatchCollection(rects, facecolors=colours, **style[kind]))
    ax.set_xlim(0, num_steps)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(len(panel.rows), 0)
    step_rows = max(1, len(panel.rows) // 20)
    ax.set_yticks([r + 0.5 for r in range(0, len(panel.rows), step_rows)])
    ax.set_yticklabels(panel.rows[::step_rows], fontsize=7)
    ax.set_title(f"{panel.title}: {panel.summary}", fontsize=9, loc="left")
    ax.tick_params(axis="x", labelbottom=bool(not panel.charts), labelsize=7)


def _draw_chart(ax, chart, num_steps: int) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.bar([t + 0.5 for t in range(len(chart.values))], chart.values, width=0.8,
           color="#3b6fb6")
    ax.set_xlim(0, num_steps)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.set_yticks([0, 1])
    ax.tick_params(labelsize=6)
    ax.set_title(f"{chart.name}: {chart.overall}", fontsize=7, loc="right", pad=2)


def write_png(page: Page, path: str | Path, dpi: int = 120) -> Path:
    """A static timeline of every panel (grid + charts) stacked vertically."""
    import matplotlib

    matplotlib.use("Agg")  # headless; must precede pyplot's first import
    import matplotlib.pyplot as plt

    n = page.num_steps
    ratios: list[float] = []
    for p in page.panels:
        ratios += [max(1.2, len(p.rows) * 0.35)] + [0.6] * len(p.charts)
    width = min(18.0, max(7.0, 3.0 + n * 0.12))
    fig, axes = plt.subplots(len(ratios), 1, figsize=(width, 1.2 + sum(ratios) * 0.8),
                             gridspec_kw={"height_ratios": ratios, "hspace": 0.9},
                             squeeze=False)
    it = iter(axes[:, 0])
    for p in page.panels:
        _draw_grid(next(it), p, n)
        for c in p.charts:
            _draw_chart(next(it), c, n)
    axes[-1, 0].set_xlabel("steps done (a request's cells run from its start to its finish)",
                           fontsize=8)
    fig.suptitle(page.title, fontsize=11)
    path = Path(path)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
