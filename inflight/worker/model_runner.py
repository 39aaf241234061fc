"""Turns a SchedulerOutput into one flattened batch, runs the model once and samples."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import numpy as np
import torch

from inflight.attention.base import AttentionMetadata
from inflight.core.outputs import ModelRunnerOutput, SchedulerOutput
from inflight.core.spec_decode import accept_greedy
from inflight.errors import InvalidRequestError
from inflight.pooling.pooler import PoolRows, pool_hidden, pool_rows
from inflight.structured_output.masks import StepMasks
from inflight.worker.prompt_logprobs import PromptRows, compute_prompt_logprobs, prompt_rows
from inflight.worker.request_state import RequestStates, ScheduledState
from inflight.worker.sampler import Sampler, SamplerOutput, SamplingMetadata, SamplingRow
from inflight.worker.swap import Swapper


# torch.Generator.manual_seed takes any int64 or uint64 value
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass
class _Group:
    """The logits rows of one request that samples this step."""

    sched: ScheduledState
    first: int  # its first row among the step's logits indices
    rows: list[SamplingRow]


@dataclass
class StepInputs:
    """The flattened batch of one step."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    md: AttentionMetadata
    logits_indices: torch.Tensor  # rows whose hidden state is projected to logits
    sampling: list[ScheduledState]  # in logits row order; one with k drafts has k + 1 rows
    prompt_rows: list[PromptRows] = field(default_factory=list)  # extra rows of requests with prompt_logprobs
    pool_rows: list[PoolRows] = field(default_factory=list)  # rows of pooling requests


