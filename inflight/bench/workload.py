"""Synthetic workloads of the same shapes as the project's reference sets
(chat, decode, longprompt, prefix, smoke), reproducible from a seed; and
``longcontext``: a few streams over long contexts (one user's agent or RAG session),
where decode attention, not the weights, sets the pace of each token.

Prompts are whole-word vocabulary tokens, so a prompt of N words encodes to
about N tokens; ``max_tokens`` is the exact output length (send with ignore_eos).
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from typing import Callable, Optional


@dataclass
class WorkloadRequest:
    """One benchmark request."""

    id: str
    prompt: str
    prompt_tokens: int
    max_tokens: int


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma)))))


# name -> (count, prompt length sampler, output length sampler, shared prefix length)
_SHAPES: dict[str, tuple[int, Callable, Callable, int]] = {
    "chat": (128, lambda r: _lognormal(r, 150, 0.8, 16, 1024), lambda r: _lognormal(r, 86, 0.8, 8, 512), 0),
    "decode": (96, lambda r: r.randint(12, 65), lambda r: _lognormal(r, 138, 0.9, 16, 768), 0),
    "longprompt": (64, lambda r: _lognormal(r, 1000, 0.6, 256, 3072), lambda r: _lognormal(r, 57, 0.7, 12, 252), 0),
    "prefix": (96, lambda r: r.randint(16, 184), lambda r: _lognormal(r, 60, 0.6, 8, 212), 512),
    "smoke": (16, lambda r: r.randint(12, 76), lambda r: r.randint(8, 30), 0),
    "longcontext": (4, lambda r: r.randint(1500, 3500), lambda r: 256, 0),
}
WORKLOADS = tuple(_SHAPES)


def word_vocabulary(tokenizer) -> list[str]:
    """Vocabulary entries that are one whole lowercase word with a leading space."""
    words = []
    for tok, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if tok.startswith("Ġ") and tok[1:].isalpha() and tok[1:].islower() and len(tok) > 3:
            words.append(tok[1:])
    if len(words) < 100:
        raise ValueError("tokenizer has too few whole-word tokens to build a workload")
    return words


def generate(name: str, tokenizer, seed: int = 0, num_requests: Optional[int] = None,
             shape: Optional[tuple] = None) -> list[WorkloadRequest]:
    """Build workload ``name`` (one of WORKLOADS); lengths are counted with ``tokenizer``."""
    if name not in _SHAPES and shape is None:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    count, plen, olen, prefix_len = shape or _SHAPES[name]
    rng = random.Random(seed)
    words = word_vocabulary(tokenizer)
    prefix = " ".join(rng.choice(words) for _ in range(prefix_len))
    out = []
    for i in range(num_requests or count):
        body = " ".join(rng.choice(words) for _ in range(plen(rng)))
        text = f"{prefix} {body}" if prefix else body
        n = len(tokenizer(text, add_special_tokens=False).input_ids)
        out.append(WorkloadRequest(f"{name}-{i}", text, n, olen(rng)))
    return out


def custom(num_requests: int, input_len: tuple[int, int], output_len: tuple[int, int], tokenizer,
           seed: int = 0, distribution: str = "uniform", prefix_len: int = 0) -> list[WorkloadRequest]:
    """Random lengths: uniform in [lo, hi], or lognormal with median (lo+hi)/2 clipped to [lo, hi]."""
    def sampler(lo: int, hi: int):
        if distribution == "lognormal":
            return lambda r: _lognormal(r, (lo + hi) / 2, 0.7, lo, hi)
        return lambda r: r.randint(lo, hi)
    shape = (num_requests, sampler(*input_len), sampler(*output_len), prefix_len)
    return generate("custom", tokenizer, seed, shape=shape)


def load_jsonl(path: str) -> list[WorkloadRequest]:
    """Read ``{prompt, max_tokens[, id, prompt_tokens]}`` lines."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if line.strip():
                d = json.loads(line)
                out.append(WorkloadRequest(str(d.get("id", i)), d["prompt"], int(d.get("prompt_tokens", -1)),
                                           int(d["max_tokens"])))
    return out


def save_jsonl(reqs: list[WorkloadRequest], path: str) -> None:
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(asdict(r)) + "\n")
