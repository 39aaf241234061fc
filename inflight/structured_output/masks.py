"""One step's grammar masks: filled on a worker thread while the forward pass runs,
applied to the whole batch's logits in one op."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch


logger = logging.getLogger(__name__)

ALL_ALLOWED = -1  # a bitmask word with every bit set: no token masked


@dataclass
class GrammarBitmask:
    """Allowed tokens of a batch of logits: ``bitmask[i]`` packs row i's, 32 per int32
    word (bit ``t % 32`` of word ``t // 32``: xgrammar's layout); only ``rows`` are constrained."""

    rows: list[int]
    bitmask: torch.Tensor  # [B, ceil(V / 32)] int32; ALL_ALLOWED in unconstrained rows

    def apply(self, x: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place, for every constrained row at once."""
        # NOTE: xgrammar's kernel (C++ on the CPU, Triton/CUDA on GPUs) reads the packed bits
        # in one pass; unpacking them with torch ops costs several times a copy of the logits.
        import xgrammar

        indices = None if len(self.rows) == x.shape[0] else self.rows
        xgrammar.apply_token_bitmask_inplace(x, self.bitmask, vocab_size=x.shape[1], indices=indices)


@dataclass
class StepMasks:
    """The masks of one step's logits rows (row order of ``StepInputs.sampling``)."""

    bitmask: torch.Tensor  # [rows, words] int32, ALL_ALLOWED where unconstrained
    constrained: list[bool]  # per logits row
    failed: dict[str, Exception] = field(default_factory=dict)  # requests whose matcher raised

    def select(self, rows: list[int], device: torch.device) -> Optional[GrammarBitmask]:
        """The masks of logits rows ``rows`` (in that order), or None when none is constrained."""
        picked = [j for j, r in enumerate(rows) if self.constrained[r]]
        if not picked:
            return None
        return GrammarBitmask(picked, self.bitmask[rows].to(device, non_blocking=True))


class GrammarMasks:
    """Builds each step's masks on one worker thread, beside the forward pass: the
    matchers are the step thread's again once ``result()`` returns."""

    def __init__(self, vocab_size: int) -> None:
        self.words = (vocab_size + 31) // 32
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pending: Optional[Future] = None

    def start(self, sampling: list[Any]) -> None:
        """Begin filling the masks for the requests sampling this step (ScheduledRequests,
        in logits row order; a request with k drafts has k + 1 rows)."""
        entries, row = [], 0
        for s in sampling:
            state = getattr(s.request, "structured_output", None)
            if state is not None:
                entries.append((row, s.request.request_id, state, s.spec_token_ids))
            row += 1 + len(s.spec_token_ids)
        if not entries:
            self._pending = None
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="inflight-grammar-mask")
        self._pending = self._pool.submit(self._fill, entries, row)

    def result(self, failed: dict[str, Exception]) -> Optional[StepMasks]:
        """The masks of the step started last (None when no request is constrained);
        requests whose matcher raised are added to ``failed``."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        masks = pending.result()
        failed.update(masks.failed)
        return masks

    @staticmethod
    def advance(sampling: list[Any], out: Any) -> None:
        """Advance each constrained request's matcher by the tokens it got this step
        (``out`` is the ModelRunnerOutput); a token the grammar rejects fails that request."""
        for s in sampling:
            state, rid = s.request.structured_output, s.request.request_id
            tokens = out.sampled_token_ids.get(rid)
            if state is None or not tokens:
                continue
            if not state.accept_tokens(tokens):
                del out.sampled_token_ids[rid]
                out.logprobs.pop(rid, None)
                out.failed[rid] = RuntimeError(f"sampled token(s) {tokens} break the request's grammar")

    def _fill(self, entries: list[tuple[int, str, Any, tuple[int, ...]]], num_rows: int) -> StepMasks:
        # NOTE: numpy, not torch.full: a torch op large enough to go parallel would start a
        # second OpenMP team on this thread, spinning against the forward pass's.
        words = np.full((num_rows, self.words), ALL_ALLOWED, dtype=np.int32)
        masks = StepMasks(torch.from_numpy(words), [False] * num_rows)
        for row, rid, state, drafts in entries:
            n = 1 + len(drafts)
            try:
                state.fill_rows(masks.bitmask, row, drafts)
            except Exception as e:  # this request's matcher alone: it fails, the step goes on
                words[row:row + n] = ALL_ALLOWED
                masks.failed[rid] = e
                continue
            masks.constrained[row:row + n] = [True] * n
        return masks
