"""Read a llama.cpp GGUF file into an HF-style config and float32 HF-named weights.

Four things differ from an HF checkpoint and are undone here:
- names: ``blk.N.attn_q.weight`` instead of ``model.layers.N.self_attn.q_proj.weight``;
- shapes: GGUF lists dimensions innermost first (``[in, out]``), the reverse of torch;
- for the llama architecture, llama.cpp's converter reorders the rows of Q and K
  inside each head (see ``_unpermute_qk``);
- mixture-of-experts types hold each projection of every expert in one stacked tensor
  (``blk.N.ffn_gate_exps``), read here as one HF tensor per expert.

Which llama.cpp types we read, their tensor names and whether Q/K are permuted
come from the architecture's ``ArchSpec`` (inflight/models). Tensors are
dequantized one at a time, when read (``GgufSource``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from inflight.models.registry import ArchSpec, arch_spec, spec_for_gguf

from .config import normalize_hf_config
from .stream import WeightSource
from .types import ModelLoadError, unsupported_architecture

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def open_gguf(path: str) -> Any:
    """Open ``path`` with gguf.GGUFReader; any parse failure becomes a ModelLoadError."""
    try:
        from gguf import GGUFReader

        # The reader memory-maps the file and parses every header up front, so a
        # truncated or garbage file fails here rather than half-way through loading.
        return GGUFReader(path, "r")
    except Exception as exc:  # gguf raises ValueError, struct/numpy errors, ...
        raise ModelLoadError(f"cannot read GGUF file {path}: {type(exc).__name__}: {exc}") from exc


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_architecture(reader: Any, source: str) -> tuple[str, str]:
    """Return (gguf architecture, HF architecture), refusing unsupported ones."""
    arch = _field(reader, "general.architecture")
    spec = spec_for_gguf(arch)
    if spec is None:
        raise unsupported_architecture(arch, source)
    hf_arch = spec.architecture
    # llama.cpp files Mistral models under "llama"; the name is the only hint left.
    if arch == "llama" and "mistral" in str(_field(reader, "general.name", "")).lower():
        hf_arch = "MistralForCausalLM"
    if arch == "llama" and _field(reader, "llama.expert_count"):  # and Mixtral too, with experts
        hf_arch = "MixtralForCausalLM"
    return arch, hf_arch


# Phi-3's LongRoPE factors, which llama.cpp's converter stores as tensors: read into the config
_ROPE_FACTORS = {"rope_factors_long": "long_factor", "rope_factors_short": "short_factor"}


def _rope_scaling(reader: Any, arch: str) -> dict[str, Any] | None:
    factors = {_ROPE_FACTORS[t.name.rpartition(".")[0]]: np.asarray(t.data, dtype=np.float32).ravel().tolist()
               for t in reader.tensors if t.name.rpartition(".")[0] in _ROPE_FACTORS}
    if factors:
        scaling = {"rope_type": "longrope", **factors,
                   "original_max_position_embeddings": _field(reader, f"{arch}.rope.scaling.original_context_length"),
                   "attention_factor": _field(reader, f"{arch}.rope.scaling.attn_factor")}
        return {k: v for k, v in scaling.items() if v is not None}
    rope_type = _field(reader, f"{arch}.rope.scaling.type")
    if rope_type in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": rope_type}
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if factor is not None:
        scaling["factor"] = float(factor)
    original = _field(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _tensor_rows(reader: Any, name: str) -> int | None:
    for tensor in reader.tensors:
        if tensor.name == name:
            return int(tensor.shape[-1])  # GGUF shape is reversed: last entry = rows
    return None


def gguf_hf_config(reader: Any, source: str) -> dict[str, Any]:
    """Translate GGUF metadata into a normalised HF-style config dict."""
    arch, hf_arch = gguf_architecture(reader, source)

    def meta(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    if isinstance(meta("attention.head_count_kv"), list):
        raise ModelLoadError(f"per-layer KV head counts are not supported: {source}")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    # The embedding's row count is what the model computes with; fall back to the token list.
    vocab = _tensor_rows(reader, "token_embd.weight") or (len(tokens.data) if tokens else None)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eot = _field(reader, "tokenizer.ggml.eot_token_id")  # chat models may end turns with it
    names = {t.name for t in reader.tensors}
    raw = {
        "architectures": [hf_arch],
        "hidden_size": meta("embedding_length"),
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": meta("attention.head_count"),
        "num_key_value_heads": meta("attention.head_count_kv"),
        "head_dim": meta("attention.key_length"),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": meta("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(reader, arch),
        "vocab_size": vocab,
        "max_position_embeddings": meta("context_length"),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos if eot is None or eot == eos else [eos, eot],
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",  # we dequantize everything to float32
        "gguf_file_type": _field(reader, "general.file_type"),
    }
    scaling = raw["rope_scaling"] or {}
    if scaling.get("rope_type") == "longrope":  # Phi3Config reads the pretraining length at the top level
        raw["original_max_position_embeddings"] = scaling.get("original_max_position_embeddings")
    head_dim = raw["head_dim"] or (raw["hidden_size"] // raw["num_attention_heads"] if raw["hidden_size"] else None)
    rotary = meta("rope.dimension_count")
    if rotary and head_dim and int(rotary) != int(head_dim):  # Phi-4-mini turns 96 of 128 dims
        raw["partial_rotary_factor"] = int(rotary) / int(head_dim)
    extra = arch_spec(hf_arch).gguf_config
    if extra is not None:
        raw.update(extra(meta))
    if meta("expert_count"):  # blocks without a router have a dense MLP (Qwen3-MoE's mlp_only_layers)
        dense = [i for i in range(int(meta("block_count") or 0)) if f"blk.{i}.ffn_gate_inp.weight" not in names]
        raw["mlp_only_layers"] = dense or None
    # Metadata the file lacks is left to the model type's defaults, not set to None.
    return normalize_hf_config({k: v for k, v in raw.items() if v is not None}, source)


@dataclass(frozen=True)
class _Entry:
    """A GGUF tensor, or (``expert`` set) one expert's slice of a stacked expert tensor."""

    tensor: Any
    expert: Optional[int] = None


