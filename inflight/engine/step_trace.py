"""The per-step trace (``--trace-file``): one JSON line a step with its requests, token
count, KV blocks, queue lengths, finished and preempted requests."""
from __future__ import annotations

import json
import time

from inflight.core.outputs import SchedulerOutput
from inflight.core.scheduler import Scheduler


class StepTrace:
    """Appends a step's record to ``path``; the batch is read before the forward pass (the
    scheduler's last_scheduled), the rest after its outputs."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a")

    @staticmethod
    def batch(scheduler: Scheduler) -> list[dict]:
        """The requests the scheduler just scheduled: id, tokens this step, prefill or decode."""
        return [{"id": s.request.request_id, "num_tokens": s.num_new_tokens,
                 "kind": "prefill" if s.is_prefill else "decode"} for s in scheduler.last_scheduled]

    def write(self, step: int, scheduler: Scheduler, sched: SchedulerOutput, batch: list[dict], core_outputs,
              t0: float) -> None:
        """One line for step ``step`` (started at ``t0``), flushed: a crash keeps the steps before it."""
        kv = scheduler.kv
        rec = {
            "step": step, "time": t0, "duration_s": round(time.time() - t0, 6),
            "requests": batch,
            "num_tokens": sched.total_num_scheduled_tokens,
            "kv_blocks_used": kv.num_blocks - kv.num_free_blocks, "kv_blocks_free": kv.num_free_blocks,
            "num_waiting": len(scheduler.waiting), "num_running": len(scheduler.running),
            "finished": [o.request_id for o in core_outputs if o.finish_reason is not None],
            "preempted": sched.preempted_req_ids,
        }
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()
