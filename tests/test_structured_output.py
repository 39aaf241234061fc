"""Structured output without the model: the constraint's validation, the request
mapping, the grammar state (drafts, rollback, EOS) and the batch mask op."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from inflight.core.outputs import SchedulerOutput
from inflight.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from inflight.errors import InvalidRequestError
from inflight.loader import default_model_path, load_tokenizer
from inflight.sampling_params import SamplingParams, StructuredOutputsParams
from inflight.structured_output.manager import StructuredOutputManager
from inflight.structured_output.masks import GrammarBitmask, GrammarMasks

VOCAB = 49152
EOS = 2
SCHEMA = {"type": "object", "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["age", "ok"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def manager(tok):
    return StructuredOutputManager(tok, VOCAB, (EOS,))


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def allowed(bitmask: torch.Tensor, row: int) -> set[int]:
    bits = (bitmask[row].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(torch.nonzero(bits.flatten()[:VOCAB]).flatten().tolist())


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one"),
    ({"regex": "a", "choice": ["a"]}, "exactly one"),
    ({"json": 3}, "structured_outputs.json"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": ["a", ""]}, "structured_outputs.choice"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"grammar": "x" * 70000}, "at most 65536 characters"),
    ({"structural_tag": "{not json"}, "structural_tag: not valid JSON"),
    ({"structural_tag": "[1]"}, "structural_tag: must be a JSON object"),
])
def test_params_validation(kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        StructuredOutputsParams(**kwargs)


def test_response_format_and_extension_map_onto_params():
    def params(**body):
        return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **body).to_sampling_params()

    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}
    assert params(response_format=fmt).structured_outputs == StructuredOutputsParams(json=SCHEMA)
    assert params(response_format={"type": "json_object"}).structured_outputs.json_object is True
    assert params(response_format={"type": "text"}).structured_outputs is None
    assert params(structured_outputs={"choice": ["a", "b"]}).structured_outputs.choice == ["a", "b"]
    assert params(structured_outputs={"json": SCHEMA}).structured_outputs.json == SCHEMA
    completion = CompletionRequest(prompt="x", structured_outputs={"regex": "[0-9]+"}).to_sampling_params()
    assert completion.structured_outputs.regex == "[0-9]+"
    with pytest.raises(InvalidRequestError, match="response_format"):
        params(response_format={"type": "json_schema", "json_schema": {"name": "p"}})
    with pytest.raises(InvalidRequestError, match="response_format"):
        params(response_format={"type": "json_object"}, structured_outputs={"regex": "a"})
    tag = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
           "triggers": ["<f"]}
    so = params(response_format=tag).structured_outputs
    assert json.loads(so.structural_tag) == {"structures": tag["structures"], "triggers": ["<f"]}
    assert params(structured_outputs={"structural_tag": "{}"}).structured_outputs.structural_tag == "{}"


@pytest.mark.parametrize("params, message", [
    (StructuredOutputsParams(json={"type": "strin"}), "invalid JSON schema: .*strin"),
    (StructuredOutputsParams(regex="a(b"), "invalid regex: .*parenthesis"),
    (StructuredOutputsParams(grammar="root ::= x"), "invalid grammar: .*\"x\" is not defined"),
    (StructuredOutputsParams(structural_tag='{"format": 5}'), "invalid structural tag: .*must be an object"),
    (StructuredOutputsParams(structural_tag='{"structures": [{"end": "x"}], "triggers": []}'),
     "invalid structural tag"),
])
def test_bad_constraints_name_the_problem_every_time(manager, params, message):
    for _ in range(2):  # the failure is cached, and raised again
        with pytest.raises(InvalidRequestError, match=message):
            manager.compile(params)


def test_compiled_once_per_constraint(manager):
    a = manager.compile(StructuredOutputsParams(json=SCHEMA))
    assert manager.compile(StructuredOutputsParams(json=dict(SCHEMA))) is a
    assert manager.compile(StructuredOutputsParams(json_object=True)) is not a


def test_masks_follow_the_grammar_and_allow_eos_at_its_end(manager, tok):
    state = manager.new_state(StructuredOutputsParams(choice=["yes", "no"]))
    bm = torch.full((2, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    state.fill_rows(bm, 0, ())
    first = allowed(bm, 0)
    assert ids(tok, "yes")[0] in first and ids(tok, "no")[0] in first
    assert ids(tok, "maybe")[0] not in first and EOS not in first
    assert state.accept_tokens(ids(tok, "yes"))
    state.fill_rows(bm, 1, ())
    assert allowed(bm, 1) == {EOS}
    assert state.accept_tokens([EOS]) and state.is_terminated
    assert not manager.new_state(StructuredOutputsParams(choice=["yes"])).accept_tokens(ids(tok, "no"))


def test_drafts_are_cut_where_the_grammar_rejects_them(manager, tok):
    state = manager.new_state(StructuredOutputsParams(json=SCHEMA))
    prefix = ids(tok, '{"age": ')
    assert state.accept_tokens(prefix)
    good, bad = ids(tok, "42, "), ids(tok, "true")  # a key must follow, not a value
    assert state.validate_tokens(good + bad) == len(good)
    # the state did not move: the same drafts validate again, and the masks start where it is
    assert state.validate_tokens(good) == len(good)
    drafts = tuple(good + bad)
    bm = torch.full((len(drafts) + 1, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    state.fill_rows(bm, 0, drafts)
    for i, t in enumerate(good):
        assert t in allowed(bm, i)  # row i is the mask after drafts[:i]
    assert bad[0] not in allowed(bm, len(good))
    assert len(allowed(bm, len(good) + 1)) == VOCAB  # after a rejected draft: never used, left open
    assert state.accept_tokens(good + ids(tok, '"ok": true}'))
    assert EOS in allowed(_fill(state), 0)


def _fill(state) -> torch.Tensor:
    bm = torch.full((1, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    state.fill_rows(bm, 0, ())
    return bm


def test_bitmask_applies_to_constrained_rows_only():
    V = 70  # not a multiple of 32: the last word's spare bits are ignored
    x = torch.randn(3, V)
    keep = [[0, 5, 69], [33, 64]]
    words = torch.zeros(3, 3, dtype=torch.int64)
    words[1] = 2**32 - 1  # row 1 is not constrained
    for row, toks in ((0, keep[0]), (2, keep[1])):
        for t in toks:
            words[row, t // 32] |= 1 << (t % 32)
    bitmask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # bit 31 is the sign bit
    before = x.clone()
    GrammarBitmask([0, 2], bitmask).apply(x)
    assert torch.equal(x[1], before[1])
    for row, toks in ((0, keep[0]), (2, keep[1])):
        finite = torch.isfinite(x[row]).nonzero().flatten().tolist()
        assert finite == toks and torch.equal(x[row, toks], before[row, toks])


@pytest.mark.parametrize("kind", ["mostly masked", "mostly allowed", "random"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_apply_equals_xgrammars_kernel(kind, dtype):
    # Mostly-masked batches take our own path, the others xgrammar's kernel: the same logits either way.
    import xgrammar

    gen = torch.Generator().manual_seed(len(kind))
    B, V = 6, 100
    words = torch.randint(-2**31, 2**31 - 1, (B, 4), generator=gen, dtype=torch.int64).to(torch.int32)
    if kind != "random":
        words[torch.rand(B, 4, generator=gen) < 0.8] = 0 if kind == "mostly masked" else -1
    rows = [0, 2, 3, 5]
    words[[1, 4]] = -1  # unconstrained rows are all-allowed
    x = torch.randn(B, V, generator=gen).to(dtype)
    expected = x.clone()
    xgrammar.apply_token_bitmask_inplace(expected, words, vocab_size=V, indices=rows)
    for r in (rows, list(range(B))):
        got = x.clone()
        GrammarBitmask(r, words).apply(got)
        assert torch.equal(got, expected)


def test_a_failing_matcher_fails_only_its_request(manager):
    class Broken:
        def fill_rows(self, *a):
            raise RuntimeError("broken matcher")

    class Req:
        def __init__(self, state):
            self.structured_output, self.num_computed_tokens, self.num_tokens = state, 4, 5

    good = manager.new_state(StructuredOutputsParams(json_object=True))
    requests = {"plain": Req(None), "bad": Req(Broken()), "good": Req(good)}
    sched = SchedulerOutput(num_scheduled_tokens={"plain": 1, "bad": 2, "good": 1},
                            scheduled_spec_decode_tokens={"bad": [7]})
    GrammarMasks(VOCAB).start(sched, requests)
    step = pickle.loads(pickle.dumps(sched.grammar_bitmask))  # what a worker process gets
    assert list(step.failed) == ["bad"]
    assert step.constrained == [False, False, True, False]
    assert step.select([("plain", 0), ("bad", 0), ("bad", 1)], torch.device("cpu")) is None
    picked = step.select([("plain", 0), ("good", 0)], torch.device("cpu"))
    assert picked.rows == [1] and picked.bitmask.shape == (2, (VOCAB + 31) // 32)
    assert (picked.bitmask[0] == -1).all() and not (picked.bitmask[1] == -1).all()


def test_a_grammar_that_allows_no_token_fails_its_request_as_bad_input(manager):
    # "root ::= root" compiles but accepts no string: its first mask is empty, and the
    # sampler would pick a token the grammar then rejects (a 500); the fill fails it as a 400
    from inflight.errors import InvalidRequestError

    class Req:
        def __init__(self, state):
            self.structured_output, self.num_computed_tokens, self.num_tokens = state, 4, 5

    requests = {"empty": Req(manager.new_state(StructuredOutputsParams(grammar="root ::= root"))),
                "good": Req(manager.new_state(StructuredOutputsParams(json_object=True)))}
    sched = SchedulerOutput(num_scheduled_tokens={"empty": 1, "good": 1})
    GrammarMasks(VOCAB).start(sched, requests)
    step = sched.grammar_bitmask.result()
    assert list(step.failed) == ["empty"] and isinstance(step.failed["empty"], InvalidRequestError)
    assert "allows no token" in str(step.failed["empty"])
    assert step.constrained == [False, True, False]


def test_sampling_params_carry_the_constraint():
    so = StructuredOutputsParams(regex="[a-z]+")
    assert SamplingParams(structured_outputs=so).structured_outputs is so
    with pytest.raises(InvalidRequestError, match="structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"})
