"""Tiny random BERT / XLM-RoBERTa checkpoints for the encoder tests, and a BERT with a
WordPiece tokenizer (``[CLS] ... [SEP]``, token types for pairs) as all-MiniLM and
ms-marco-MiniLM ship."""
from __future__ import annotations

from pathlib import Path

import torch
import transformers

CONFIGS = {
    "bert": lambda: transformers.BertConfig(pad_token_id=0),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(pad_token_id=1, max_position_embeddings=130),
}


def encoder_model(kind: str) -> transformers.PreTrainedModel:
    cfg = CONFIGS[kind]()
    for key, val in dict(vocab_size=261, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=getattr(cfg, "max_position_embeddings"),
                         hidden_act="gelu", layer_norm_eps=1e-12).items():
        setattr(cfg, key, val)
    cfg.max_position_embeddings = 130 if kind == "xlm-roberta" else 128
    cfg.architectures = ["XLMRobertaModel" if kind == "xlm-roberta" else "BertModel"]
    torch.manual_seed(7)
    model = transformers.AutoModel.from_config(cfg).eval()
    distinct(model)
    return model


def distinct(model) -> None:
    """LayerNorms start at (1, 0) and biases at 0: make each tell apart."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.uniform_(-0.2, 0.2)


WORDS = ["where", "is", "the", "lighthouse", "on", "rock", "in", "harbour", "at", "dawn", "keeper", "light"]


def wordpiece_bert(root: Path, cross_encoder: bool) -> tuple[Path, transformers.PreTrainedTokenizerBase,
                                                               transformers.PreTrainedModel]:
    """(folder, tokenizer, transformers' model) under ``root``: a one-label
    BertForSequenceClassification whose pairs carry token types (a cross-encoder), or a
    BertModel (CLS-pooled embeddings)."""
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    # from the folder: transformers 5 ignores a vocab_file= argument (its name is vocab), and every
    # word would then be [UNK]
    tok = transformers.BertTokenizerFast.from_pretrained(str(root))
    assert len(tok) == 5 + len(WORDS) and tok.unk_token_id not in tok("where is the rock").input_ids
    cfg = encoder_model("bert").config
    cfg.vocab_size = len(tok)
    torch.manual_seed(4)
    if cross_encoder:
        cfg.num_labels, cfg.architectures = 1, ["BertForSequenceClassification"]
        model = transformers.BertForSequenceClassification(cfg).eval()
    else:
        model = transformers.BertModel(cfg).eval()
    distinct(model)
    with torch.no_grad():  # type 1 far from type 0, so a lost type shows
        (model.bert if cross_encoder else model).embeddings.token_type_embeddings.weight[1].uniform_(-2, 2)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    return root / "model", tok, model
