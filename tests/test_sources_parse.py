"""Every Python file in the repository parses under the oldest Python the project supports:
a benchmark that the test suite never imports would otherwise break unseen (an f-string
that only a newer Python accepts, say)."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = sorted(p for folder in ("inflight", "benchmarks", "tests") for p in (ROOT / folder).rglob("*.py"))


def _oldest_python() -> tuple[int, int]:
    spec = re.search(r'requires-python\s*=\s*">=\s*(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text())
    assert spec, "pyproject.toml names no lowest Python"
    return int(spec[1]), int(spec[2])


def test_every_source_parses():
    assert any(p.name == "compare.py" for p in SOURCES) and len(SOURCES) > 300
    version, broken = _oldest_python(), []
    for path in SOURCES:
        try:
            ast.parse(path.read_text(), filename=str(path), feature_version=version)
        except SyntaxError as e:
            broken.append(f"{path.relative_to(ROOT)}:{e.lineno}: {e.msg}")
    assert not broken, broken
