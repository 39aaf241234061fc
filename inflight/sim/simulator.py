"""Discrete-step model of static and continuous batching.

Time model (used everywhere in :mod:`inflight.sim`):

* Time is a count of **steps done**. One step is one forward pass of the
  batch; "time t" is the moment when t steps have run, so step number t + 1
  runs from time t to time t + 1. The clock starts at 0 even if nothing has
  arrived yet. This is how the continuous-batching explainers count: a request
  of one token that enters an empty GPU has start 0 and finish 1.
* The GPU has ``slots`` slots; a slot holds at most one request per step.
* A request ``i`` has an arrival time ``a_i`` and needs ``k_i`` output tokens.
  It is known to the scheduler at time ``a_i``, so its first step can be the
  one that runs from ``a_i``.
* ``prefill_cost`` (default 0, i.e. prefill ignored): the first
  ``prefill_cost`` steps a request spends in its slot produce no token (they
  stand for computing its prompt). After them, every step it holds the slot
  gives it exactly one token. A request therefore occupies its slot for
  ``prefill_cost + k_i`` consecutive steps.
* ``start``  = steps done before its first step (prefill included);
  ``finish`` = steps done when it has its last token
  (``start + prefill_cost + k_i``); it runs in the steps numbered
  ``start + 1 .. finish``; ``wait`` = ``start - arrival``.
* ``handed_back`` = steps done when the user receives the output.
  Continuous batching returns a request at its ``finish``; padded static
  batching returns the whole batch together, when the group's longest member
  finishes.
* ``total_steps`` = the last finish.
* A slot-step is *useful* when the request in it computes (prefill or decode);
  a static slot held by a request that already finished is *padding*.
  Utilisation = useful slot-steps / (total_steps x slots); with
  ``prefill_cost == 0`` useful slot-steps equals the sum of the lengths.
  Tokens per step = sum of lengths / total_steps.
* Lists indexed by step (``timeline``, ``per_step``) use index ``t`` for the
  step that runs from time ``t`` to ``t + 1`` (step number ``t + 1``).

Schedulers:

* **static**: requests are grouped in arrival order (ties: input order) into
  groups of exactly ``slots`` (the last may be smaller). A group starts at the
  step when its last member has arrived and the previous group has finished
  (``max(last arrival, previous group's end)``); member ``j`` takes slot
  ``j``; the group holds its slots until its longest member finishes.
* **continuous**: before each step, free slots (lowest index first) are filled
  in arrival order with requests that have already arrived; a request that
  finishes at time ``t`` frees its slot for the step that runs from ``t``.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional

CellKind = Literal["prefill", "decode", "pad"]
SCHEDULERS = ("static", "continuous")


@dataclass(frozen=True)
class Workload:
    """Requests (lengths, arrival steps) plus the machine (slots, prefill cost)."""

    lengths: tuple[int, ...]
    arrivals: tuple[int, ...]
    slots: int
    prefill_cost: int = 0

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("need at least one request")
        if len(self.arrivals) != len(self.lengths):
            raise ValueError(
                f"{len(self.lengths)} lengths but {len(self.arrivals)} arrivals")
        if any(k < 1 for k in self.lengths):
            raise ValueError("every length must be >= 1 token")
        if any(a < 0 for a in self.arrivals):
            raise ValueError("arrival steps must be >= 0")
        if self.slots < 1:
            raise ValueError("slots must be >= 1")
        if self.prefill_cost < 0:
            raise ValueError("prefill cost must be >= 0")

    @classmethod
    def make(cls, lengths: list[int], arrivals: Optional[list[int]] = None,
             slots: int = 4, prefill_cost: int = 0) -> "Workload":
        """Build a workload; ``arrivals`` defaults to everyone at step 0."""
        arr = arrivals if arrivals is not None else [0] * len(lengths)
        return cls(tuple(lengths), tuple(arr), slots, prefill_cost)

    @property
    def num_requests(self) -> int:
        return len(self.lengths)

    def arrival_order(self) -> list[int]:
        """Request ids sorted by arrival step; ties keep input order."""
        return sorted(range(self.num_requests), key=lambda i: (self.arrivals[i], i))

    def occupancy(self, i: int) -> int:
        """Consecutive steps request ``i`` holds a slot while computing."""
        return self.prefill_cost + self.lengths[i]


def random_workload(n: int, min_len: int, max_len: int, seed: int, slots: int,
                    max_arrival: int = 0, prefill_cost: int = 0) -> Workload:
    """``n`` requests with uniform lengths in [min_len, max_len] and arrivals in [0, max_arrival]."""
    if n < 1 or min_len < 1 or max_len < min_len or max_arrival < 0:
        raise ValueError("need n >= 1, 1 <= min_len <= max_len, max_arrival >= 0")
    rng = random.Random(seed)
    lengths = [rng.randint(min_len, max_len) for _ in range(n)]
    arrivals = [rng.randint(0, max_arrival) for _ in range(n)]
    return Workload.make(lengths, arrivals, slots, prefill_cost)


@dataclass
class RequestRecord:
    """What happened to one request (steps as defined in the module docstring)."""

    id: int
    arrival: int
    length: int
    slot: int
    start: int
    finish: int
    handed_back: int
    held_until: int  # steps done when its slot is free again (> finish only for static padding)

    @property
    def wait(self) -> int:
        return self.start - self.arrival

    def to_dict(self) -> dict:
        d = asdict(self)
        d["wait"] = self.wait
        return d


@dataclass(frozen=True)
class Cell:
    """Occupant of one slot during one step."""

    request: int
    kind: CellKind


@dataclass
class StepStats:
    """Counters of one step, plus what the user has received by its end."""

    step: int  # its number, counting from 1: the steps done at its end
    busy_slots: int
    tokens: int
    utilisation: float
    cumulative_utilisation: float
    handed_back: list[int]
    handed_back_total: int


@dataclass
class SimResult:
    """Outcome of one scheduler on one workload."""

    scheduler: str
    workload: Workload
    requests: list[RequestRecord]
    timeline: list[list[Optional[Cell]]] = field(init=False)

    def __post_init__(self) -> None:
        self.timeline = _build_timeline(self.requests, self.total_steps,
                                        self.workload.slots, self.workload.prefill_cost)

    @property
    def total_steps(self) -> int:
        return max(r.finish for r in self.requests)

    @property
    def total_tokens(self) -> int:
        return sum(self.workload.lengths)

    @property
    def useful_slot_steps(self) -> int:
        return sum(c is not None and c.kind != "pad" for row in self.timeline for c in row)

    @property
    def utilisation(self) -> float:
        return self.useful_slot_steps / (self.total_steps * self.workload.slots)

    @property
    def tokens_per_step(self) -> float:
        return self.total_tokens / self.total_steps

    def per_step(self) -> list[StepStats]:
        """One :class:`StepStats` per step, in order."""
        slots = self.workload.slots
        back: dict[int, list[int]] = {}
        for r in self.requests:
            back.setdefault(r.handed_back, []).append(r.id)
        out, useful, returned = [], 0, 0
        for t, row in enumerate(self.timeline):
            busy = sum(c is not None and c.kind != "pad" for c in row)
            tokens = sum(c is not None and c.kind == "decode" for c in row)
            useful += busy
            now = sorted(back.get(t + 1, []))
            returned += len(now)
            out.append(StepStats(t + 1, busy, tokens, busy / slots,
                                 useful / ((t + 1) * slots), now, returned))
        return out

    def to_dict(self) -> dict:
        """JSON-ready summary, per-request records, per-step stats and timeline."""
        return {
            "scheduler": self.scheduler,
            "total_steps": self.total_steps,
            "useful_slot_steps": self.useful_slot_steps,
            "utilisation": self.utilisation,
            "tokens": self.total_tokens,
            "tokens_per_step": self.tokens_per_step,
            "requests": [r.to_dict() for r in self.requests],
            "per_step": [asdict(s) for s in self.per_step()],
            "timeline": [[None if c is None else asdict(c) for c in row]
                         for row in self.timeline],
        }


def _build_timeline(records: list[RequestRecord], steps: int, slots: int,
                    prefill_cost: int) -> list[list[Optional[Cell]]]:
    grid: list[list[Optional[Cell]]] = [[None] * slots for _ in range(steps)]
    for r in records:
        for t in range(r.start, r.held_until):
            if grid[t][r.slot] is not None:  # a scheduler bug, never a user error
                raise AssertionError(f"slot {r.slot} holds two requests at step {t}")
            kind: CellKind = ("prefill" if t < r.start + prefill_cost
                              else "decode" if t < r.finish else "pad")
            grid[t][r.slot] = Cell(r.id, kind)
    return grid


def simulate_static(w: Workload) -> SimResult:
    """Padded static batching (see the module docstring for the exact rules)."""
    order = w.arrival_order()
    records: list[RequestRecord] = []
    prev_end = 0
    for g in range(0, len(order), w.slots):
        group = order[g:g + w.slots]
        start = max(max(w.arrivals[i] for i in group), prev_end)
        end = start + max(w.occupancy(i) for i in group)
        for slot, i in enumerate(group):
            finish = start + w.occupancy(i)
            records.append(RequestRecord(i, w.arrivals[i], w.lengths[i], slot,
                                         start, finish, handed_back=end, held_until=end))
        prev_end = end
    records.sort(key=lambda r: r.id)
    return SimResult("static", w, records)


def simulate_continuous(w: Workload) -> SimResult:
    """Iteration-level (continuous) batching (see the module docstring)."""
    pending = w.arrival_order()
    free_from = [0] * w.slots  # time (steps done) at which each slot is free again
    records: list[RequestRecord] = []
    t = 0
    while pending:
        for slot in range(w.slots):
            # pending is sorted by arrival, so if the head has not arrived, none has
            if pending and free_from[slot] <= t and w.arrivals[pending[0]] <= t:
                i = pending.pop(0)
                finish = t + w.occupancy(i)
                records.append(RequestRecord(i, w.arrivals[i], w.lengths[i], slot,
                                             t, finish, handed_back=finish, held_until=finish))
                free_from[slot] = finish
        if pending:
            # jump to the first time with a free slot AND the next request arrived
            t = max(t + 1, min(free_from), w.arrivals[pending[0]])
    records.sort(key=lambda r: r.id)
    return SimResult("continuous", w, records)


def simulate(w: Workload) -> dict[str, SimResult]:
    """Run both schedulers; keys are ``"static"`` and ``"continuous"``."""
    return {"static": simulate_static(w), "continuous": simulate_continuous(w)}
