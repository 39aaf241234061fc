"""Compiler runs for the C kernel tests: a check driver's sources compile at once, one
object each, then link against the kernel libraries the engine itself loads
(build.library_path: built once per level and source hash, shared by every test and the
engine's own runs)."""
from __future__ import annotations

import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from inflight.kernels.cpu import build
from inflight.kernels.cpu.isa import IsaLevel, machine_arch


def compile_all(cmds: list[list[str]]) -> subprocess.CompletedProcess | None:
    """Run the compiler commands at once (they are independent); the first that failed, or None."""
    procs = [(cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for cmd in cmds]
    failed = None
    for cmd, p in procs:
        out, err = p.communicate()
        if p.returncode != 0 and failed is None:
            failed = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    return failed


def executable_flags(level: IsaLevel, opt: str = "-O3") -> list[str]:
    """build.py's flags for ``level`` for an executable: no -shared/-fPIC; ``opt`` in place of
    -O3 (a compile-only check of a level the CPU cannot run needs no optimised code)."""
    return [opt if f.startswith("-O") else f for f in build.compile_flags(level) if f not in ("-shared", "-fPIC")]


def kernel_libraries(names: list[str], level: IsaLevel, cc: str | None = None) -> dict[str, str]:
    """``{name: path}`` of csrc/<name>.c's shared library for ``level``, as the engine builds
    it (a compiler per core at a time; ``cc``, the caller's compiler, builds them where
    ``level`` is another architecture's); an AssertionError with the compiler's message
    when one does not build."""
    cross_cc = cc if level.arch != machine_arch() else None
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        paths = dict(zip(names, pool.map(lambda n: build.library_path(n, level, cross_cc), names)))
    for name, path in paths.items():
        if path is None:  # build again, to show why
            with tempfile.TemporaryDirectory() as tmp:
                res = build.compile_library(name, level, f"{tmp}/{name}.so", cross_cc or os.environ.get("CC", "gcc"))
            raise AssertionError(f"{name} does not build for {level.arch} {level.name}:\n{res.stderr[-4000:]}")
    return paths


def build_executable(cc: str, flags: list[str], sources: list[tuple[Path, list[str]]], out: Path,
                     libraries: list[str], checks: list[list[str]] = ()) -> subprocess.CompletedProcess:
    """``out`` from ``sources`` (each with its own extra compiler arguments), compiled in
    parallel together with the compiler runs ``checks``, linked against the shared
    ``libraries`` (by path: the executable finds them where they are). Returns the first
    failing compiler run, or the link."""
    cmds, objs = list(checks), []
    for src, extra in sources:
        obj = out.with_name(f"{out.name}.{src.stem}.o")
        cmds.append([cc, *flags, *extra, "-c", str(src), "-o", str(obj)])
        objs.append(str(obj))
    failed = compile_all(cmds)
    if failed is not None:
        return failed
    # no-as-needed: kernels.h's weak references alone would not keep a library linked
    return subprocess.run([cc, *flags, *objs, "-Wl,--no-as-needed", *libraries, "-o", str(out), "-lm"],
                          capture_output=True, text=True)
