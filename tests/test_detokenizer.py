"""Incremental detokenization on the tokenizers' Rust decoder: the same text as through
transformers' ``decode``, token by token."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.engine.detokenizer import IncrementalDetokenizer, rust_decoder
from inflight.loader import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


class DecodeOnly:
    """A tokenizer that offers transformers' ``decode`` and nothing under it."""

    def __init__(self, tok):
        self.decode = tok.decode


def run(tokenizer, prompt, ids, skip, stop):
    d = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip, stop=stop)
    deltas = []
    for i in ids:
        hit = d.add_token(i)
        deltas.append(d.take_delta(hit is not None))
        if hit is not None:
            break
    return deltas, d.text


def test_the_default_tokenizer_decodes_in_rust(tok):
    assert rust_decoder(tok) is tok.backend_tokenizer
    assert rust_decoder(DecodeOnly(tok)) is None


def test_a_tokenizer_that_cleans_up_spaces_keeps_transformers_decode(tok, monkeypatch):
    monkeypatch.setattr(tok, "clean_up_tokenization_spaces", True)
    assert rust_decoder(tok) is None


# ids from the special tokens, the byte pieces that split a UTF-8 character, and words
ID = st.one_of(st.integers(0, 16), st.integers(100, 400), st.integers(0, 49151))


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(ID, max_size=8), ids=st.lists(ID, min_size=1, max_size=24), skip=st.booleans(),
       stop=st.sampled_from([None, ["the"], [" a", "\n"]]))
def test_rust_and_transformers_decode_give_the_same_deltas(tok, prompt, ids, skip, stop):
    assert run(tok, prompt, ids, skip, stop) == run(DecodeOnly(tok), prompt, ids, skip, stop)


def test_a_character_split_over_tokens_waits_for_its_last_byte(tok):
    ids = tok.encode("a 🦩 b", add_special_tokens=False)  # the flamingo is three byte tokens
    deltas, text = run(tok, [], ids, True, None)
    assert text == "a 🦩 b"
    assert [d for d in deltas if d] == ["a", " 🦩", " b"]


def test_stop_strings_wait_for_min_tokens_as_in_vllm(tok):
    # " Paris. It is big." one word a token or so: "." ends the first sentence early on
    ids = tok.encode(" Paris. It is big. Yes.", add_special_tokens=False)
    first_dot = next(i for i in range(len(ids)) if "." in tok.decode(ids[:i + 1]))

    def stopped_at(min_tokens):
        d = IncrementalDetokenizer(tok, [], stop=["."], min_tokens=min_tokens)
        for n, i in enumerate(ids, 1):
            if d.add_token(i) is not None:
                return n, d.text
        return None, d.text

    assert stopped_at(0) == (first_dot + 1, " Paris")
    # held to min_tokens, the first "." is passed over and the next one after them stops it
    n, text = stopped_at(first_dot + 1)
    assert n > first_dot + 1 and text.startswith(" Paris. It") and not text.endswith(".")
    # a stop string that begins in the first min_tokens tokens' text and ends after them counts
    d = IncrementalDetokenizer(tok, [], stop=["s. It"], min_tokens=first_dot + 1)
    hit = next(h for h in map(d.add_token, ids) if h is not None)
    assert hit == "s. It" and d.text == " Pari"
