"""Engine settings, grouped as in vLLM (model, cache, scheduler)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

from inflight.distributed.kv_transfer.config import KVTransferConfig
from inflight.json_config import parse_json_config
from inflight.pooling.config import CONVERTS, RUNNERS, PoolerConfig


@dataclass
class ModelConfig:
    """Which weights to load and how: ``model`` is an HF folder or a .gguf file;
    None means the embedded SmolLM2-135M-Instruct."""

    model: Optional[str] = None
    tokenizer: Optional[str] = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # the checkpoint's quantization method (read from its config.json when None); a quantized
    # folder's layers are dequantized into ``dtype`` as they load (loader/quant)
    quantization: Optional[str] = None
    max_model_len: Optional[int] = None
    seed: int = 0
    served_model_name: Optional[str] = None
    max_logprobs: int = 20  # top logprobs a request may ask for (per token and per prompt token); -1: no cap
    # sampling defaults from the model's generation_config.json: "auto" | "vllm" (none) | a path
    generation_config: str = "auto"
    override_generation_config: Optional[Union[str, dict]] = None  # JSON text or dict, over the file's
    # pooling models (inflight/pooling): "pooling" serves embeddings (or a classifier's classes) of
    # prompts instead of generating; "auto" picks it for a sentence-transformers folder, a checkpoint
    # without a logits head (XModel, XForSequenceClassification) or with convert="embed"
    runner: str = "auto"  # auto | generate | pooling
    convert: str = "auto"  # auto | none | embed
    pooler_config: Optional[Union[str, dict, PoolerConfig]] = None  # JSON text, dict or PoolerConfig
    # vLLM's: JSON text or a dict set over the folder's config.json (e.g. a causal LM read as a
    # classifier: {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": [...]})
    hf_overrides: Optional[Union[str, dict]] = None


@dataclass
class CacheConfig:
    """The paged KV cache: block size, memory budget and prefix caching."""

    block_size: int = 16
    kv_cache_memory: Optional[int] = None  # bytes for the pool on CPU
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: Optional[int] = None
    enable_prefix_caching: bool = True
    # auto: the model's dtype; fp8 (= fp8_e4m3): float8_e4m3fn with a scale per token and KV head,
    # about twice the tokens of bfloat16 in the same memory (attention/kv_quant.py).
    kv_cache_dtype: str = "auto"
    swap_space: float = 0.0  # GiB of host memory for swap preemption
    num_cpu_blocks_override: Optional[int] = None  # host (swap) pool size in blocks, instead of swap_space


@dataclass
class SchedulerConfig:
    """Per-step budget and admission limits."""

    # None: the platform's default (EngineConfig.from_kwargs leaves them None when not given;
    # Platform.check_and_update_config fills them in before the scheduler is built).
    max_num_seqs: Optional[int] = 64
    max_num_batched_tokens: Optional[int] = 512
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no per-request chunk cap
    scheduling_policy: str = "fcfs"  # fcfs | priority
    preemption_mode: str = "recompute"  # recompute | swap (falls back to recompute when the host pool is full)
    # Admission keeps this fraction of KV blocks free while anything runs, so running
    # requests can grow without preempting the newcomer at once (vLLM's 1%).
    watermark: float = 0.01
    # After this many preemptions a request is never preempted again for newer work.
    max_preemptions_per_request: int = 3
    # Fairness: requests with max_tokens above the threshold (0: off) are long generations
    # and may hold at most this share of the max_num_seqs seats (see core/admission.py).
    long_generation_threshold: int = 0
    long_generation_seat_share: float = 0.75
    scheduling: str = "continuous"  # continuous | static (request-level batching, for comparison)
    static_padding: bool = True  # static only: finished members keep computing padding rows


@dataclass
class ParallelConfig:
    """How the engine is spread over processes (vLLM's ``ParallelConfig``).

    ``data_parallel_size`` N > 1 runs N full engine replicas, each in its own process
    with its share of the cores, behind one server and a prefix-cache-aware router
    (engine/dp/).

    ``tensor_parallel_size`` N > 1 splits the model over N ranks (inflight/distributed),
    run by the ``distributed_executor_backend``: ``uni`` (in the engine's process, one
    rank only), ``mp`` (one worker process per rank on this machine), ``ray`` (Ray
    actors, several machines); None: uni for one rank, mp for more (inflight/executor)."""

    data_parallel_size: int = 1
    data_parallel_backend: str = "mp"  # mp: spawned processes here | ray: Ray actors, any node of the cluster
    tensor_parallel_size: int = 1
    distributed_executor_backend: Optional[str] = None

    @property
    def world_size(self) -> int:
        """Ranks of one engine replica."""
        return self.tensor_parallel_size

    @property
    def executor_backend(self) -> str:
        """The backend in use: the setting, or the default for the world size."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uni" if self.world_size == 1 else "mp"

    def validate(self) -> None:
        if self.data_parallel_backend not in ("mp", "ray"):
            raise ValueError(f"data_parallel_backend must be 'mp' or 'ray', got {self.data_parallel_backend!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}")
        if self.distributed_executor_backend not in (None, "uni", "mp", "ray"):
            raise ValueError("distributed_executor_backend must be 'uni', 'mp' or 'ray', got "
                             f"{self.distributed_executor_backend!r}")
        if self.executor_backend == "uni" and self.world_size > 1:
            raise ValueError(f"distributed_executor_backend='uni' runs one rank; tensor_parallel_size="
                             f"{self.tensor_parallel_size} needs 'mp' or 'ray'")


@dataclass
class SpeculativeConfig:
    """Speculative decoding, vLLM's ``speculative_config``. ``method="ngram"``
    (prompt lookup) drafts up to ``num_speculative_tokens`` tokens per step by
    matching the last ``prompt_lookup_max`` .. ``prompt_lookup_min`` tokens
    against the request's earlier ones; one forward pass then verifies them all.
    Only plain greedy requests speculate (core/spec_decode.py)."""

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    # Draft only while fewer requests than this run (None: always). A CPU step is bound
    # by reading the weights until it has a few dozen rows: there drafts are nearly
    # free; in a full batch every rejected draft costs a row of compute.
    disable_by_batch_size: Optional[int] = None

    @classmethod
    def parse(cls, value: Any) -> Optional["SpeculativeConfig"]:
        """None, a SpeculativeConfig, a dict, or its JSON text (the CLI's form)."""
        return parse_json_config(cls, value, "speculative_config")

    def validate(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative_config method must be 'ngram', got {self.method!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be at least 1, got {self.num_speculative_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max, got "
                             f"{self.prompt_lookup_min} and {self.prompt_lookup_max}")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be at least 1, got {self.disable_by_batch_size}")


@dataclass
class LoRAConfig:
    """Serving LoRA adapters (vLLM's ``LoRAConfig``): requests name an adapter
    (``LoRARequest``) and run beside requests of other adapters and of the base model.
    ``max_loras``: adapters one step may mix (admission keeps the running batch within
    it); ``max_lora_rank``: the largest rank an adapter may have; ``max_cpu_loras``:
    adapters kept loaded in memory (None: ``max_loras``; least recently used go first)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    def validate(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")

    @property
    def num_cached(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


@dataclass
class EngineConfig:
    """Everything the engine needs; build it with :meth:`from_kwargs`."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    device: str = "auto"
    attention_backend: str = "auto"  # auto | torch | cpu | triton
    enforce_eager: bool = False  # CUDA: never replay CUDA graphs for decode-only steps (as in vLLM)
    trace_file: Optional[str] = None
    speculative_config: Optional[SpeculativeConfig] = None
    kv_transfer_config: Optional[KVTransferConfig] = None  # prefill/decode disaggregation
    lora_config: Optional[LoRAConfig] = None  # set by enable_lora=True (with max_loras, ...)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """Route flat vLLM-style keyword arguments to the right sub-config."""
        groups: dict[str, dict[str, Any]] = {"model": {}, "cache": {}, "sched": {}, "parallel": {}, "top": {},
                                             "lora": {}}
        names = {
            "model": {f.name for f in fields(ModelConfig)},
            "cache": {f.name for f in fields(CacheConfig)},
            "sched": {f.name for f in fields(SchedulerConfig)},
            "parallel": {f.name for f in fields(ParallelConfig)},
            "top": {"device", "trace_file", "attention_backend", "enforce_eager", "speculative_config",
                    "kv_transfer_config"},
            "lora": {"enable_lora"} | {f.name for f in fields(LoRAConfig)},
        }
        for key, value in kwargs.items():
            for group, known in names.items():
                if key in known:
                    groups[group][key] = value
                    break
            else:
                raise TypeError(f"unknown engine argument: {key!r}")
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            groups["sched"].setdefault(key, None)
        if "speculative_config" in groups["top"]:
            groups["top"]["speculative_config"] = SpeculativeConfig.parse(groups["top"]["speculative_config"])
        if "kv_transfer_config" in groups["top"]:
            groups["top"]["kv_transfer_config"] = KVTransferConfig.parse(groups["top"]["kv_transfer_config"])
        lora = groups["lora"]
        if lora.pop("enable_lora", False):
            groups["top"]["lora_config"] = LoRAConfig(**lora)
        elif lora:
            raise ValueError(f"{', '.join(sorted(lora))} need enable_lora=True")
        cfg = cls(ModelConfig(**groups["model"]), CacheConfig(**groups["cache"]),
                  SchedulerConfig(**groups["sched"]), ParallelConfig(**groups["parallel"]), **groups["top"])
        cfg.validate()
        return cfg

    def validate(self) -> None:
        s, c = self.scheduler_config, self.cache_config
        if s.max_num_seqs is not None and s.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {s.max_num_seqs}")
        if s.max_num_batched_tokens is not None and s.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {s.max_num_batched_tokens}")
        if self.parallel_config.data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be at least 1, got {self.parallel_config.data_parallel_size}")
        if c.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {c.block_size}")
        if s.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be 'fcfs' or 'priority', got {s.scheduling_policy!r}")
        if s.scheduling not in ("continuous", "static"):
            raise ValueError(f"scheduling must be 'continuous' or 'static', got {s.scheduling!r}")
        if s.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {s.preemption_mode!r}")
        self.parallel_config.validate()
        self._validate_runner()
        if self.lora_config is not None:
            self.lora_config.validate()
            if self.parallel_config.world_size > 1:
                raise ValueError("enable_lora runs with tensor_parallel_size=1 only")
        if self.speculative_config is not None:
            self.speculative_config.validate()
            if s.scheduling == "static":
                raise ValueError("speculative decoding needs scheduling='continuous'")
        self._validate_pressure()

    def _validate_runner(self) -> None:
        m = self.model_config
        if m.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {m.runner!r}")
        if m.convert not in CONVERTS:
            raise ValueError(f"convert must be one of {', '.join(CONVERTS)}, got {m.convert!r}")
        m.pooler_config = PoolerConfig.parse(m.pooler_config)
        if m.quantization is not None:
            from inflight.loader.quant.config import QUANTIZATION_CHOICES
            if m.quantization not in QUANTIZATION_CHOICES:
                raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, "
                                 f"got {m.quantization!r}")

    def _validate_pressure(self) -> None:
        """Settings for scheduling under pressure: swap, watermark, preemption cap, fairness, KV dtype."""
        s, c = self.scheduler_config, self.cache_config
        if c.kv_cache_dtype not in ("auto", "bfloat16", "fp8", "fp8_e4m3"):
            raise ValueError("kv_cache_dtype must be 'auto', 'bfloat16', 'fp8' or 'fp8_e4m3', "
                             f"got {c.kv_cache_dtype!r}")
        if c.swap_space < 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {c.swap_space}")
        if not 0.0 <= s.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {s.watermark}")
        if s.max_preemptions_per_request < 1:
            raise ValueError(f"max_preemptions_per_request must be at least 1, got {s.max_preemptions_per_request}")
        if s.long_generation_threshold < 0 or not 0.0 < s.long_generation_seat_share <= 1.0:
            raise ValueError("long_generation_threshold must be >= 0 and long_generation_seat_share in (0, 1]")
