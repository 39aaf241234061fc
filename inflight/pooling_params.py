"""What a pooling request asks for (vLLM's ``PoolingParams``): an embedding of its prompt."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from inflight.errors import InvalidRequestError
from inflight.pooling.config import PoolerConfig

POOLING_TASKS = ("embed", "classify")


@dataclass
class PoolingParams:
    """``dimensions``: keep the embedding's first N values (Matryoshka models only);
    ``use_activation``: L2-normalize the embedding, or for a classifier turn its logits into
    probabilities (softmax; sigmoid for one label) (None: the model's pooler config, which
    does unless it says otherwise).

    ``task``, ``pooling_type`` and ``skip_reading_prefix_cache`` are set by the engine
    from the model's pooler config (:meth:`resolve`); a user leaves them unset."""

    dimensions: Optional[int] = None
    use_activation: Optional[bool] = None
    truncate_prompt_tokens: Optional[int] = None  # keep the prompt's last N tokens (-1: max_model_len)
    task: Optional[str] = None
    pooling_type: Optional[str] = None  # LAST | MEAN | CLS
    skip_reading_prefix_cache: bool = False

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)):
            raise InvalidRequestError(f"dimensions must be an integer, got {self.dimensions!r}")
        if self.use_activation is not None and not isinstance(self.use_activation, bool):
            raise InvalidRequestError(f"use_activation must be a boolean, got {self.use_activation!r}")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise InvalidRequestError(f"pooling task {self.task!r} is not supported; supported: {list(POOLING_TASKS)}")

    def resolve(self, pooler: PoolerConfig, hidden_size: int, model_name: str) -> "PoolingParams":
        """A copy with the model's defaults filled in and ``dimensions`` checked as vLLM
        checks it; raises InvalidRequestError naming the limit."""
        task = self.task or pooler.task or "embed"
        if task != (pooler.task or "embed"):
            raise InvalidRequestError(f"Model {model_name!r} serves the pooling task {pooler.task!r}, not {task!r}")
        if task == "classify" and self.dimensions is not None:
            raise InvalidRequestError("Task 'classify' only supports ['use_activation'] parameters, does not "
                                      "support ['dimensions'] parameters")
        use_activation = self.use_activation
        if use_activation is None:
            use_activation = pooler.use_activation if pooler.use_activation is not None else True
        dims = self.dimensions if self.dimensions is not None else pooler.dimensions if task == "embed" else None
        if dims is not None:
            if not pooler.is_matryoshka:
                raise InvalidRequestError(f"Model {model_name!r} does not support Matryoshka embeddings; "
                                          f"dimensions must be unset (received dimensions={dims}).")
            if not 1 <= dims <= hidden_size:
                raise InvalidRequestError(f"Model {model_name!r} only supports dimensions in range "
                                          f"[1, {hidden_size}], got {dims}.")
            if pooler.matryoshka_dimensions and dims not in pooler.matryoshka_dimensions:
                raise InvalidRequestError(f"Model {model_name!r} only supports Matryoshka dimensions "
                                          f"{pooler.matryoshka_dimensions}, got {dims}.")
        kind = pooler.pooling_type
        # NOTE: MEAN and CLS read every prompt position's hidden state; a cached prefix has none.
        return replace(self, task=task, use_activation=use_activation, dimensions=dims,
                       pooling_type=kind, skip_reading_prefix_cache=kind != "LAST")