def _hf_entries(tensor: Any, spec: ArchSpec, source: str) -> dict[str, _Entry]:
    """HF name -> entry for one GGUF tensor: one per expert for llama.cpp's stacked expert
    tensors (``blk.N.ffn_gate_exps`` holds every expert's gate projection)."""
    base, _, kind = tensor.name.rpartition(".")
    if base in _ROPE_FACTORS:  # read into the config's rope_scaling
        return {}
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        if part in spec.gguf_expert_tensors:
            path = f"model.layers.{layer}.{spec.gguf_expert_tensors[part]}.{kind}"
            return {path.format(e=e): _Entry(tensor, e) for e in range(int(tensor.shape[-1]))}
    return {_hf_name(tensor.name, spec, source): _Entry(tensor)}


def _hf_name(gguf_name: str, spec: ArchSpec, source: str) -> str:
    base, _, kind = gguf_name.rpartition(".")  # kind: "weight" or "bias"
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        if part in spec.gguf_tensors:
            return f"model.layers.{layer}.{spec.gguf_tensors[part]}.{kind}"
    elif base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{kind}"
    if base == "rope_freqs":
        # Llama 3.x frequency factors; dropping them would silently change every output.
        raise ModelLoadError(f"llama3-style rope_freqs tensors are not supported: {source}")
    raise ModelLoadError(f"unexpected tensor {gguf_name} in {source}")


def _unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation for one projection.

    HF's RoPE rotates the first half of each head against the second half;
    llama.cpp's kernel rotates adjacent pairs, so its converter reorders each
    head's rows from (2, head_dim/2) to (head_dim/2, 2). We swap them back.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _shape(entry: _Entry) -> list[int]:
    """Torch order (GGUF lists dimensions innermost first); an expert's slice drops the expert axis."""
    dims = [int(d) for d in reversed(entry.tensor.shape)]
    return dims if entry.expert is None else dims[1:]


def _dequantize(entry: _Entry) -> torch.Tensor:
    from gguf.quants import dequantize

    tensor = entry.tensor
    # the reader shapes quantized data as (..., rows, bytes per row), so an expert's rows are data[e]
    data = tensor.data if entry.expert is None else tensor.data[entry.expert]
    arr = np.asarray(dequantize(data, tensor.tensor_type), dtype=np.float32).reshape(_shape(entry))
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        # F32 tensors come back as views of the read-only memory map: copy so the
        # result outlives the reader and torch gets a writable buffer.
        arr = np.ascontiguousarray(arr).copy()
    return torch.from_numpy(arr)


class GgufSource(WeightSource):
    """The tensors of a GGUF file under their HF names and shapes, dequantized to
    float32 one at a time when read."""

    def __init__(self, reader: Any, hf_config: dict[str, Any], source: str) -> None:
        spec = arch_spec(hf_config["architectures"][0])  # Mistral and Mixtral share llama's GGUF type
        self.source = source
        self.permute = spec.gguf_permute_qk
        self.norm_offset = spec.gguf_norm_offset
        self.heads = {"q_proj": hf_config["num_attention_heads"], "k_proj": hf_config["num_key_value_heads"]}
        self.entries = {name: entry for t in reader.tensors for name, entry in _hf_entries(t, spec, source).items()}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(_shape(self.entries[name]))

    def dtype(self, name: str) -> torch.dtype:
        return torch.float32

    def read_into(self, name: str, out: torch.Tensor) -> None:
        entry = self.entries[name]
        try:
            value = _dequantize(entry)
        except Exception as exc:
            raise ModelLoadError(f"cannot dequantize {entry.tensor.name} in {self.source}: {exc}") from exc
        proj = name.split(".")[-2]
        if self.permute and proj in self.heads:
            value = _unpermute_qk(value, self.heads[proj])
        if self.norm_offset and name.endswith("norm.weight"):
            value = value - self.norm_offset
        out.copy_(value)


def gguf_weights(reader: Any, hf_config: dict[str, Any], source: str) -> GgufSource:
    """Every tensor under its HF name and shape, dequantized to float32 when read."""
    return GgufSource(reader, hf_config, source)
