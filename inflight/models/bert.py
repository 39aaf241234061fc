"""BERT and XLM-RoBERTa encoders, served as embedding models (all-MiniLM, bge, e5,
multilingual-e5, bge-m3 ship as ``BertModel`` / ``XLMRobertaModel``).

An encoder attends both ways: every token sees the whole prompt. So its prompt runs in one
step, whole, and nothing is cached: the engine turns chunked prefill and prefix caching off
for it (``ArchSpec.is_encoder_only``, as vLLM does) and its attention never reads or writes
the KV pool; each request's rows attend over each other only (layers/encoder_attention.py). Learned absolute positions
(XLM-RoBERTa's offset past its padding id), a token-type embedding (type 0: one text per
prompt), post-norm LayerNorms with biases and GELU. The linears are packed on the CPU like a
decoder's; the rest runs op by op.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.layers.classifier import EncoderClassificationHead
from inflight.layers.encoder_attention import EncoderAttention
from inflight.layers.layernorm import LayerNorm
from inflight.models.registry import ArchSpec, ModelArchConfig, arch_spec
from inflight.models.weight_loading import load_checkpoint
from inflight.pooling.token_types import TOKEN_ID_MASK, TOKEN_TYPE_SHIFT

_ACTS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
         "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}
# checkpoint prefixes of the task models an encoder is saved inside (BertForMaskedLM ...)
_PREFIXES = ("bert.", "roberta.", "model.")
# heads an embedding model does not run: BERT's next-sentence pooler, masked-LM heads; a
# cross-encoder runs its pooler and classifier, as its ``score``
_UNUSED = ("pooler.", "cls.", "lm_head.", "embeddings.position_ids", "classifier.")
# a cross-encoder's head tensors -> its ``score`` (EncoderClassificationHead)
_BERT_HEAD = (("pooler.dense.", "score.dense."), ("classifier.", "score.out_proj."))
_ROBERTA_HEAD = (("classifier.", "score."),)


class BertEmbeddings(nn.Module):
    """Token + position + token-type (0) embeddings, then LayerNorm."""

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.offset = cfg.position_offset
        self.typed = cfg.type_vocab_size > 1  # a cross-encoder's pairs carry types in their ids
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(max(cfg.type_vocab_size, 1), cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.typed:  # pooling/token_types.py: a pair's second text is type 1
            types, input_ids = input_ids >> TOKEN_TYPE_SHIFT, input_ids & TOKEN_ID_MASK
            x = self.word_embeddings(input_ids) + self.token_type_embeddings(types)
        else:
            x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(self.position_embeddings(positions + self.offset), x)[0]  # the sum lands in x


class BertSelfAttention(nn.Module):
    """Fused q/k/v with biases; each request's rows attend over each other, both ways."""

    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.nh, self.hd = cfg.num_attention_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * self.nh * self.hd)
        self.attn = EncoderAttention()

    def forward(self, x: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).view(-1, 3, self.nh, self.hd).transpose(0, 1).transpose(1, 2)  # [3][H, T, D]
        return self.attn(q, k, v, md)


class BertSelfOutput(nn.Module):
    """A projection, then LayerNorm over it plus the residual (post-norm)."""

    def __init__(self, cfg: ModelArchConfig, width: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width, cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # NOTE: the norm's second argument receives the sum: the fresh projection, not the input
        return self.LayerNorm(residual, self.dense(h))[0]


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)  # transformers' (and vLLM's) module names
        self.output = BertSelfOutput(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        return self.output(self.self(x, md), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        h = self.attention(x, md)
        return self.output(self.intermediate(h), h)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelArchConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))


class BertModel(nn.Module):
    """The encoder stack; ``forward`` returns the last layer's hidden states, which the
    pooler reads (CLS by default, MEAN where a sentence-transformers folder says so)."""

    # its attention reads only the step's rows: the builder allocates no KV pool behind the blocks
    uses_kv_cache = False

    def __init__(self, cfg: ModelArchConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg, max_positions)
        self.encoder = BertEncoder(cfg)
        self.rope = None  # learned positions: no table to build
        # a cross-encoder's head, which the pooler applies to the CLS row: RoBERTa's
        # (bge-reranker) or BERT's (ms-marco); checkpoint_rename maps its tensors here
        self.score = EncoderClassificationHead(cfg.hidden_size, cfg.num_labels) if cfg.num_labels else None

    def forward(self, input_ids, positions, kv_caches: list, md: AttentionMetadata) -> torch.Tensor:
        x = self.embeddings(input_ids, positions)
        for layer in self.encoder.layer:
            x = layer(x, md)
        return x

    def stacked_shard_rows(self) -> dict[str, list[int]]:
        """Rows of each shard of the fused projection, in shard order."""
        width = self.cfg.num_attention_heads * self.cfg.head_dim
        return {"qkv_proj": [width, width, width]}

    def checkpoint_rename(self, name: str) -> Optional[str]:
        """A checkpoint tensor's name in this model; None for one it does not load."""
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if self.score is not None:
            for theirs, ours in _BERT_HEAD if self.cfg.architecture.startswith("Bert") else _ROBERTA_HEAD:
                if name.startswith(theirs):
                    return ours + name[len(theirs):]
        return None if name.startswith(_UNUSED) else name

    def load_weights(self, weights) -> None:
        """Read HF-named checkpoint tensors into the parameters, fusing query/key/value."""
        load_checkpoint(self, arch_spec(self.cfg.architecture).stacked, weights)


def check_bert_config(c: Any) -> None:
    """ValueError for what this encoder does not implement."""
    kind = getattr(c, "position_embedding_type", None) or "absolute"
    if kind != "absolute":
        raise ValueError(f"position_embedding_type={kind!r} is not supported (absolute is)")
    if getattr(c, "hidden_act", "gelu") not in _ACTS:
        raise ValueError(f"hidden_act={c.hidden_act!r} is not supported")
    if getattr(c, "is_decoder", False):
        raise ValueError("a BERT decoder (is_decoder) is not supported")


_BERT_STACKED = {"query": ("qkv_proj", 0), "key": ("qkv_proj", 1), "value": ("qkv_proj", 2)}


def _encoder_spec(architecture: str, model_type: str) -> ArchSpec:
    return ArchSpec(architecture, model_type, BertModel, stacked=dict(_BERT_STACKED), check_config=check_bert_config,
                    is_encoder_only=True, positions_after_padding="roberta" in model_type, default_pooling_type="CLS")


ARCHITECTURES = tuple(_encoder_spec(arch, model_type) for arch, model_type in (
    ("BertModel", "bert"), ("BertForSequenceClassification", "bert"),
    ("XLMRobertaModel", "xlm-roberta"), ("XLMRobertaForSequenceClassification", "xlm-roberta"),
    ("RobertaModel", "roberta"), ("RobertaForSequenceClassification", "roberta")))
