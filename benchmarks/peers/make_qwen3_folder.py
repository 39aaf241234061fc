"""Write a random-weight dense Qwen3 of Qwen3-0.6B's shape as a Hugging Face folder, to
compare inflight and vLLM on a model of a size people run (both load HF folders).

    .venv/bin/python benchmarks/peers/make_qwen3_folder.py [--out DIR] [--layers 28] [--dtype float32]

Qwen3-0.6B's shape: 28 layers, hidden 1024, 16 query heads and 8 KV heads of head_dim 128
(so attention is 2048 wide, wider than the hidden size), MLP intermediate 3072, per-head q/k
RMSNorm, tied embeddings, RoPE base 1,000,000, RMSNorm eps 1e-6. The vocabulary is not
Qwen3's: its 151,936-token tokenizer is not available offline, so the folder carries the
embedded SmolLM2 tokenizer (49,152 tokens) as make_moe_folder.py does, and the workloads
tokenize as they do for SmolLM2. That makes the model about 490M parameters (1.96 GB in
float32) against the real 596M; the 28 decoder layers, which do nearly all the work per
token, are the real ones' size. The weights are transformers' random initialisation
(seeded), so the text is noise, which is fine for throughput with ``ignore_eos``. Prints the
folder's path and the command that runs the chat workload against vLLM.
"""
from __future__ import annotations

import argparse
import os
import sys

from make_moe_folder import print_compare_command, write_random_folder

DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "inflight-peers", "qwen3-0.6b-shape-hf")


def qwen3_config(vocab_size: int, layers: int = 28):
    """Qwen3-0.6B's config (its config.json's values) over ``vocab_size`` tokens."""
    import transformers

    cfg = transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
        use_sliding_window=False, max_window_layers=layers)
    cfg.architectures = ["Qwen3ForCausalLM"]
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write_random_folder(args.out, lambda vocab: qwen3_config(vocab, args.layers), args.dtype, args.seed)
    print_compare_command(args.out, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
