"""Batching simulator: hand-worked cases, properties and the CLI.

Conventions (inflight/sim/simulator.py), the explainers' count of steps done:
start = steps done before the request's first step (it may be its arrival);
finish = steps done when it has its last token, so it runs in steps numbered
start+1..finish; wait = start - arrival; "back" = steps done when the user gets
the output (static: the group's end; continuous: the finish); total steps =
last finish; utilisation = useful slot-steps / (steps x slots).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from inflight.sim.cli import add_simulate_parser, run_simulate
from inflight.sim.simulator import Workload, simulate

# (slot, start, finish, wait, back) per request, in request-id order
Rows = list[tuple[int, int, int, int, int]]


def check(result, steps: int, useful: int, util: float, rows: Rows) -> None:
    assert result.total_steps == steps
    assert result.useful_slot_steps == useful
    assert result.utilisation == pytest.approx(util)
    assert result.tokens_per_step == pytest.approx(sum(result.workload.lengths) / steps)
    got = [(r.slot, r.start, r.finish, r.wait, r.handed_back) for r in result.requests]
    assert got == rows


def test_issue_example_two_slots():
    # lengths 6,2,1,3, all arrive at 0, 2 slots.
    # static: group {r0,r1} runs steps 1..6 (r0 needs 6); r1 finishes at 2 but its
    #   slot is padding until 6, and both are handed back at 6. Group {r2,r3} starts
    #   at 6 and runs steps 7..9 (r3 needs 3): r2 finishes 7, r3 9, back at 9.
    #   9 steps x 2 slots = 18 slot-steps, 12 useful -> 2/3; 12 tokens / 9 steps.
    # continuous: slot0 = r0 steps 1..6; slot1 = r1 1..2, r2 3..3, r3 4..6.
    #   6 steps, 12/12 slot-steps useful -> 1.0; 2 tokens per step.
    res = simulate(Workload.make([6, 2, 1, 3], slots=2))
    check(res["static"], 9, 12, 12 / 18,
          [(0, 0, 6, 0, 6), (1, 0, 2, 0, 6), (0, 6, 7, 6, 9), (1, 6, 9, 6, 9)])
    check(res["continuous"], 6, 12, 1.0,
          [(0, 0, 6, 0, 6), (1, 0, 2, 0, 2), (1, 2, 3, 2, 3), (1, 3, 6, 3, 6)])


def test_issue_example_four_slots_same_steps_earlier_hand_back():
    # Everything fits at once: both run steps 1..6 with the same finishes
    # (r0 6, r1 2, r2 1, r3 3), 12 useful of 6 x 4 = 24 -> 0.5.
    # Only hand-back differs: static returns all four at 6.
    res = simulate(Workload.make([6, 2, 1, 3], slots=4))
    check(res["static"], 6, 12, 0.5,
          [(0, 0, 6, 0, 6), (1, 0, 2, 0, 6), (2, 0, 1, 0, 6), (3, 0, 3, 0, 6)])
    check(res["continuous"], 6, 12, 0.5,
          [(0, 0, 6, 0, 6), (1, 0, 2, 0, 2), (2, 0, 1, 0, 1), (3, 0, 3, 0, 3)])


def test_three_slots_with_arrivals():
    # lengths 2,5,1,3,2; arrivals 0,1,1,2,6; 3 slots. Sum of lengths 13.
    # static: group {r0,r1,r2}: last member arrives at 1 -> start 1, steps 2..6
    #   (r1 needs 5): r0 finishes 3, r1 6, r2 2, all back at 6; r0 waited 1.
    #   group {r3,r4}: r4 arrives at 6 and the first group ended at 6 -> start 6,
    #   r3 finishes 9, r4 8, back at 9; r3 waited 6-2 = 4. 9 steps: 13/27.
    # continuous: r0 -> slot0 at 0 (finish 2). At 1: r1 -> slot1 (finish 6),
    #   r2 -> slot2 (finish 2). At 2: slots 0 and 2 free, r3 -> slot0 (finish 5).
    #   Nothing until r4 arrives at 6 -> slot0 (finish 8). 8 steps: 13/24. No waits.
    w = Workload.make([2, 5, 1, 3, 2], [0, 1, 1, 2, 6], slots=3)
    res = simulate(w)
    check(res["static"], 9, 13, 13 / 27,
          [(0, 1, 3, 1, 6), (1, 1, 6, 0, 6), (2, 1, 2, 0, 6), (0, 6, 9, 4, 9), (1, 6, 8, 0, 9)])
    check(res["continuous"], 8, 13, 13 / 24,
          [(0, 0, 2, 0, 2), (1, 1, 6, 0, 6), (2, 1, 2, 0, 2), (0, 2, 5, 0, 5), (0, 6, 8, 0, 8)])
    # the continuous grid, slot by slot (. = empty)
    grid = ["".join("." if c is None else str(c.request) for c in (row[s] for row in
            res["continuous"].timeline)) for s in range(3)]
    assert grid == ["00333.44", ".11111..", ".2......"]
    # per step: busy slots and cumulative hand-backs
    stats = res["continuous"].per_step()
    assert [s.busy_slots for s in stats] == [1, 3, 2, 2, 2, 1, 1, 1]
    assert [s.handed_back_total for s in stats] == [0, 2, 2, 2, 3, 4, 4, 5]
    static_stats = res["static"].per_step()
    assert [s.busy_slots for s in static_stats] == [0, 3, 2, 1, 1, 1, 2, 2, 1]
    assert [s.handed_back_total for s in static_stats] == [0, 0, 0, 0, 0, 3, 3, 3, 5]


def test_equal_lengths_tie():
    # lengths 3,3,3,3; arrivals 0,0,1,1; 2 slots. Every request needs 3 steps, so
    # no slot ever frees early: both schedulers run r0,r1 on steps 0..2 and r2,r3
    # (arrived at 1, waiting 2 steps) from 3 to 6, and hand back at the same
    # counts. 6 steps, 12/12 useful -> 1.0.
    res = simulate(Workload.make([3, 3, 3, 3], [0, 0, 1, 1], slots=2))
    rows = [(0, 0, 3, 0, 3), (1, 0, 3, 0, 3), (0, 3, 6, 2, 6), (1, 3, 6, 2, 6)]
    check(res["static"], 6, 12, 1.0, rows)
    check(res["continuous"], 6, 12, 1.0, rows)


def test_prefill_cost():
    # lengths 2,1,2; 2 slots; prefill cost 1: each request's first step in its
    # slot gives no token, so it holds the slot for 1 + length steps.
    # static: {r0,r1} steps 1..3 (r0: prefill in step 1, tokens in 2, 3; r1: prefill
    #   1, token 2); {r2} steps 4..6 (prefill 4, tokens 5, 6). 6 steps; 8 of 12 useful.
    # continuous: r1 frees slot1 at 2, r2 takes it (prefill in step 3, tokens in
    #   4, 5). 5 steps; 8 of 10 useful; 5 tokens / 5 steps.
    res = simulate(Workload.make([2, 1, 2], slots=2, prefill_cost=1))
    check(res["static"], 6, 8, 8 / 12, [(0, 0, 3, 0, 3), (1, 0, 2, 0, 3), (0, 3, 6, 3, 6)])
    check(res["continuous"], 5, 8, 8 / 10, [(0, 0, 3, 0, 3), (1, 0, 2, 0, 2), (1, 2, 5, 2, 5)])
    kinds = [c.kind for c in (row[1] for row in res["continuous"].timeline)]
    assert kinds == ["prefill", "decode", "prefill", "decode", "decode"]


@pytest.mark.parametrize("kwargs", [dict(lengths=[]), dict(lengths=[0]),
                                    dict(lengths=[1, 2], arrivals=[0]),
                                    dict(lengths=[1], slots=0), dict(lengths=[1], arrivals=[-1])])
def test_bad_workloads_rejected(kwargs):
    with pytest.raises(ValueError):
        Workload.make(**kwargs)


workloads = st.integers(1, 12).flatmap(lambda n: st.builds(
    Workload.make,
    lengths=st.lists(st.integers(1, 9), min_size=n, max_size=n),
    arrivals=st.one_of(st.none(), st.lists(st.integers(0, 15), min_size=n, max_size=n)),
    slots=st.integers(1, 5),
    prefill_cost=st.integers(0, 2),
))


@settings(max_examples=150, deadline=None)
@given(workloads)
def test_properties(w: Workload):
    res = simulate(w)
    st_, co = res["static"], res["continuous"]
    for r in (st_, co):
        # every slot-step of computing is accounted for, nothing else is useful
        assert r.useful_slot_steps == sum(w.lengths) + w.num_requests * w.prefill_cost
        # no slot ever holds two requests: [start, held_until) on one slot are disjoint
        for s in range(w.slots):
            spans = sorted((x.start, x.held_until) for x in r.requests if x.slot == s)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        for x in r.requests:
            assert x.start >= x.arrival
            assert x.finish == x.start + w.prefill_cost + x.length
            assert x.finish <= x.handed_back == (x.finish if r is co else x.held_until)
        assert r.total_steps == max(x.handed_back for x in r.requests) == len(r.timeline)
    # continuous is never later than static, per request and in total
    assert co.total_steps <= st_.total_steps
    for a, b in zip(co.requests, st_.requests):
        assert a.start <= b.start and a.handed_back <= b.handed_back
    # continuous never leaves a slot empty while an arrived request waits
    for t, row in enumerate(co.timeline):
        waiting = [x for x in co.requests if x.arrival <= t < x.start]
        assert not (waiting and None in row)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=20), st.integers(1, 6))
def test_all_at_once_continuous_never_slower(lengths, slots):
    res = simulate(Workload.make(lengths, slots=slots))
    assert res["continuous"].total_steps <= res["static"].total_steps
    assert res["static"].useful_slot_steps == res["continuous"].useful_slot_steps == sum(lengths)


def _cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_json_parses(capsys):
    assert run_simulate(_cli(["simulate", "--lengths", "6,2,1,3", "--slots", "2", "--json"])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"] == {"lengths": [6, 2, 1, 3], "arrivals": [0, 0, 0, 0],
                               "slots": 2, "prefill_cost": 0}
    assert doc["static"]["total_steps"] == 9 and doc["continuous"]["total_steps"] == 6
    assert [r["handed_back"] for r in doc["static"]["requests"]] == [6, 6, 9, 9]
    assert [r["finish"] for r in doc["continuous"]["requests"]] == [6, 2, 3, 6]
    assert [s["step"] for s in doc["continuous"]["per_step"]] == [1, 2, 3, 4, 5, 6]
    assert [s["handed_back_total"] for s in doc["continuous"]["per_step"]] == [0, 1, 2, 2, 2, 4]
    assert doc["continuous"]["timeline"][2] == [{"request": 0, "kind": "decode"},
                                                {"request": 2, "kind": "decode"}]


def test_cli_table_and_errors(capsys):
    assert run_simulate(_cli(["simulate", "--random", "16", "--min-len", "2", "--max-len",
                              "24", "--seed", "1", "--slots", "4"])) == 0
    out = capsys.readouterr().out
    assert "static" in out and "continuous" in out and len(re.findall(r"^r\d+ ", out, re.M)) == 16
    assert run_simulate(_cli(["simulate", "--lengths", "1,2", "--arrivals", "0"])) == 2
    assert "arrivals" in capsys.readouterr().err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "inflight.sim.cli", "simulate", "--lengths",
                          "3,3,3,3", "--arrivals", "0,0,1,1", "--slots", "2", "--json"],
                         capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    assert doc["static"]["utilisation"] == doc["continuous"]["utilisation"] == 1.0
