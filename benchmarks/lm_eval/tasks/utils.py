"""Loaders for the local lm-eval tasks: the JSONL files next to this module, no download."""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    import datasets

    return datasets.load_dataset("json", data_files={"test": os.path.join(HERE, name)})


def load_mc(**kwargs):
    """inflight_mc.jsonl: question, choices, answer (the index of the right choice)."""
    return _load("inflight_mc.jsonl")


def load_gen(**kwargs):
    """inflight_gen.jsonl: question, answer (one word)."""
    return _load("inflight_gen.jsonl")


def answer_in_text(doc, results):
    """1.0 when the reply names the answer (case-insensitive): small models answer in sentences."""
    return {"contains_answer": float(doc["answer"].lower() in results[0].lower())}
