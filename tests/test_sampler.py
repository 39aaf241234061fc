"""Tests for inflight.worker.sampler: filters, penalties, seeds, logprobs."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from inflight.sampling_params import SamplingParams
from inflight.worker.sampler import (Sampler, SamplingMetadata, SamplingRow,
                                     _apply_penalties)

CPU = torch.device("cpu")


def row(prompt=(), output=(), eos=(), seed=None, **kw) -> SamplingRow:
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(SamplingParams(seed=seed, **kw), list(prompt), list(output), list(eos), gen)


def sample(logits: torch.Tensor, rows: list[SamplingRow], sampler: Sampler | None = None):
    md = SamplingMetadata.from_rows(rows, logits.shape[1], CPU)
    return (sampler or Sampler(torch.Generator().manual_seed(0)))(logits, md)


def logits_of(probs: list[float], rows: int = 1) -> torch.Tensor:
    return torch.tensor(probs).log().repeat(rows, 1)


def test_greedy_is_argmax_and_fast_path():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    rows = [row(temperature=0.0) for _ in range(8)]
    md = SamplingMetadata.from_rows(rows, 50, CPU)
    assert md.greedy_only
    out = Sampler()(logits, md)
    assert out.sampled_token_ids == logits.argmax(-1).tolist() and out.logprobs is None
    assert Sampler()(logits.bfloat16(), md).sampled_token_ids == logits.bfloat16().argmax(-1).tolist()


def test_temperature_zero_vs_positive():
    logits = logits_of([0.3, 0.25, 0.25, 0.2], rows=200)
    greedy = sample(logits, [row(temperature=0.0) for _ in range(200)]).sampled_token_ids
    assert set(greedy) == {0}
    hot = sample(logits, [row(temperature=1.0) for _ in range(200)]).sampled_token_ids
    assert set(hot) == {0, 1, 2, 3}


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_p=1e-6)])
def test_top_k_one_and_tiny_top_p_are_greedy(kw):
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(2))
    out = sample(logits, [row(temperature=1.5, **kw) for _ in range(64)])
    assert out.sampled_token_ids == logits.argmax(-1).tolist()


def test_top_k_and_top_p_support():
    logits = logits_of([0.35, 0.3, 0.2, 0.1, 0.05], rows=2000)
    assert set(sample(logits, [row(top_k=2)] * 2000).sampled_token_ids) == {0, 1}
    # 0.35 + 0.3 < 0.7, so the third token is needed to reach top_p.
    assert set(sample(logits, [row(top_p=0.7)] * 2000).sampled_token_ids) == {0, 1, 2}
    assert set(sample(logits, [row(top_p=0.6)] * 2000).sampled_token_ids) == {0, 1}
    # both together take the sort path rather than top-k alone
    assert set(sample(logits, [row(top_k=3, top_p=0.6)] * 2000).sampled_token_ids) == {0, 1}
    assert set(sample(logits, [row(top_k=2, top_p=0.9)] * 2000).sampled_token_ids) == {0, 1}


def test_min_p_keeps_only_tokens_above_threshold():
    # threshold 0.4 * 0.4 = 0.16: tokens 0..2 stay, 3 and 4 go.
    logits = logits_of([0.4, 0.3, 0.18, 0.1, 0.02], rows=2000)
    out = sample(logits, [row(min_p=0.4) for _ in range(2000)])
    assert set(out.sampled_token_ids) == {0, 1, 2}


def test_repetition_penalty_exact_and_changes_argmax():
    logits = torch.tensor([[2.0, 1.5, -1.0, -0.5, 0.0]])
    rows = [row(prompt=[0], output=[3, 3], repetition_penalty=2.0, temperature=0.0)]
    md = SamplingMetadata.from_rows(rows, 5, CPU)
    x = logits.clone()
    _apply_penalties(x, md)
    assert x.tolist() == [[1.0, 1.5, -1.0, -1.0, 0.0]]  # positive divided, negative multiplied
    assert Sampler()(logits, md).sampled_token_ids == [1]


def test_frequency_and_presence_penalties_exact():
    logits = torch.zeros(2, 5)
    rows = [row(prompt=[3, 4], output=[1, 1, 2], frequency_penalty=0.5, presence_penalty=0.25),
            row(output=[0], temperature=0.0)]  # penalties off for this row
    md = SamplingMetadata.from_rows(rows, 5, CPU)
    _apply_penalties(logits, md)
    # counts only over output tokens; the prompt's 3 and 4 are untouched.
    assert logits.tolist() == [[0.0, -1.25, -0.75, 0.0, 0.0], [0.0] * 5]


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_suppresses_eos_and_stop_ids(ignore_eos):
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])
    eos = [] if ignore_eos else [0]
    kw = dict(min_tokens=2, stop_token_ids=[1], ignore_eos=ignore_eos, temperature=0.0)
    early = [sample(logits, [row(output=[3] * n, eos=eos, **kw)]).sampled_token_ids[0] for n in (0, 1)]
    assert early == ([0, 0] if ignore_eos else [2, 2])
    assert sample(logits, [row(output=[3, 3], eos=eos, **kw)]).sampled_token_ids == [0]
    # random rows obey it too
    hot = sample(logits.repeat(500, 1), [row(output=[3], eos=[0], min_tokens=2, stop_token_ids=[1])] * 500)
    assert {0, 1}.isdisjoint(hot.sampled_token_ids)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_yields_when_only_stop_tokens_are_left(temperature):
    # As vLLM: a grammar that has ended leaves only stop tokens (the rest are -inf);
    # banning them would leave nothing to sample, so they stay and the request can end.
    inf = float("inf")
    logits = torch.tensor([[-inf, -inf, 1.0, -inf], [-2.0, 2.0, 1.0, -inf]])
    kw = dict(eos=[2], min_tokens=2, stop_token_ids=[1], temperature=temperature)
    out = sample(logits, [row(output=[3], **kw), row(output=[3], **kw)]).sampled_token_ids
    assert out == [2, 0]


def _step_logits(step: int, key: int, vocab: int = 40) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(1000 * key + step))


def _run_seeded(seed: int, layout: int, steps: int = 20) -> list[int]:
    """Tokens of a seeded request (logits key 7) placed inside batch ``layout``."""
    gens = {"me": torch.Generator().manual_seed(seed), "other": torch.Generator().manual_seed(99)}
    sampler, tokens = Sampler(torch.Generator().manual_seed(layout)), []
    for step in range(steps):
        specs = {0: [("me", 7)],
                 1: [("free", 1), ("me", 7), ("free", 2)],
                 2: [("other", 3), ("free", 1), ("greedy", 2), ("free", 5), ("me", 7)]}[layout]
        rows, logits = [], []
        for kind, key in specs:
            params = SamplingParams(temperature=0.0 if kind == "greedy" else 1.0, top_p=0.95,
                                    seed=0 if kind in ("me", "other") else None)
            rows.append(SamplingRow(params, [1], [], [], gens.get(kind)))
            logits.append(_step_logits(step, key))
        out = sampler(torch.stack(logits), SamplingMetadata.from_rows(rows, 40, CPU))
        tokens.append(out.sampled_token_ids[[k for k, _ in specs].index("me")])
    return tokens


def test_seeded_rows_independent_of_batch():
    alone = _run_seeded(123, 0)
    assert _run_seeded(123, 1) == alone
    assert _run_seeded(123, 2) == alone
    assert _run_seeded(124, 0) != alone


def test_seeded_row_advances_generator_one_draw_per_token():
    g, ref = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    rows = [SamplingRow(SamplingParams(seed=5), [], [], [], g)]
    sample(torch.randn(1, 30), rows)
    torch.rand(1, generator=ref, dtype=torch.float64)
    assert torch.equal(g.get_state(), ref.get_state())


def test_unseeded_sampling_follows_distribution():
    probs = [0.1, 0.2, 0.3, 0.4]
    n = 4000
    out = sample(logits_of(probs, rows=n), [row() for _ in range(n)],
                 Sampler(torch.Generator().manual_seed(1234)))
    counts = [out.sampled_token_ids.count(i) for i in range(4)]
    chi2 = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs))
    assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


class _FixedDraws(Sampler):
    """A sampler whose uniform draws are given, to probe the ends of [0, 1)."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__()
        self.draws = draws

    def _draws(self, md, R, device):
        return torch.tensor(self.draws, dtype=torch.float64)


