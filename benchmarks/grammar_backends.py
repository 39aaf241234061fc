"""Grammar libraries for structured output, measured on SmolLM2's tokenizer (49,152 ids):
compile time of a typical JSON schema and of "any JSON object", and the per-token
cost at a batch of 32 (filling 32 masks, and advancing 32 matchers by one token).

    python benchmarks/grammar_backends.py                      # xgrammar (a dependency)
    pip install --target /tmp/grammar_libs llguidance==1.9.1 outlines-core==0.2.14
    PYTHONPATH=/tmp/grammar_libs python benchmarks/grammar_backends.py --libs xgrammar,llguidance,outlines

Times are wall-clock (a shared machine makes them noisy: compare within one run).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from inflight.loader import default_model_path, load_tokenizer

VOCAB, BATCH = 49152, 32
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city"]},
    "status": {"enum": ["active", "inactive"]}}, "required": ["name", "age", "status"], "additionalProperties": False}
SCHEMA_TEXT = json.dumps({"name": "Alice Smith", "age": 31, "tags": ["a", "bb"], "address": {"city": "Paris"},
                          "status": "active"})
OBJECT_TEXT = json.dumps({"title": "A short story", "words": [1, 2, 3], "nested": {"ok": True, "note": "quick fox"}})


def ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1e3:.2f} / mean {statistics.mean(values) * 1e3:.2f} ms"


def timed(fn) -> tuple[object, float]:
    t = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t


def per_token(tokens: list[int], fill, advance) -> tuple[list[float], list[float]]:
    """Wall time of fill() (32 masks) and advance(token) (32 matchers) at each token of a text."""
    fills, advances = [], []
    for t in tokens:
        fills.append(timed(fill)[1])
        advances.append(timed(lambda: advance(t))[1])
    return fills, advances


def bench_xgrammar(tok) -> None:
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB, stop_token_ids=[tok.eos_token_id])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    grammars = {"schema": compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False),
                "json_object": compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)}
    schema_ms = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA)))[1] * 1e3
    object_ms = timed(lambda: compiler.compile_json_schema('{"type": "object"}'))[1] * 1e3
    print(f"xgrammar  compile schema {schema_ms:.1f} ms, json_object {object_ms:.1f} ms")
    for name, text in (("schema", SCHEMA_TEXT), ("json_object", OBJECT_TEXT)):
        matchers = [xgr.GrammarMatcher(grammars[name]) for _ in range(BATCH)]
        bitmask = xgr.allocate_token_bitmask(BATCH, VOCAB)

        def fill():
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, i)

        def advance(t):
            for m in matchers:
                assert m.accept_token(t)
        fills, advances = per_token(tok(text, add_special_tokens=False).input_ids, fill, advance)
        print(f"xgrammar  {name}: fill x{BATCH} {ms(fills)}; advance x{BATCH} {ms(advances)}")


def bench_llguidance(tok) -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch as lgt
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=VOCAB)
    grammars = {"schema": llguidance.LLMatcher.grammar_from_json_schema(SCHEMA),
                "json_object": llguidance.LLMatcher.grammar_from_json_schema({"type": "object"})}
    # NOTE: llguidance compiles lazily: the first masks of a new matcher pay part of it
    print(f"llguidance compile schema {timed(lambda: llguidance.LLMatcher(lt, grammars['schema']))[1] * 1e3:.1f} ms,"
          f" json_object {timed(lambda: llguidance.LLMatcher(lt, grammars['json_object']))[1] * 1e3:.1f} ms")
    executor = llguidance.LLExecutor(num_threads=2)
    for name, text in (("schema", SCHEMA_TEXT), ("json_object", OBJECT_TEXT)):
        matchers = [llguidance.LLMatcher(lt, grammars[name]) for _ in range(BATCH)]
        bitmask = lgt.allocate_token_bitmask(BATCH, VOCAB)

        def fill():
            lgt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

        def advance(t):
            for m in matchers:
                assert m.consume_token(t)
        fills, advances = per_token(tok(text, add_special_tokens=False).input_ids, fill, advance)
        print(f"llguidance {name}: fill x{BATCH} {ms(fills)}; advance x{BATCH} {ms(advances)}")


def bench_outlines(tok) -> None:
    import torch
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    tokens: dict[bytes, list[int]] = {}
    for s, i in tok.get_vocab().items():
        if i != tok.eos_token_id:
            tokens.setdefault(bytes(byte_of[c] for c in s) if all(c in byte_of for c in s) else s.encode(), []).append(i)
    vocab = Vocabulary(tok.eos_token_id, tokens)
    index, t_schema = timed(lambda: Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab))
    _, t_object = timed(lambda: Index(build_regex_from_schema('{"type": "object"}'), vocab))
    print(f"outlines  compile schema {t_schema * 1e3:.1f} ms, json_object {t_object * 1e3:.1f} ms")
    guides = [Guide(index) for _ in range(BATCH)]
    bitmask = torch.zeros(BATCH, (VOCAB + 31) // 32, dtype=torch.int32)

    def fill():
        for i, g in enumerate(guides):
            g.write_mask_into(bitmask[i].data_ptr(), bitmask[i].numel(), 4)

    def advance(t):
        for g in guides:
            g.advance(t)
    fills, advances = per_token(tok(SCHEMA_TEXT, add_special_tokens=False).input_ids, fill, advance)
    print(f"outlines  schema: fill x{BATCH} {ms(fills)}; advance x{BATCH} {ms(advances)}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character map (byte-level BPE vocabularies spell bytes this way)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--libs", default="xgrammar", help="comma-separated: xgrammar, llguidance, outlines")
    args = p.parse_args()
    tok = load_tokenizer(default_model_path())
    runners = {"xgrammar": bench_xgrammar, "llguidance": bench_llguidance, "outlines": bench_outlines}
    for name in args.libs.split(","):
        runners[name](tok)


if __name__ == "__main__":
    main()
