"""Greedy rows with a grammar keep the fused path: the argmax inside the packed logits
GEMM (``PanelLinear*.argmax`` with the step's bitmask, as ``greedy_tokens`` runs it) picks
the token the sampler's full path picks from the written, masked logits, bit for bit,
at every ISA level this CPU runs, in float32 and bfloat16."""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from inflight.errors import InvalidRequestError
from inflight.kernels.cpu.gemm_bf16 import PanelLinear, load_gemm
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32, load_gemm_f32
from inflight.kernels.cpu.isa import supported_levels
from inflight.sampling_params import SamplingParams
from inflight.structured_output.masks import ALL_ALLOWED, GrammarBitmask
from inflight.worker.sampler import Sampler, SamplingMetadata, SamplingRow

V, K = 300, 24  # a vocabulary that ends inside a mask word and inside a panel
A, B, C = 3, 120, 250  # columns with the same weights: tied logits


def _heads():
    for lv in supported_levels():
        if load_gemm_f32(lv) is not None:
            yield pytest.param(PanelLinearF32, lv, id=f"f32-{lv.name}")
        if load_gemm(lv) is not None:
            yield pytest.param(PanelLinear, lv, id=f"bf16-{lv.name}")


pytestmark = pytest.mark.skipif(not list(_heads()), reason="no packed GEMM builds on this machine")


def _bitmask(allowed: list[Optional[set[int]]]) -> GrammarBitmask:
    """Row i allows the tokens in allowed[i] (None: unconstrained). Bits past the
    vocabulary are set, as nothing may read them."""
    words = torch.full((len(allowed), (V + 31) // 32), ALL_ALLOWED, dtype=torch.int32)
    for i, ids in enumerate(allowed):
        if ids is not None:
            bits = torch.zeros(words.shape[1] * 32, dtype=torch.int64)
            bits[list(ids)] = 1
            bits[V:] = 1
            packed = (bits.view(-1, 32) << torch.arange(32)).sum(-1)
            words[i] = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return GrammarBitmask([i for i, ids in enumerate(allowed) if ids is not None], words)


def _full_path(logits: torch.Tensor, grammar: GrammarBitmask) -> list[int]:
    """What the sampler gives greedy rows without the fused path."""
    rows = [SamplingRow(SamplingParams(temperature=0.0), [], [], []) for _ in range(logits.shape[0])]
    md = SamplingMetadata.from_rows(rows, V, torch.device("cpu"))
    md.grammar = grammar
    assert md.greedy_only  # the runner's gate for the fused path: a grammar does not close it
    return Sampler()(logits, md).sampled_token_ids


@pytest.mark.parametrize("cls,level", list(_heads()))
def test_masked_fused_argmax_equals_the_masked_logits_argmax(cls, level):
    torch.manual_seed(11)
    w = torch.randn(V, K)
    w[B] = w[C] = w[A]
    x = torch.randn(9, K)
    x[4:7] = w[A] * 4  # the tied columns A < B < C hold the largest logit
    x[7] = x[0]
    head = cls(w.to(cls.packed_dtype), None, level)
    h = x.to(cls.packed_dtype)
    logits = head(h)
    low = int(logits[2].float().argmin())
    rand = set(torch.nonzero(torch.rand(V) < 0.3).flatten().tolist())
    allowed = [None,                          # unconstrained, beside constrained rows
               rand,                          # a grammar state allowing some 30 %
               {low},                         # a single allowed token: it wins, however low
               set(),                         # nothing allowed: token 0 (the full path refuses the row)
               None,                          # ties: the first column (A)
               set(range(V)) - {A},           # A masked: the next tied column (B)
               {C, B, 7},                     # B before C, whatever the mask's order
               set(range(V)),                 # constrained, every token allowed
               {V - 1}]                       # the last token, in the last partial word and panel
    grammar = _bitmask(allowed)
    fused = head.argmax(h, grammar)
    assert fused.dtype == torch.int64
    some = [i for i, ids in enumerate(allowed) if ids != set()]
    assert fused[some].tolist() == _full_path(logits[some], _bitmask([allowed[i] for i in some]))
    with pytest.raises(InvalidRequestError, match="no token is left"):  # the engine fails such a request earlier
        _full_path(logits[3:4], _bitmask([set()]))
    assert fused.tolist()[2:7] == [low, 0, A, B, B] and fused[8] == V - 1
    assert fused[0] == fused[7] == logits[0].float().argmax()
    assert head.argmax(h).tolist() == logits.float().argmax(-1).tolist()  # without a grammar: unchanged


def test_a_bitmask_that_does_not_cover_the_batch_is_refused():
    head = PanelLinearF32(torch.randn(V, K), None)
    h = torch.randn(2, K)
    with pytest.raises(ValueError):
        head.argmax(h, GrammarBitmask([0], torch.full((1, (V + 31) // 32), ALL_ALLOWED, dtype=torch.int32)))
    with pytest.raises(ValueError):
        head.argmax(h, GrammarBitmask([0], torch.full((2, V // 32), ALL_ALLOWED, dtype=torch.int32)))