def test_extreme_draws_never_pick_a_filtered_token():
    # tokens 0, 1 and 5, 6 are filtered out (top-k 2 keeps 3 and 4); a draw of 0
    # must land on the first kept token, the largest draw below 1 on the last one
    logits = torch.tensor([[-9.0, -8.0, -1.0, 5.0, 5.0 - 1e-3, -7.0, -30.0]]).repeat(2, 1)
    top = 1.0 - 2.0 ** -53
    out = sample(logits, [row(top_k=2), row(top_k=2)], _FixedDraws([0.0, top]))
    assert out.sampled_token_ids == [3, 4]
    # min-p zeroes the tail after the largest token: the top draw still stays inside
    logits = torch.tensor([[0.0, 3.0, -20.0, -25.0]])
    assert sample(logits, [row(min_p=0.5)], _FixedDraws([top])).sampled_token_ids == [1]


def test_logprobs_from_raw_logits_with_ranks():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0, 3.0], [0.5, 0.1, 0.2, 0.3, 0.4], [0.0] * 5])
    rows = [row(logprobs=3, temperature=0.0, repetition_penalty=2.0, output=[1, 4]),
            row(logprobs=0, temperature=0.7, frequency_penalty=1.0, output=[0]),
            row(temperature=0.0)]
    out = sample(logits, rows)
    raw = logits.log_softmax(-1)
    assert out.logprobs[2] == []
    first = out.logprobs[0]
    # penalty turns the argmax to token 2, but logprobs stay those of the raw logits
    assert first[0] == (2, pytest.approx(raw[0, 2].item()), 3)
    assert [t for t, _, _ in first[1:]] in ([1, 4, 2], [4, 1, 2])
    assert [r for _, _, r in first[1:]] == [1, 2, 3]
    assert [lp for _, lp, _ in first[1:]] == pytest.approx([raw[0, 1].item()] * 2 + [raw[0, 2].item()])
    (tok, lp, rank), = out.logprobs[1]
    assert lp == pytest.approx(raw[1, tok].item())
    assert rank == int((raw[1] >= raw[1, tok]).sum())
    assert sample(logits, [row(), row(), row()]).logprobs is None


