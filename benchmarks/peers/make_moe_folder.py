"""Write a random-weight mixture-of-experts model of realistic shape as a Hugging Face
folder, to compare inflight and vLLM on an MoE model (both load HF folders).

    .venv/bin/python benchmarks/peers/make_moe_folder.py [--arch mixtral] [--out DIR] [--layers 12]
        [--hidden 1024] [--intermediate 768] [--experts 8] [--top-k 2] [--dtype float32]

Default: Mixtral-shaped, 12 layers, hidden 1024, 16 heads of 64 (4 KV heads), 8
experts of intermediate 768, top-2: about 360M parameters (1.4 GB in float32), of
which about 125M pass through each token. The tokenizer (and chat template) is the
embedded SmolLM2's, so the project's workloads tokenize as they do for SmolLM2 and the
vocabulary is real; the weights are transformers' random initialisation (seeded), so
the text is noise, which is fine for throughput with ``ignore_eos``. Prints the
folder's path and the command that runs the chat workload against vLLM.
"""
from __future__ import annotations

import argparse
import os
import sys

DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "inflight-peers", "moe-{arch}-8x-top2-hf")
# architecture -> (config class name, the name of its experts-count field)
ARCHS = {"mixtral": ("MixtralConfig", "num_local_experts"), "qwen3_moe": ("Qwen3MoeConfig", "num_experts"),
         "olmoe": ("OlmoeConfig", "num_experts")}


def moe_config(arch: str, vocab_size: int, layers: int, hidden: int, intermediate: int, experts: int,
               top_k: int, heads: int, kv_heads: int):
    """The transformers config of the model to write."""
    import transformers

    cls_name, experts_field = ARCHS[arch]
    cls = getattr(transformers, cls_name)
    extra = {"moe_intermediate_size": intermediate, "norm_topk_prob": True} if arch == "qwen3_moe" else {}
    cfg = cls(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=8192,
              num_experts_per_tok=top_k, tie_word_embeddings=False, **{experts_field: experts}, **extra)
    cfg.architectures = [cls_name.replace("Config", "ForCausalLM")]
    return cfg


def make_moe_folder(out: str, arch: str = "mixtral", dtype: str = "float32", seed: int = 0, **shape) -> str:
    """Write the model and the embedded SmolLM2 tokenizer to ``out``; returns ``out``."""
    return write_random_folder(out, lambda vocab: moe_config(arch, vocab, **shape), dtype, seed)


def write_random_folder(out: str, make_config, dtype: str = "float32", seed: int = 0,
                        auto_class: str = "AutoModelForCausalLM") -> str:
    """Write a random-weight model of ``make_config(vocab_size)`` (a transformers config, built
    by transformers' ``auto_class``) and the embedded SmolLM2 tokenizer to ``out``; returns ``out``."""
    import torch
    import transformers

    from inflight.loader import load_tokenizer

    tokenizer = load_tokenizer(None)
    cfg = make_config(len(tokenizer))
    cfg.bos_token_id, cfg.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(seed)
    model = getattr(transformers, auto_class).from_config(cfg, dtype=getattr(torch, dtype))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)  # the chat template travels in tokenizer_config.json
    return out


def print_compare_command(out: str, dtype: str) -> None:
    """The folder's path and the command that runs the chat workload on it against vLLM."""
    print(out)
    print("chat workload, inflight against vLLM (on a quiet machine):\n"
          f"  .venv/bin/python benchmarks/peers/compare.py --workloads chat --hf-folder {out} "
          f"--inflight-model {out} --inflight-args \"--dtype {dtype}\" --vllm-args \"--dtype {dtype}\" --no-mfu")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="mixtral", choices=list(ARCHS))
    ap.add_argument("--out", default=None, help=f"the folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=768, help="each expert's")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = args.out or DEFAULT_OUT.format(arch=args.arch)
    make_moe_folder(out, args.arch, args.dtype, args.seed, layers=args.layers, hidden=args.hidden,
                    intermediate=args.intermediate, experts=args.experts, top_k=args.top_k, heads=args.heads,
                    kv_heads=args.kv_heads)
    print_compare_command(out, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
