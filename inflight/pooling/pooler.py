"""The worker's half of pooling: each step, what a pooling request's chunk adds to its
embedding or class logits (``core/pooling.py`` gathers the chunks); and the engine's last
touch: the Matryoshka cut and the L2 normalization, or the classifier's activation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from inflight.core.outputs import ModelRunnerOutput
from inflight.core.pooling import PooledChunk
from inflight.pooling_params import PoolingParams
from inflight.worker.request_state import ScheduledState


@dataclass
class PoolRows:
    """One pooling request's rows in a step: flattened rows ``first_row ..`` hold the
    hidden states of prompt positions ``start ..``."""

    req_id: str
    pooling_type: str  # LAST | MEAN | CLS
    start: int
    first_row: int
    num_rows: int
    ends_prompt: bool


def pool_rows(s: ScheduledState, first_row: int) -> Optional[PoolRows]:
    """The rows of this chunk if its request pools, else None."""
    st = s.state
    if st.pooling_params is None:
        return None
    nc = st.num_computed_tokens
    return PoolRows(st.req_id, st.pooling_params.pooling_type or "LAST", nc, first_row, s.num_new_tokens,
                    nc + s.num_new_tokens >= st.num_prompt_tokens)


def pool_hidden(hidden: torch.Tensor, rows: list[PoolRows], out: ModelRunnerOutput,
                head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
    """Record each request's chunk in ``out.pooled``: float32 copies, so the step's hidden
    states are not kept alive by the requests still prefilling. A classifier's ``head``
    (bias-free, so it commutes with MEAN's sum) turns each into label logits."""
    head = head or (lambda x: x.to(torch.float32))
    last = [r for r in rows if r.pooling_type == "LAST" and r.ends_prompt]
    if last:  # one gather for the common case
        idx = torch.tensor([r.first_row + r.num_rows - 1 for r in last], device=hidden.device)
        picked = head(hidden.index_select(0, idx)).to(torch.float32)
        for r, vec in zip(last, picked):
            out.pooled[r.req_id] = PooledChunk(r.start, r.num_rows, vec)
    for r in rows:
        if r.req_id in out.pooled:
            continue
        data = None
        if r.pooling_type == "MEAN":
            data = head(hidden[r.first_row:r.first_row + r.num_rows].to(torch.float32).sum(0))
        elif r.pooling_type == "CLS" and r.start == 0:
            data = head(hidden[r.first_row]).to(torch.float32, copy=True)
        out.pooled[r.req_id] = PooledChunk(r.start, r.num_rows, data)


def finish_pooled(pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """What a client gets, float32 on the CPU. An embedding: the first ``dimensions`` values
    (Matryoshka), then L2-normalized; a classifier's logits: probabilities (softmax; sigmoid
    for one label, vLLM's activations); either raw where ``use_activation`` is false."""
    data = pooled.to(torch.float32)
    if params.task == "classify":
        if params.use_activation is not False:
            data = torch.sigmoid(data) if data.shape[-1] == 1 else torch.softmax(data, dim=-1)
        return data.cpu()
    if params.dimensions is not None:
        data = data[..., :params.dimensions]
    if params.use_activation is not False:
        data = F.normalize(data, p=2, dim=-1)
    return data.cpu()


def cosine_scores(first: list[torch.Tensor], second: list[torch.Tensor]) -> list[float]:
    """The cosine similarity of each pair of vectors; a single first one pairs with every
    second one (vLLM's 1:N scoring)."""
    if len(first) == 1:
        first = first * len(second)
    return [F.cosine_similarity(a.float(), b.float(), dim=0).item() for a, b in zip(first, second)]
