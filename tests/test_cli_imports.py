"""``inflight serve`` starts without importing what only other commands use: its
parser is built alone, so the proxy's and the benchmarks' imports (httpx, rich) and
torch wait until something needs them."""
import subprocess
import sys

from inflight.entrypoints.cli import build_parser

CHECK = """
import sys
from inflight.entrypoints.cli import build_parser
args = build_parser("serve").parse_args(["serve", "--port", "8123"])
assert args.port == 8123 and args.handler.__name__ == "run_serve"
print(sorted(m for m in ("httpx", "rich", "torch", "inflight.bench.serve", "inflight.entrypoints.proxy")
             if m in sys.modules))
"""


def test_the_serve_parser_imports_no_other_command():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_full_parser_still_has_every_command():
    choices = build_parser()._subparsers._group_actions[0].choices
    assert {"generate", "serve", "simulate", "trace", "bench", "proxy"} <= set(choices)
