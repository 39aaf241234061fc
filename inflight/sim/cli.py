"""``inflight simulate`` and ``inflight trace view``: parsers and runners.

The main CLI (``inflight.entrypoints.cli``) wires these in::

    add_simulate_parser(subparsers)  # then: run_simulate(args) -> exit code
    add_trace_parser(subparsers)     # then: run_trace(args) -> exit code

``python -m inflight.sim.cli simulate ...`` / ``... trace view ...`` works too.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from inflight.sim.examples import EXAMPLES
from inflight.sim.report import CONVENTION, format_table, to_document, to_json
from inflight.sim.simulator import Workload, random_workload, simulate


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def add_simulate_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand to an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "simulate", help="simulate static vs continuous batching step by step",
        description="Discrete-step simulator of static and continuous batching. Times count "
                    "steps done, as the continuous-batching explainers count them: "
                    + CONVENTION + ".")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--lengths", type=_int_list, metavar="K1,K2,...",
                     help="output tokens of each request, e.g. 6,2,1,3")
    src.add_argument("--random", type=int, metavar="N", help="N random requests instead")
    src.add_argument("--example", choices=sorted(EXAMPLES),
                     help="a worked example of the explainers: "
                          + "; ".join(f"{e.name}: {e.description}" for e in EXAMPLES.values()))
    p.add_argument("--arrivals", type=_int_list, metavar="A1,A2,...",
                   help="arrival step of each request (default: all 0); with --lengths")
    p.add_argument("--min-len", type=int, default=1, help="--random: shortest request")
    p.add_argument("--max-len", type=int, default=32, help="--random: longest request")
    p.add_argument("--max-arrival", type=int, default=0,
                   help="--random: arrivals uniform in [0, this] (default 0: all at once)")
    p.add_argument("--seed", type=int, default=0, help="--random: RNG seed")
    p.add_argument("--slots", type=int, default=None,
                   help="batch slots (default 4, or the example's)")
    p.add_argument("--prefill-cost", type=int, default=None, metavar="STEPS",
                   help="steps a request spends in its slot before its first token "
                        "(default 0: prefill ignored, or the example's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--html", metavar="PATH", help="write the step-through page here")
    p.add_argument("--png", metavar="PATH", help="write a timeline picture here")
    return p


def _workload(args: argparse.Namespace) -> Workload:
    slots = 4 if args.slots is None else args.slots
    prefill_cost = 0 if args.prefill_cost is None else args.prefill_cost
    if args.lengths is None and args.arrivals is not None:
        raise ValueError("--arrivals goes with --lengths; use --max-arrival with --random")
    if args.example is not None:
        w = EXAMPLES[args.example].workload
        # --slots / --prefill-cost ask "what if" of the example's requests
        return Workload(w.lengths, w.arrivals,
                        w.slots if args.slots is None else args.slots,
                        w.prefill_cost if args.prefill_cost is None else args.prefill_cost)
    if args.random is not None:
        return random_workload(args.random, args.min_len, args.max_len, args.seed,
                               slots, args.max_arrival, prefill_cost)
    return Workload.make(args.lengths, args.arrivals, slots, prefill_cost)


def run_simulate(args: argparse.Namespace) -> int:
    """Run both schedulers; print the table (or JSON); write --html / --png."""
    try:
        results = simulate(_workload(args))
    except ValueError as e:
        print(f"inflight simulate: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(to_json(results))
    else:
        if args.example is not None:
            ex = EXAMPLES[args.example]
            changed = "" if results["static"].workload == ex.workload else \
                " (the table uses the --slots / --prefill-cost given)"
            print(f"example {ex.name}: {ex.description}{changed}")
        print(format_table(results))
    if args.html or args.png:
        from inflight.sim.render import write_html, write_png  # matplotlib only when asked
        from inflight.sim.views import sim_page

        page = sim_page(results, to_document(results))
        # stdout may be JSON being piped somewhere: report files on stderr
        if args.html:
            print(f"wrote {write_html(page, args.html)}", file=sys.stderr)
        if args.png:
            print(f"wrote {write_png(page, args.png)}", file=sys.stderr)
    return 0


def add_trace_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``trace`` (with its ``view`` action) to an ``add_subparsers()`` object."""
    p = subparsers.add_parser("trace", help="look at engine step traces (--trace-file)")
    actions = p.add_subparsers(dest="trace_command", required=True)
    v = actions.add_parser("view", help="render a trace as a step-through HTML page")
    v.add_argument("path", help="JSON-lines file written with --trace-file")
    v.add_argument("--out", required=True, metavar="PAGE.html", help="HTML page to write")
    v.add_argument("--png", metavar="PATH", help="also write a timeline picture")
    v.add_argument("--title", default=None, help="page title (default: the file name)")
    return p


def run_trace(args: argparse.Namespace) -> int:
    """``trace view``: read the trace, write the page (and PNG)."""
    from inflight.sim.render import write_html, write_png
    from inflight.sim.trace import load_trace, trace_page

    try:
        steps = load_trace(args.path)
    except (OSError, ValueError) as e:
        print(f"inflight trace view: {e}", file=sys.stderr)
        return 2
    page = trace_page(steps, args.title or f"Engine trace: {args.path}")
    print(f"wrote {write_html(page, args.out)}")
    if args.png:
        print(f"wrote {write_png(page, args.png)}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Stand-alone entry point with just these two subcommands."""
    parser = argparse.ArgumentParser(prog="python -m inflight.sim.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    add_trace_parser(sub)
    args = parser.parse_args(argv)
    return run_simulate(args) if args.command == "simulate" else run_trace(args)


if __name__ == "__main__":
    sys.exit(main())
