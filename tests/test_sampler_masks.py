"""The sampler's per-row masks: vLLM's allowed_token_ids and bad_words, beside logit_bias."""
from __future__ import annotations

import torch

from inflight.sampling_params import SamplingParams
from inflight.worker.sampler import Sampler, SamplingMetadata, SamplingRow
from test_sampler import CPU, row, sample


def test_allowed_token_ids_restrict_their_rows_only():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    allowed = [7, 3, 41]
    rows = [row(temperature=0.0, allowed_token_ids=allowed), row(temperature=0.0),
            row(temperature=1.0, seed=5, allowed_token_ids=[9, 9, 12]), row(temperature=0.0, logprobs=2)]
    md = SamplingMetadata.from_rows(rows, 50, CPU)
    assert not md.greedy_only and rows[2].params.allowed_token_ids == [9, 12]  # deduplicated
    tokens = Sampler()(logits, md).sampled_token_ids
    assert tokens[0] == allowed[int(logits[0, allowed].argmax())]
    assert tokens[1] == int(logits[1].argmax()) and tokens[3] == int(logits[3].argmax())
    draws = {Sampler(torch.Generator().manual_seed(s))(logits[:1], SamplingMetadata.from_rows(
        [row(temperature=1.0, allowed_token_ids=[9, 12])], 50, CPU)).sampled_token_ids[0] for s in range(40)}
    assert draws == {9, 12}
    # a bias still moves tokens within the allowed set, never outside it
    biased = [row(temperature=0.0, allowed_token_ids=[1, 2], logit_bias={2: 100.0, 30: 100.0})]
    assert sample(logits[:1], biased).sampled_token_ids == [2]


def test_bad_words_ban_a_words_last_token_after_its_other_tokens():
    logits = torch.zeros(4, 20)
    logits[:, 5], logits[:, 6] = 3.0, 1.0  # 5 is every row's favourite, 6 the next
    logits[3, 4] = 5.0  # row 3 prefers 4
    multi = [[7, 8, 5], [9, 4]]  # banned only right after their other tokens
    rows = [(multi, [1, 7, 8]),  # ends with 7, 8: 5 is banned
            (multi, [7, 2]),  # no word's head ends the output: nothing banned
            (multi + [[5]], []),  # a one-token word is banned from the start
            (multi, [9])]  # ends with 9: 4 is banned
    rows = [SamplingRow(SamplingParams(temperature=0.0, bad_words=["w"], bad_words_token_ids=w), [], out, [])
            for w, out in rows]
    tokens = Sampler()(logits, SamplingMetadata.from_rows(rows, 20, CPU)).sampled_token_ids
    assert tokens == [6, 5, 6, 5]


def test_bad_words_token_ids_take_the_word_with_and_without_a_space():
    from inflight.sampling_params import bad_words_token_ids

    class Tok:
        vocab = {"cat": [10], " cat": [11], "ice cream": [3, 4], " ice cream": [12, 4], "a": [1], " a": [1]}

        def __call__(self, text, add_special_tokens=False):
            return type("Enc", (), {"input_ids": self.vocab[text]})()

    assert bad_words_token_ids(Tok(), ["cat", " ice cream", "a"]) == [[10], [11], [3, 4], [12, 4], [1]]