def flat_positions(q_lens: list[int], starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The position of each of a step's flattened tokens and its request's row, request i
    having q_lens[i] tokens from position starts[i]. NOTE: numpy, not torch: on arrays this
    small one torch op's dispatch costs more than the whole computation in numpy, and a
    one-row decode step feels it."""
    st, rows = np.array(starts, dtype=np.int64), np.arange(len(q_lens), dtype=np.int64)
    if q_lens.count(1) == len(q_lens):  # decodes only
        return st, rows
    ql = np.array(q_lens, dtype=np.int64)
    qsl = np.concatenate(([0], np.cumsum(ql)))
    return np.arange(qsl[-1], dtype=np.int64) + np.repeat(st - qsl[:-1], ql), np.repeat(rows, ql)


class ModelRunner:
    """Owns the model, the KV pools and the per-request state (tokens, block tables,
    seeded generators), which it keeps up to date from each SchedulerOutput;
    knows nothing of HTTP or scheduling policy."""

    def __init__(self, model: torch.nn.Module, kv_caches: list, block_size: int, vocab_size: int,
                 device: torch.device, seed: int = 0, swapper: Optional[Swapper] = None,
                 layer_groups: Optional[list[int]] = None) -> None:
        self.model = model
        # hybrid KV layout: each layer's KV cache group (it reads that group's block tables)
        self.layer_groups = layer_groups
        self.swapper = swapper or Swapper(kv_caches, 0, device)  # host pool for swap preemption
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.device = device
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(seed))
        self.generators: dict[str, torch.Generator] = {}
        self.graph_runner = None  # CudaGraphRunner for decode-only steps; set by the CUDA platform
        self.lora = None  # LoRAManager (inflight/lora) with enable_lora; set by the builder
        self.requests = RequestStates()
        self._step_masks: Optional[StepMasks] = None

    def prepare_inputs(self, batch: list[ScheduledState]) -> StepInputs:
        """Flatten every scheduled token; decodes (one-token rows) first, each kind by LoRA adapter
        (an adapter's rows then form at most two runs)."""
        items = sorted(batch, key=lambda s: (s.num_new_tokens != 1, s.state.lora_int_id))
        ids: list[int] = []
        q_lens, starts = [], []
        for s in items:
            nc = s.state.num_computed_tokens
            ids.extend(s.state.all_token_ids[nc:nc + s.num_new_tokens - len(s.spec_token_ids)])
            ids.extend(s.spec_token_ids)
            q_lens.append(s.num_new_tokens)
            starts.append(nc)
        dev = self.device
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        seq_lens = [a + n for a, n in zip(starts, q_lens)]
        positions, req_idx = flat_positions(q_lens, starts)
        groups = [self._block_table([s.state.block_ids[g] for s in items], req_idx, positions)
                  for g in range(len(items[0].state.block_ids))]
        num_decodes = sum(1 for n in q_lens if n == 1)
        if self.lora is not None:
            self.lora.set_batch([(s.state.lora_request, qsl[i], qsl[i + 1]) for i, s in enumerate(items)])
        md = AttentionMetadata(
            slot_mapping=groups[0][1], block_tables=groups[0][0],
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            query_start_loc_list=qsl, seq_lens_list=seq_lens, num_decodes=num_decodes, block_size=self.block_size,
            max_decode_seq_len=max(seq_lens[:num_decodes], default=0))
        if self.layer_groups is not None:
            per_group = [md] + [replace(md, block_tables=bt, slot_mapping=slots) for bt, slots in groups[1:]]
            md.per_layer = [per_group[g] for g in self.layer_groups]
        sampling = [s for s in items if s.samples]
        # a request with drafts samples after its last known token and after every draft
        logits_idx = [j for i, s in enumerate(items) if s.samples
                      for j in range(qsl[i + 1] - 1 - len(s.spec_token_ids), qsl[i + 1])]
        prompt = [r for i, s in enumerate(items) if (r := prompt_rows(s, qsl[i])) is not None]
        pool = [r for i, s in enumerate(items) if (r := pool_rows(s, qsl[i])) is not None]
        return StepInputs(torch.tensor(ids, dtype=torch.int64, device=dev), torch.from_numpy(positions).to(dev), md,
                          torch.tensor(logits_idx, dtype=torch.int64, device=dev), sampling, prompt, pool)

    def _block_table(self, tables: list[list[int]], req_idx: np.ndarray,
                     positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(block tables, slot of each new token) of one KV cache group, on the device."""
        max_blocks = max(len(t) for t in tables)
        bt = np.array([t + [0] * (max_blocks - len(t)) for t in tables], dtype=np.int64)
        bs = self.block_size
        slots = bt[req_idx, positions // bs] * bs + positions % bs
        return torch.from_numpy(bt).to(self.device), torch.from_numpy(slots).to(self.device)

    def _request_rows(self, s: ScheduledState) -> list[SamplingRow]:
        """The rows one request samples this step; raises for settings that cannot be sampled."""
        req = s.state
        p = req.sampling_params
        gen: Optional[torch.Generator] = None
        if p.seed is not None and not p.greedy:
            gen = self.generators.get(req.req_id)
            if gen is None:
                gen = self._generator(p.seed)
                self.generators[req.req_id] = gen
        eos = [] if p.ignore_eos else list(req.eos_token_ids)
        # draft rows: only plain greedy requests draft, so the rows share one setting
        return [SamplingRow(p, req.prompt_token_ids, req.output_token_ids, eos, gen)] * (1 + len(s.spec_token_ids))

    def _generator(self, seed: int) -> torch.Generator:
        # manual_seed raises a RuntimeError outside this range: the seed is the client's fault
        if not isinstance(seed, int) or not SEED_MIN <= seed <= SEED_MAX:
            raise InvalidRequestError(f"seed must be an integer in [{SEED_MIN}, {SEED_MAX}], got {seed!r}")
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: forward the whole batch, then sample the rows that need it.

        A failure of the forward pass raises (no request is to blame); a request
        whose own sampling fails lands in ``out.failed`` and the others get their tokens.
        """
        self.swapper.apply(sched)  # swap preemption's block copies, before the forward pass (even if empty)
        # NOTE: a seeded generator outlives a preemption (only the request's end drops it),
        # so a resumed request continues its random stream.
        for rid in sched.finished_req_ids:
            self.generators.pop(rid, None)
        batch = self.requests.update(sched)
        out = ModelRunnerOutput()
        if self.lora is not None and batch:  # an adapter that no longer loads fails its requests alone
            out.failed.update(self.lora.load_for_step({s.req_id: s.state.lora_request for s in batch}))
            batch = [s for s in batch if s.req_id not in out.failed]
        if not batch:
            return out
        inp = self.prepare_inputs(batch)
        # CUDA graphs for decode-only steps (worker/cuda_graphs.py): replay when one fits
        if self.graph_runner is not None and not (self.lora is not None and self.lora.active) \
                and self.graph_runner.can_run(inp.input_ids, inp.md):
            hidden = self.graph_runner.run(inp.input_ids, inp.positions, inp.md)
        else:
            hidden = self.model(inp.input_ids, inp.positions, self.kv_caches, inp.md)
        # structured output's masks were filled beside the forward pass (structured_output/masks.py)
        self._step_masks = sched.grammar_bitmask.result() if sched.grammar_bitmask is not None else None
        if self._step_masks is not None:
            out.failed.update(self._step_masks.failed)
        if inp.prompt_rows:  # an encoder has no logits to read them from (and is never asked)
            compute_prompt_logprobs(self.model.compute_logits, hidden, inp.prompt_rows, out)
        if inp.pool_rows:
            pool_hidden(hidden, inp.pool_rows, out, getattr(self.model, "score", None))
        groups = self._groups(inp, out)
        if groups:
            self._sample_groups(hidden[inp.logits_indices], groups, out)
        return out

    def _groups(self, inp: StepInputs, out: ModelRunnerOutput) -> list[_Group]:
        groups, first = [], 0
        for s in inp.sampling:
            if s.req_id in out.failed:  # its prompt logprobs failed: it samples nothing
                first += 1 + len(s.spec_token_ids)
                continue
            try:
                groups.append(_Group(s, first, self._request_rows(s)))
            except Exception as e:
                out.failed[s.req_id] = e
            first += 1 + len(s.spec_token_ids)
        return groups

    def _sample_groups(self, hidden: torch.Tensor, groups: list[_Group], out: ModelRunnerOutput) -> None:
        """Sample every group's rows of ``hidden`` (one row per logits index) in one batch.

        NOTE: the sampling metadata and the sampler depend on each request's settings;
        when the batch fails, each request is tried alone to find the ones to blame.
        The model's own part (logits, the fused greedy argmax) is outside: its
        failure is nobody's and raises.
        """
        try:
            md = self._metadata(groups)
        except Exception:
            groups = [g for g in groups if _try(lambda: self._metadata([g]), g, out)]
            if not groups:
                return
            md = self._metadata(groups)
        rows = [g.first + i for g in groups for i in range(len(g.rows))]
        h = hidden if len(rows) == hidden.shape[0] else hidden[rows]  # no copy unless a request dropped out
        greedy = getattr(self.model, "greedy_tokens", None)
        if md.greedy_only and greedy is not None:
            # argmax inside the logits GEMM, over the tokens each row's grammar allows: no logits written
            tokens = greedy(h, self.vocab_size, md.grammar)
            if tokens is not None:
                self._record(groups, SamplerOutput(tokens.tolist(), None), out)
                return
        logits = self.model.compute_logits(h)
        try:
            self._record(groups, self.sampler(logits, md), out)
        except Exception:
            row = 0
            for g in groups:
                part = logits[row:row + len(g.rows)]
                row += len(g.rows)
                _try(lambda: self._record([g], self.sampler(part, self._metadata([g])), out), g, out)

    def _metadata(self, groups: list[_Group]) -> SamplingMetadata:
        md = SamplingMetadata.from_rows([r for g in groups for r in g.rows], self.vocab_size, self.device)
        if self._step_masks is not None:
            md.grammar = self._step_masks.select([(g.sched.req_id, i) for g in groups for i in range(len(g.rows))],
                                                 self.device)
        return md

    @staticmethod
    def _record(groups: list[_Group], result: SamplerOutput, out: ModelRunnerOutput) -> None:
        row = 0
        for g in groups:
            s = g.sched
            rid = s.req_id
            k = len(s.spec_token_ids)
            out.sampled_token_ids[rid] = accept_greedy(s.spec_token_ids, result.sampled_token_ids[row:row + k + 1])
            if result.logprobs is not None and s.state.sampling_params.logprobs is not None:
                out.logprobs[rid] = result.logprobs[row]
            row += k + 1


def _try(fn: Callable[[], object], group: _Group, out: ModelRunnerOutput) -> bool:
    """Run ``fn`` for one request; a failure is that request's (recorded in ``out.failed``)."""
    try:
        fn()
        return True
    except Exception as e:
        out.failed[group.sched.req_id] = e
        return False
