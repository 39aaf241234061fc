"""Prompt logprobs (vLLM's ``SamplingParams.prompt_logprobs``) from the step's own forward pass.

The hidden state at prompt position ``q`` predicts prompt token ``q + 1``. A
prefill chunk covering positions ``[start, start + n)`` therefore contributes the
rows for targets ``start + 1 .. start + n`` that lie inside the prompt: the row of
a chunk's last position predicts the first token of the next chunk, and the
prompt's last position predicts the first output token (sampled, not reported).
Only requests that asked get extra rows; the logits of those rows are projected
here, in slices, so a long prompt never holds ``prompt x vocab`` floats at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from inflight.core.outputs import LogprobEntry, ModelRunnerOutput
from inflight.worker.request_state import ScheduledState

# Rows projected to logits at once: 256 x 49k float32 logits is 50 MB.
SLICE_ROWS = 256


@dataclass
class PromptRows:
    """One request's prompt-logprob rows in a step: flattened rows ``first_row ..``
    predict prompt tokens ``start + 1 ..``; entry ``i`` of the request's list is
    the logprob of prompt token ``i + 1``."""

    sched: ScheduledState
    start: int  # index of the first entry these rows produce
    first_row: int  # its row in the step's flattened batch
    num_rows: int


def prompt_rows(s: ScheduledState, first_row: int) -> PromptRows | None:
    """The rows of this chunk that produce prompt logprobs not yet computed, or None.

    Entries already made (before a preemption by recompute) are not made again."""
    req = s.state
    if req.sampling_params.prompt_logprobs is None:
        return None
    nc = req.num_computed_tokens
    lo = max(nc, req.num_prompt_logprobs)
    hi = min(nc + s.num_new_tokens - len(s.spec_token_ids), req.num_prompt_tokens - 1)
    if hi <= lo:
        return None
    return PromptRows(s, lo, first_row + lo - nc, hi - lo)


def compute_prompt_logprobs(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                            rows: list[PromptRows], out: ModelRunnerOutput) -> None:
    """Fill ``out.prompt_logprobs[request_id] = (start, entries)`` for every request in ``rows``.

    Each entry is ``[(prompt_token, logprob, rank)]`` then the top-N ``(id, logprob,
    rank)``, from the raw logits as vLLM reports them. The rows exist only for these
    requests, so a failure here fails them and no other request.
    """
    if not rows:
        return
    try:
        entries = _entries(compute_logits, hidden, rows)
    except Exception as e:
        for r in rows:
            out.failed[r.sched.req_id] = e
        return
    at = 0
    for r in rows:
        out.prompt_logprobs[r.sched.req_id] = (r.start, entries[at:at + r.num_rows])
        at += r.num_rows


def _entries(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
             rows: list[PromptRows]) -> list[LogprobEntry]:
    index, targets, top_n = [], [], []
    for r in rows:
        prompt = r.sched.state.prompt_token_ids
        index.extend(range(r.first_row, r.first_row + r.num_rows))
        targets.extend(prompt[r.start + 1:r.start + 1 + r.num_rows])
        top_n.extend([r.sched.state.sampling_params.prompt_logprobs] * r.num_rows)
    idx = torch.tensor(index, dtype=torch.long, device=hidden.device)
    tgt = torch.tensor(targets, dtype=torch.long, device=hidden.device)
    max_n = max(top_n)
    result: list[LogprobEntry] = []
    for a in range(0, len(index), SLICE_ROWS):
        b = min(a + SLICE_ROWS, len(index))
        lp = compute_logits(hidden[idx[a:b]]).to(torch.float32).log_softmax(dim=-1)
        tok_lp = lp.gather(1, tgt[a:b].unsqueeze(1))
        # vLLM's rank: how many tokens are at least as likely, so ties share the worse rank.
        ranks = (lp >= tok_lp).sum(dim=-1).tolist()
        vals, ids = lp.topk(min(max_n, lp.shape[1]), dim=-1) if max_n else (None, None)
        top_vals = vals.tolist() if vals is not None else None
        top_ids = ids.tolist() if ids is not None else None
        for k, (t, v) in enumerate(zip(targets[a:b], tok_lp.squeeze(1).tolist())):
            entry = [(t, v, ranks[k])]
            if top_ids is not None:
                entry += [(top_ids[k][j], top_vals[k][j], j + 1) for j in range(min(top_n[a + k], len(top_ids[k])))]
            result.append(entry)
    return result
