"""Compiler runs for the C kernel tests: independent sources compile at once, one
object each, then link (a single gcc call compiles its sources one after another)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def compile_all(cmds: list[list[str]]) -> subprocess.CompletedProcess | None:
    """Run the compiler commands at once (they are independent); the first that failed, or None."""
    procs = [(cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for cmd in cmds]
    failed = None
    for cmd, p in procs:
        out, err = p.communicate()
        if p.returncode != 0 and failed is None:
            failed = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    return failed


def build_executable(cc: str, flags: list[str], sources: list[tuple[Path, list[str]]], out: Path,
                     static: bool = False) -> subprocess.CompletedProcess:
    """``out`` from ``sources`` (each with its own extra compiler arguments), compiled in
    parallel. Returns the first failing compiler run, or the link."""
    cmds, objs = [], []
    for src, extra in sources:
        obj = out.with_name(f"{out.name}.{src.stem}.o")
        cmds.append([cc, *flags, *extra, "-c", str(src), "-o", str(obj)])
        objs.append(str(obj))
    failed = compile_all(cmds)
    if failed is not None:
        return failed
    return subprocess.run([cc, *flags, *objs, "-o", str(out), "-lm", *(["-static"] if static else [])],
                          capture_output=True, text=True)
