"""The explainers' worked examples: `inflight simulate --example NAME` gives their numbers.

Counts are the explainers': start = steps done before a request's first step,
finish = steps done when it has its last token, wait = start - arrival.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from inflight.sim.cli import add_simulate_parser, run_simulate
from inflight.sim.examples import EXAMPLES
from inflight.sim.simulator import simulate

README = Path(__file__).resolve().parents[1] / "README.md"


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    rc = run_simulate(parser.parse_args(["simulate", *argv]))
    out = capsys.readouterr()
    return rc, out.out, out.err


def rows(result, field: str) -> list[int]:
    return [getattr(r, field) for r in result.requests]


def test_two_slots_matches_the_explainer():
    # "B ends after step 2"; "C finishes at step 7 under static batching and at step 3
    # under continuous batching. D finishes at step 9 instead of step 6."
    # 9 vs 6 steps, 67% vs 100%.
    res = simulate(EXAMPLES["2-slots"].workload)
    static, cont = res["static"], res["continuous"]
    assert (static.total_steps, cont.total_steps) == (9, 6)
    assert (round(static.utilisation * 100), round(cont.utilisation * 100)) == (67, 100)
    assert rows(static, "finish") == [6, 2, 7, 9]
    assert rows(cont, "finish") == [6, 2, 3, 6]
    assert rows(static, "start") == rows(static, "wait") == [0, 0, 6, 6]
    assert rows(cont, "start") == rows(cont, "wait") == [0, 0, 2, 3]
    # static returns A and B together when A ends, C and D when D ends
    assert rows(static, "handed_back") == [6, 6, 9, 9]
    assert rows(cont, "handed_back") == rows(cont, "finish")


def test_sixteen_requests_totals():
    # 216 vs 152 steps, 61.1% vs 86.8% utilisation on 4 slots.
    res = simulate(EXAMPLES["16-requests"].workload)
    static, cont = res["static"], res["continuous"]
    assert static.workload.num_requests == 16 and static.workload.slots == 4
    assert (static.total_steps, cont.total_steps) == (216, 152)
    assert (f"{static.utilisation:.1%}", f"{cont.utilisation:.1%}") == ("61.1%", "86.8%")


def test_arrivals_waits_and_starts():
    # Arrivals 0, 0, 1, 2, 3, 4 on 2 slots: waits 0, 0, 5, 4, 6, 5 under static
    # batching against 0, 0, 1, 1, 3, 2 under continuous batching.
    w = EXAMPLES["arrivals"].workload
    assert w.arrivals == (0, 0, 1, 2, 3, 4) and w.slots == 2
    res = simulate(w)
    static, cont = res["static"], res["continuous"]
    assert rows(static, "wait") == [0, 0, 5, 4, 6, 5]
    assert rows(cont, "wait") == [0, 0, 1, 1, 3, 2]
    assert rows(static, "start") == [0, 0, 6, 6, 9, 9]
    assert rows(cont, "start") == [0, 0, 2, 3, 6, 6]
    # A..D are the 2-slot example's requests and finish as they do there
    assert rows(static, "finish")[:4] == [6, 2, 7, 9]
    assert rows(cont, "finish")[:4] == [6, 2, 3, 6]
    # E and F (4 and 2 tokens): static runs them from 9, continuous from 6
    assert rows(static, "finish")[4:] == [13, 11] and static.total_steps == 13
    assert rows(cont, "finish")[4:] == [10, 8] and cont.total_steps == 10


def test_cli_example_table_and_json(capsys):
    rc, out, _ = _run(["--example", "2-slots"], capsys)
    assert rc == 0
    assert out.startswith("example 2-slots: 2 slots; A, B, C, D (r0..r3) need 6, 2, 1, 3")
    # req arrive len | slot start finish wait back (static) | the same (continuous)
    assert re.search(r"^r2\s+0\s+1 \|\s+0\s+6\s+7\s+6\s+9 \|\s+1\s+2\s+3\s+2\s+3$", out, re.M)
    assert re.search(r"^r3\s+0\s+3 \|\s+1\s+6\s+9\s+6\s+9 \|\s+1\s+3\s+6\s+3\s+6$", out, re.M)
    assert "finish: steps done at its last token" in out.splitlines()[-1]
    rc, out, _ = _run(["--example", "arrivals", "--json"], capsys)
    doc = json.loads(out)
    assert [r["wait"] for r in doc["static"]["requests"]] == [0, 0, 5, 4, 6, 5]
    assert [r["finish"] for r in doc["continuous"]["requests"]][:4] == [6, 2, 3, 6]


def test_cli_example_what_if_and_errors(capsys):
    rc, out, _ = _run(["--example", "2-slots", "--slots", "4", "--json"], capsys)
    assert rc == 0 and json.loads(out)["workload"]["slots"] == 4
    rc, out, _ = _run(["--example", "2-slots", "--slots", "4"], capsys)
    assert "the table uses the --slots / --prefill-cost given" in out.splitlines()[0]
    rc, _, err = _run(["--example", "arrivals", "--arrivals", "0,0,0,0,0,0"], capsys)
    assert rc == 2 and "--arrivals goes with --lengths" in err
    with pytest.raises(SystemExit):
        _run(["--example", "no-such-example"], capsys)
    with pytest.raises(SystemExit):
        _run(["--example", "2-slots", "--lengths", "1,2"], capsys)


def test_readme_shows_the_first_example(capsys):
    _, out, _ = _run(["--example", "2-slots"], capsys)
    assert out.strip() in README.read_text(encoding="utf-8")
