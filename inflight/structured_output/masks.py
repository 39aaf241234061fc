"""One step's grammar masks: filled on a thread beside the forward pass, applied to
the whole batch's logits in one op.

NOTE: the grammar matchers live with the scheduler's requests (drafts are checked
against them there), never on the worker. After ``schedule()`` the scheduler's
:class:`GrammarMasks` starts filling the step's masks and hangs a
:class:`PendingMasks` on ``SchedulerOutput.grammar_bitmask``; what crosses to
the worker is :class:`StepMasks`: one int32 bitmask array, the first row of each
constrained request, and the requests whose matcher raised. A worker in this
process reads it only when it samples, after the forward pass; pickling it for
another process waits for the fill. The matchers advance by the sampled tokens
in ``update_from_output``, after the fill is done."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np
import torch

from inflight.errors import InvalidRequestError


logger = logging.getLogger(__name__)

ALL_ALLOWED = -1  # a bitmask word with every bit set: no token masked
_NEG_INF_BITS = -8388608  # 0xFF800000 as int32: the bits of float32 -inf
_SHIFTS = torch.arange(32, dtype=torch.int32)


@dataclass
class GrammarBitmask:
    """Allowed tokens of a batch of logits: ``bitmask[i]`` packs row i's, 32 per int32
    word (bit ``t % 32`` of word ``t // 32``: xgrammar's layout); only ``rows`` are constrained."""

    rows: list[int]
    bitmask: torch.Tensor  # [B, ceil(V / 32)] int32; ALL_ALLOWED in unconstrained rows

    def apply(self, x: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place, for every constrained row at once."""
        if x.device.type == "cpu" and self.bitmask.device.type == "cpu" and self._mostly_masked(x.shape[1]):
            # NOTE: xgrammar's CPU kernel writes -inf one masked token at a time, on one
            # thread: fast where nearly every token is allowed (a JSON string), several times
            # slower than this where nearly every token is masked. Here each bit becomes a bias of
            # 0 or -inf (its float32 bits, 0xFF800000) in a few vectorised, threaded ops;
            # unconstrained rows are all-allowed words, so they get 0.
            bias = (self.bitmask.unsqueeze(-1) >> _SHIFTS).bitwise_and_(1).sub_(1).bitwise_and_(_NEG_INF_BITS)
            x.add_(bias.view(torch.float32).view(x.shape[0], -1)[:, :x.shape[1]])
            return
        import xgrammar  # its CUDA/Triton kernel reads the packed bits in one pass

        indices = None if len(self.rows) == x.shape[0] else self.rows
        xgrammar.apply_token_bitmask_inplace(x, self.bitmask, vocab_size=x.shape[1], indices=indices)

    def _mostly_masked(self, vocab_size: int) -> bool:
        if self.bitmask.shape[1] * 32 < vocab_size:
            return False
        words = self.bitmask if len(self.rows) == self.bitmask.shape[0] else self.bitmask[self.rows]
        return int((words != ALL_ALLOWED).sum()) * 2 > words.numel()


@dataclass
class StepMasks:
    """The masks of one step: request ``r`` with k drafts owns rows ``req_rows[r] ..
    req_rows[r] + k``; the last row is all-allowed, for every unconstrained row."""

    req_rows: dict[str, int]
    bitmask: torch.Tensor  # [rows + 1, words] int32, ALL_ALLOWED where unconstrained
    constrained: list[bool]  # per row
    failed: dict[str, Exception] = field(default_factory=dict)  # requests whose matcher raised

    def result(self) -> "StepMasks":
        return self

    def select(self, rows: list[tuple[str, int]], device: torch.device) -> Optional[GrammarBitmask]:
        """The masks of the logits rows ``(request id, row of that request)``, in that
        order, or None when none is constrained."""
        free = len(self.constrained) - 1
        src = [self.req_rows[rid] + i if rid in self.req_rows else free for rid, i in rows]
        picked = [j for j, r in enumerate(src) if self.constrained[r]]
        if not picked:
            return None
        return GrammarBitmask(picked, self.bitmask[src].to(device, non_blocking=True))


class PendingMasks:
    """A step's masks while the fill runs; pickles as the finished :class:`StepMasks`."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def result(self) -> StepMasks:
        return self._future.result()

    def __reduce__(self):
        m = self.result()
        return StepMasks, (m.req_rows, m.bitmask, m.constrained, m.failed)


class GrammarMasks:
    """The scheduler side of structured output: starts each step's mask fill on one
    thread, and advances the matchers by the tokens sampled."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._pool: Optional[ThreadPoolExecutor] = None

    def start(self, sched: Any, requests: Mapping[str, Any]) -> None:
        """Begin filling the masks of the constrained requests that sample in ``sched``
        (a SchedulerOutput; ``requests`` the scheduler's, by id)."""
        entries, row = [], 0
        for rid, n in sched.num_scheduled_tokens.items():
            req = requests.get(rid)
            state = getattr(req, "structured_output", None)
            if state is None:
                continue
            drafts = tuple(sched.scheduled_spec_decode_tokens.get(rid, ()))
            if req.num_computed_tokens + n - len(drafts) != req.num_tokens:
                continue  # a prefill chunk short of the prompt's end samples nothing
            entries.append((row, rid, state, drafts))
            row += 1 + len(drafts)
        if not entries:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="inflight-grammar-mask")
        sched.grammar_bitmask = PendingMasks(self._pool.submit(self._fill, entries, row))

    @staticmethod
    def advance(sched: Any, out: Any, requests: Mapping[str, Any]) -> None:
        """Advance each constrained request's matcher by the tokens it got this step
        (``out`` is the ModelRunnerOutput); a token the grammar rejects fails that request."""
        if sched.grammar_bitmask is None:
            return
        sched.grammar_bitmask.result()  # the fill reads the matchers: let it finish first
        for rid in list(out.sampled_token_ids):
            state = getattr(requests.get(rid), "structured_output", None)
            tokens = out.sampled_token_ids[rid]
            if state is None or not tokens:
                continue
            if not state.accept_tokens(tokens):
                del out.sampled_token_ids[rid]
                out.logprobs.pop(rid, None)
                out.failed[rid] = RuntimeError(f"sampled token(s) {tokens} break the request's grammar")

    def _allows_any(self, row: np.ndarray) -> bool:
        """Whether a mask row allows a token of the vocabulary (bits past it do not count)."""
        full, rest = divmod(self.vocab_size, 32)
        return bool(row[:full].any()) or bool(rest and int(row[full]) & ((1 << rest) - 1))

    def _fill(self, entries: list[tuple[int, str, Any, tuple[int, ...]]], num_rows: int) -> StepMasks:
        # NOTE: numpy, not torch.full: a torch op large enough to go parallel would start a
        # second OpenMP team on this thread, spinning against the forward pass's.
        words = np.full((num_rows + 1, self.words), ALL_ALLOWED, dtype=np.int32)
        masks = StepMasks({}, torch.from_numpy(words), [False] * (num_rows + 1))
        for row, rid, state, drafts in entries:
            n = 1 + len(drafts)
            masks.req_rows[rid] = row
            try:
                state.fill_rows(masks.bitmask, row, drafts)
                if not self._allows_any(words[row]):  # a grammar whose language is empty
                    raise InvalidRequestError("the structured output allows no token here: its grammar "
                                              "accepts no string that continues this output")
            except Exception as e:  # this request's matcher alone: it fails, the step goes on
                words[row:row + n] = ALL_ALLOWED
                masks.failed[rid] = e
                continue
            masks.constrained[row:row + n] = [True] * n
        return masks
