"""The worker's adapters: loaded on first use, kept up to ``max_cpu_loras`` (least
recently used dropped first), and this step's rows of each, which the LoRA layers read."""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterable, Optional

import torch
from torch import nn

from inflight.config import LoRAConfig
from inflight.lora.adapter import LinearFactory, LoRAAdapter, read_adapter
from inflight.lora.layers import LoRABatch, LoRALinear, wrap_linears
from inflight.lora.request import LoRARequest

logger = logging.getLogger(__name__)


class LoRAManager:
    """Wraps the model's projections once, at build; then loads adapters and sets each
    step's batch. The adapters' weights are held in the platform's ``linear`` class; where
    that is the fused layer loop's, a step with adapters runs in the loop, else op by op
    (captured graphs know nothing of adapters). A step without adapters runs as without LoRA."""

    def __init__(self, model: nn.Module, config: LoRAConfig, stacked: dict[str, tuple[str, int]],
                 shard_rows: dict[str, list[int]], dtype: torch.dtype, device: torch.device,
                 linear: Optional[LinearFactory] = None) -> None:
        self.config = config
        self.stacked = stacked
        self.dtype, self.device = dtype, device
        self.linear = linear
        self.batch = LoRABatch()
        self.targets = wrap_linears(model, shard_rows, self.batch, getattr(model, "row_orders", dict)())
        self._adapters: OrderedDict[int, LoRAAdapter] = OrderedDict()
        if getattr(model, "layer_loop", None) is not None:
            names = {id(m.base_layer): name for name, m in model.named_modules() if isinstance(m, LoRALinear)}
            model.layer_loop = LoRALoop(model.layer_loop, self.batch, names)

    @property
    def active(self) -> bool:
        """Whether this step has rows with an adapter."""
        return self.batch.active

    def loaded(self) -> list[LoRARequest]:
        """The adapters loaded now, least recently used first."""
        return [a.request for a in self._adapters.values()]

    def add(self, req: LoRARequest, keep: Iterable[int] = ()) -> LoRAAdapter:
        """The adapter of ``req``, loaded now if it is not; ValueError if it cannot run here.
        Eviction spares the ids in ``keep`` (this step's)."""
        have = self._adapters.get(req.lora_int_id)
        if have is not None and have.request.lora_path == req.lora_path:
            self._adapters.move_to_end(req.lora_int_id)
            return have
        adapter = read_adapter(req, self.targets, self.stacked, self.config.max_lora_rank, self.dtype, self.device,
                               self.linear)
        self._adapters[req.lora_int_id] = adapter
        keep = set(keep) | {req.lora_int_id}
        for lid in [i for i in self._adapters if i not in keep][:max(0, len(self._adapters) - self.config.num_cached)]:
            del self._adapters[lid]
        logger.info("LoRA adapter %r (id %d, rank %d) loaded from %s", req.lora_name, req.lora_int_id,
                    adapter.rank, req.lora_path)
        return adapter

    def remove(self, lora_int_id: int) -> bool:
        """Drop a loaded adapter (a later request for it loads it again)."""
        return self._adapters.pop(lora_int_id, None) is not None

    def load_for_step(self, requests: dict[str, Optional[LoRARequest]]) -> dict[str, Exception]:
        """Make sure every adapter the step's requests name is loaded; the requests whose
        adapter failed to load (its folder changed since it was checked), by id."""
        by_adapter: dict[int, tuple[LoRARequest, list[str]]] = {}
        for rid, req in requests.items():
            if req is not None:
                by_adapter.setdefault(req.lora_int_id, (req, []))[1].append(rid)
        failed: dict[str, Exception] = {}
        for req, rids in by_adapter.values():
            try:
                self.add(req, by_adapter)
            except Exception as e:
                failed.update(dict.fromkeys(rids, e))
        return failed

    def set_batch(self, spans: list[tuple[Optional[LoRARequest], int, int]]) -> None:
        """This step's rows: ``(adapter or None, first row, end row)`` per request, in batch order."""
        by_id: dict[int, list[tuple[int, int]]] = {}
        for req, start, end in spans:
            if req is None or end <= start:
                continue
            ranges = by_id.setdefault(req.lora_int_id, [])
            if ranges and ranges[-1][1] == start:  # the next request of the same adapter: one run of rows
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((start, end))
        self.batch.runs = [(s, e, self._adapters[lid]) for lid, ranges in by_id.items() for s, e in ranges]


class LoRALoop:
    """The fused layer loop with this step's adapters handed in: each adapter's weights
    per layer are laid out for the loop once (``lora_layers``), by the base projection
    each one adapts (``names``: its module name). A step whose adapters the loop cannot
    run (weights not in its packed form) is declined and runs op by op."""

    def __init__(self, loop, batch: LoRABatch, names: dict[int, str]) -> None:
        self.loop = loop
        self.batch = batch
        self.names = names

    def _runs(self) -> Optional[list]:
        runs = []
        for start, end, adapter in self.batch.runs:
            # kept on the adapter: the array points into its weights and lives as long as they do
            if "layer_loop" not in adapter.layouts:
                adapter.layouts["layer_loop"] = self.loop.lora_layers(
                    lambda base: adapter.weights.get(self.names.get(id(base))))
            layers = adapter.layouts["layer_loop"]
            if layers is None:
                return None
            runs.append((start, end, layers))
        return runs

    def can_run(self, x: torch.Tensor, kv_caches: list) -> bool:
        return self.loop.can_run(x, kv_caches) and (not self.batch.active or self._runs() is not None)

    def run(self, x, rope, kv_caches, md):
        return self.loop.run(x, rope, kv_caches, md, lora=self._runs() or ())

    def __getattr__(self, attr: str):
        return getattr(self.loop, attr)