@st.composite
def _case(draw):
    vocab = draw(st.integers(3, 16))
    n = draw(st.integers(1, 4))
    rows, logits = [], []
    for _ in range(n):
        logits.append(draw(st.lists(st.floats(-5, 5), min_size=vocab, max_size=vocab)))
        out = draw(st.lists(st.integers(0, vocab - 1), max_size=6))
        rows.append(row(prompt=draw(st.lists(st.integers(0, vocab - 1), max_size=6)), output=out,
                        eos=draw(st.sampled_from([[], [0]])),
                        seed=draw(st.none() | st.integers(0, 2**31)),
                        temperature=draw(st.sampled_from([0.0]) | st.floats(0.05, 2.0)),
                        top_k=draw(st.integers(0, vocab + 2)), top_p=draw(st.floats(0.01, 1.0)),
                        min_p=draw(st.floats(0.0, 1.0)), min_tokens=draw(st.integers(0, 8)),
                        stop_token_ids=draw(st.sampled_from([[], [1]])),
                        repetition_penalty=draw(st.floats(0.5, 2.0)),
                        frequency_penalty=draw(st.floats(-2.0, 2.0)),
                        presence_penalty=draw(st.floats(-2.0, 2.0)), max_tokens=None))
    return torch.tensor(logits), rows


def _reference_logits(raw: list[float], r: SamplingRow) -> list[float]:
    """Penalised logits in float64, written out the slow way."""
    p, x = r.params, list(raw)
    for t in set(r.prompt_token_ids + r.output_token_ids):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(r.output_token_ids):
        c = r.output_token_ids.count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty
    return x


_COPIES = 32


@settings(max_examples=150, deadline=None)
@given(_case())
def test_sampled_token_survives_filters(case):
    logits, rows = case
    # Many unseeded copies of each row probe the whole support, not one draw.
    copies = [SamplingRow(r.params, r.prompt_token_ids, r.output_token_ids, r.eos_token_ids, None)
              for r in rows for _ in range(_COPIES)]
    logits = torch.cat([logits, logits.repeat_interleave(_COPIES, dim=0)])
    rows = rows + copies
    out = sample(logits, rows)
    for raw, r, tok in zip(logits.tolist(), rows, out.sampled_token_ids):
        p = r.params
        banned = set(r.eos_token_ids + p.stop_token_ids) if len(r.output_token_ids) < p.min_tokens else set()
        assert tok not in banned
        x = [-math.inf if i in banned else v for i, v in enumerate(_reference_logits(raw, r))]
        tol = 1e-3
        if p.greedy:
            assert x[tok] >= max(x) - tol
            continue
        z = [v / p.temperature for v in x]
        if p.top_k:
            assert sum(v > z[tok] + tol for v in z) < p.top_k
            kth = sorted(z, reverse=True)[min(p.top_k, len(z)) - 1]
            z = [v if v >= kth - tol else -math.inf for v in z]
        m = max(z)
        probs = [math.exp(v - m) for v in z]
        mass_above = sum(q for v, q in zip(z, probs) if v > z[tok] + tol) / sum(probs)
        assert mass_above < p.top_p + tol
        assert math.exp(z[tok] - m) >= p.min_p - tol


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_greedy_and_seeded():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    cuda = torch.device("cuda")

    def rows():
        return [row(temperature=0.0, logprobs=2), row(seed=11, top_k=10, min_p=0.05), row(top_p=0.9)]
    cpu_out = sample(logits, rows())
    rs = rows()
    gpu_out = Sampler()(logits.to(cuda), SamplingMetadata.from_rows(rs, 64, cuda))
    assert gpu_out.sampled_token_ids[:2] == cpu_out.sampled_token_ids[:2]  # CPU generator: same noise
    assert [t for t, _, _ in gpu_out.logprobs[0]] == [t for t, _, _ in cpu_out.logprobs[0]]
