"""Text table and JSON document for a simulation of both schedulers."""
from __future__ import annotations

import json
from dataclasses import asdict

from inflight.sim.simulator import SCHEDULERS, SimResult, Workload


# One line, shared by the table's footnote and the CLI's help.
CONVENTION = ("start: steps done before its first step; finish: steps done at its last "
              "token, so it runs in steps start+1..finish; back: steps done when the user "
              "has it")


def _csv(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def format_table(results: dict[str, SimResult]) -> str:
    """Human-readable comparison: one summary line per scheduler, then per request."""
    w = next(iter(results.values())).workload
    lines = [
        f"workload: {w.num_requests} requests, {w.slots} slots, prefill cost {w.prefill_cost}",
        f"lengths:  {_csv(w.lengths)}",
        f"arrivals: {_csv(w.arrivals)}",
        "",
        f"{'scheduler':<11}{'steps':>6}{'useful':>8}{'util':>8}{'tok/step':>10}"
        f"{'mean wait':>11}",
    ]
    for name in SCHEDULERS:
        r = results[name]
        mean_wait = sum(x.wait for x in r.requests) / len(r.requests)
        lines.append(f"{name:<11}{r.total_steps:>6}{r.useful_slot_steps:>8}"
                     f"{r.utilisation:>8.1%}{r.tokens_per_step:>10.2f}{mean_wait:>11.2f}")
    lines += ["", _request_header()]
    for i in range(w.num_requests):
        cols = [f"r{i:<5}{w.arrivals[i]:>7}{w.lengths[i]:>5}"]
        for name in SCHEDULERS:
            x = results[name].requests[i]
            cols.append(f"{x.slot:>4}{x.start:>6}{x.finish:>7}{x.wait:>5}{x.handed_back:>5}")
        lines.append(" | ".join(cols))
    lines.append(f"({CONVENTION})")
    return "\n".join(lines)


def _request_header() -> str:
    left = f"{'req':<6}{'arrive':>7}{'len':>5}"
    sub = f"{'slot':>4}{'start':>6}{'finish':>7}{'wait':>5}{'back':>5}"
    width = len(sub)
    top = " | ".join([" " * len(left)] + [n.center(width) for n in SCHEDULERS])
    return top.rstrip() + "\n" + " | ".join([left] + [sub] * len(SCHEDULERS))


def to_document(results: dict[str, SimResult]) -> dict:
    """The ``--json`` document: the workload and each scheduler's full result."""
    w: Workload = next(iter(results.values())).workload
    doc: dict = {"workload": {**asdict(w), "lengths": list(w.lengths),
                              "arrivals": list(w.arrivals)}}
    for name in SCHEDULERS:
        doc[name] = results[name].to_dict()
    return doc


def to_json(results: dict[str, SimResult], indent: int | None = 1) -> str:
    """:func:`to_document` serialised."""
    return json.dumps(to_document(results), indent=indent)
