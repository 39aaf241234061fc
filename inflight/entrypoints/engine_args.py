"""Every engine setting as a command-line flag, spelled as in vLLM."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any

from inflight.config import CacheConfig, LoRAConfig, ModelConfig, ParallelConfig, SchedulerConfig

_HELP = {
    "model": "HF folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    "dtype": "auto | float32 | bfloat16 | float16",
    "max_logprobs": "most top logprobs a request may ask for, per token or per prompt token (default 20; -1: no cap)",
    "generation_config": "sampling defaults for unset request fields: auto (the model folder's "
                         "generation_config.json) | vllm (none) | a folder",
    "override_generation_config": 'JSON over those defaults, e.g. \'{"temperature": 0.5}\'',
    "runner": "auto | generate | pooling (embeddings of prompts: /v1/embeddings); auto picks pooling for a "
              "sentence-transformers folder (modules.json) or with --convert embed",
    "convert": "auto | none | embed (serve a *ForCausalLM checkpoint as an embedding model)",
    "pooler_config": 'a pooling model\'s pooler as JSON, e.g. \'{"pooling_type": "MEAN", "use_activation": true}\' '
                     "(pooling_type LAST | MEAN | CLS; default: the folder's sentence-transformers config, else LAST, "
                     "normalized)",
    "quantization": "the checkpoint's quantization method: gptq | awq | fp8 | compressed-tensors (default: "
                    "read from its config.json; its layers are dequantized into --dtype as they load)",
    "hf_overrides": 'JSON set over the folder\'s config.json (vLLM\'s), e.g. \'{"architectures": '
                    '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
                    '"is_original_qwen3_reranker": true}\' to serve Qwen3-Reranker as a reranker',
    "max_model_len": "longest prompt + output in tokens (default: the model's)",
    "kv_cache_memory": "bytes for the KV pool on CPU (default 2 GiB)",
    "max_num_seqs": "most requests running at once (default: the platform's; CPU 256, CUDA 256)",
    "max_num_batched_tokens": "token budget of one step (default: the platform's; CPU 1024, CUDA 2048)",
    "long_prefill_token_threshold": "cap on one request's prefill chunk per step (0: none)",
    "kv_cache_dtype": "auto (the model's dtype) | bfloat16 (a float32 model's KV in half the bytes, CPU) | "
                      "fp8 | fp8_e4m3",
    "scheduling_policy": "fcfs | priority",
    "preemption_mode": "recompute | swap",
    "swap_space": "GiB of host memory for swap preemption",
    "enable_prefix_caching": "share KV blocks of common prefixes",
    "enable_chunked_prefill": "split long prompts across steps",
    "data_parallel_size": "engine replicas, one process each with its share of the cores, behind one server "
                          "and a prefix-cache-aware router (serve only)",
    "data_parallel_backend": "mp (replica processes on this machine) | ray (Ray actors on any node; the model "
                             "path must exist there)",
    "tensor_parallel_size": "split the model over this many ranks (attention heads and MLP columns; "
                            "num_attention_heads must be divisible by it)",
    "distributed_executor_backend": "uni (in process, one rank) | mp (a worker process per rank) | "
                                    "ray (Ray actors); default: uni for one rank, mp for more",
}
_SKIP = {"model"}  # positional / handled by the subcommand
_PLATFORM_DEFAULT = {"max_num_seqs", "max_num_batched_tokens"}  # None: inflight/platforms decides


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add --max-num-seqs, --block-size, ... for every config field."""
    for cls in (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig):
        for f in fields(cls):
            if f.name in _SKIP:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.name == "served_model_name":  # vLLM's: one or more names; the first is reported
                parser.add_argument(flag, nargs="+", default=None, help="the names clients may ask for "
                                    "(default: the model's file or folder name)")
                continue
            default = f.default if f.default is not MISSING and f.name not in _PLATFORM_DEFAULT else None
            if isinstance(default, bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                    help=_HELP.get(f.name))
            else:
                typ = _type_of(f.type, default)
                parser.add_argument(flag, type=typ, default=default, help=_HELP.get(f.name))
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--trace-file", default=None, help="write one JSON line per engine step here")
    parser.add_argument("--attention-backend", default="auto",
                        help="auto | torch | cpu (the C paged kernel) | triton (CUDA kernels)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="CUDA: run every step eagerly (no CUDA graphs for decode-only steps)")
    parser.add_argument("--kv-transfer-config", default=None,
                        help='prefill/decode disaggregation as JSON, e.g. \'{"kv_role": "kv_producer", "kv_port": 14579}\' '
                             '(kv_producer | kv_consumer | kv_both; default: off)')
    parser.add_argument("--enable-lora", action="store_true",
                        help="serve LoRA adapters beside the base model (--lora-modules, or loaded at run time)")
    lora = LoRAConfig()
    parser.add_argument("--max-loras", type=int, default=lora.max_loras,
                        help=f"adapters one step may mix (default {lora.max_loras})")
    parser.add_argument("--max-lora-rank", type=int, default=lora.max_lora_rank,
                        help=f"the largest adapter rank accepted (default {lora.max_lora_rank})")
    parser.add_argument("--max-cpu-loras", type=int, default=None,
                        help="adapters kept loaded (default: --max-loras; least recently used go first)")
    parser.add_argument("--speculative-config", default=None,
                        help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
                             '"prompt_lookup_max": 4, "disable_by_batch_size": 16}\' (default: off)')


def _type_of(annotation: Any, default: Any):
    text = str(annotation)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str


def engine_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags as keyword arguments for ``LLM`` / ``LLMEngine.from_kwargs``."""
    kw: dict[str, Any] = {}
    for cls in (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig):
        for f in fields(cls):
            if hasattr(args, f.name):
                kw[f.name] = getattr(args, f.name)
    if isinstance(kw.get("served_model_name"), list):  # the engine knows the first name (metrics' label)
        kw["served_model_name"] = kw["served_model_name"][0]
    kw["device"] = args.device
    kw["trace_file"] = args.trace_file
    kw["attention_backend"] = args.attention_backend
    kw["enforce_eager"] = getattr(args, "enforce_eager", False)
    if getattr(args, "enable_lora", False):
        kw.update(enable_lora=True, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                  max_cpu_loras=args.max_cpu_loras)
    if getattr(args, "speculative_config", None):
        kw["speculative_config"] = args.speculative_config
    if getattr(args, "kv_transfer_config", None):
        kw["kv_transfer_config"] = args.kv_transfer_config
    return kw
