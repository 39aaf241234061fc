"""Rows the sampler cannot sample: every token excluded by the request's own constraints,
or logits its settings make infinite. Each is that request's error (a 400), found before
any random draw; the settings that would overflow float32 are refused up front."""
from __future__ import annotations

import pytest
import torch

from inflight.errors import InvalidRequestError
from inflight.sampling_params import SamplingParams
from inflight.worker.sampler import SamplingRow
from test_sampler import row, sample


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_with_no_token_left_is_a_bad_request_and_draws_nothing(temperature):
    # allowed_token_ids [2] and a bad word that is token 2: every token excluded. The row
    # must fail (a 400 for its request), not pick an arbitrary id, and before any draw:
    # the engine then samples the batch's other requests again, one at a time.
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    bad = row(output=[1], allowed_token_ids=[2], temperature=temperature)
    bad.params.bad_words_token_ids = [[2]]
    g = torch.Generator().manual_seed(5)
    seeded = SamplingRow(SamplingParams(seed=5), [], [], [], g)
    before = g.get_state()
    with pytest.raises(InvalidRequestError, match="no token is left to sample"):
        sample(logits, [seeded, bad])
    assert torch.equal(g.get_state(), before)
    assert sample(logits[:1], [seeded]).sampled_token_ids[0] in range(4)


def test_penalties_that_make_logits_infinite_fail_the_random_row():
    # a repetition penalty that is positive as a float32 but divides positive logits to +inf:
    # softmax over several +inf is NaN, where an unchecked draw picked the last id
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(InvalidRequestError, match="no token is left to sample"):
        sample(logits, [row(prompt=[1, 2], repetition_penalty=1e-40)])
    assert sample(logits, [row(prompt=[1, 2], repetition_penalty=1e-40, temperature=0)]).sampled_token_ids == [1]


def test_float32_limits_of_temperature_top_p_and_penalty():
    for kw in ({"temperature": 1e39}, {"top_p": 1e-46}, {"repetition_penalty": 1e-46},
               {"repetition_penalty": 1e39}):
        with pytest.raises(InvalidRequestError, match="float32"):
            SamplingParams(**kw)
    # as vLLM: below 1e-5 greedy, up to 0.01 raised to 0.01
    assert SamplingParams(temperature=1e-6).greedy
    assert SamplingParams(temperature=1e-3).temperature == 0.01
    assert SamplingParams(temperature=0.5).temperature == 0.5


def test_nan_logits_are_the_models_fault_not_the_requests():
    # a NaN row (a broken adapter, a model bug): a server error for that request, not a 400
    # blaming constraints it never set
    logits = torch.tensor([[1.0, float("nan"), 3.0, 4.0]])
    for kw in ({"temperature": 1.0}, {"temperature": 0.0, "allowed_token_ids": [1]}):
        with pytest.raises(RuntimeError, match="NaN") as info:
            sample(logits, [row(**kw)])
        assert not isinstance(info.value, InvalidRequestError)
    # a NaN the request's own mask leaves out does not matter
    assert sample(logits, [row(temperature=0.0, allowed_token_ids=[0, 2])]).sampled_token_ids == [2]
