"""Peak RSS while loading a checkpoint, against the size of the loaded model.

Saves a random-weight Llama checkpoint with transformers (``--preset 1b``: Llama 3.2
1B's shape, 1.24 B parameters; ``small``: 46 M), then, in a fresh process per
dtype, loads it as the engine does (config, header check, parameters allocated in
the model dtype, ``load_weights`` streaming each tensor in) and reports the process's
peak RSS (VmHWM; ``resource.getrusage``'s ru_maxrss agrees when the parent is small,
but Linux carries a forking parent's peak across exec into it, so under pytest it
would report pytest's):

  overhead = (peak RSS - RSS before loading) / model bytes   (1.0: no copy besides the model)
  absolute = peak RSS / model bytes                           (includes the interpreter, torch, ...)

    python benchmarks/loader_rss.py --preset 1b --checkpoint-dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

PRESETS = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192},
               max_position_embeddings=131072),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=False),
}


def save_checkpoint(folder: str, preset: str, dtype: str) -> None:
    """A random-weight LlamaForCausalLM saved by transformers."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(**PRESETS[preset])
    cfg.architectures = ["LlamaForCausalLM"]
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(folder)


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith(key + ":"))
    return int(line.split()[1]) * 1024  # reported in kB


def measure(folder: str, dtype: str) -> dict:
    """Load ``folder`` into a model of ``dtype`` in this process; the RSS figures in bytes."""
    import torch

    from inflight.loader.hf import hf_config, hf_weights
    from inflight.loader.weights import check_weights
    from inflight.models.registry import ModelArchConfig, get_model_class
    from inflight.models.weight_loading import SkipParamInit

    dt = getattr(torch, dtype)
    config = hf_config(folder)
    weights = check_weights(hf_weights(folder), config, folder)
    arch = ModelArchConfig.from_hf(config)
    with torch.device("meta"), SkipParamInit():
        model = get_model_class(arch.architecture)(arch, None, 2048)
    model = model._apply(lambda t: torch.empty(t.shape, dtype=dt if t.is_floating_point() else t.dtype))
    before = _status_bytes("VmRSS")
    model.load_weights(weights)
    peak = _status_bytes("VmHWM")
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"dtype": dtype, "model_bytes": model_bytes, "before_bytes": before, "peak_bytes": peak,
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "overhead": (peak - before) / model_bytes, "absolute": peak / model_bytes}


def measure_in_subprocess(folder: str, dtype: str) -> dict:
    """``measure`` in a fresh interpreter, so its peak RSS is this load's alone."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", folder, dtype],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="1b")
    ap.add_argument("--checkpoint-dtype", default="bfloat16")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="model dtypes to load into")
    ap.add_argument("--folder", help="reuse (or create) the checkpoint here")
    ap.add_argument("--measure", nargs=2, metavar=("FOLDER", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or tmp
        if not os.path.exists(os.path.join(folder, "config.json")):
            subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                            f"import loader_rss; loader_rss.save_checkpoint({folder!r}, {args.preset!r}, "
                            f"{args.checkpoint_dtype!r})"], check=True)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        print(f"{args.preset} checkpoint, {args.checkpoint_dtype}: {size / 2**30:.2f} GiB of safetensors")
        for dtype in args.dtypes.split(","):
            r = measure_in_subprocess(folder, dtype)
            print(f"  load into {dtype:9s} model {r['model_bytes'] / 2**30:6.2f} GiB  peak RSS "
                  f"{r['peak_bytes'] / 2**30:6.2f} GiB  overhead {r['overhead']:.3f}x  absolute {r['absolute']:.3f}x")


if __name__ == "__main__":
    main()
