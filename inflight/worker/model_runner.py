"""Turns a SchedulerOutput into one flattened batch, runs the model once and samples."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from inflight.attention.base import AttentionMetadata
from inflight.core.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from inflight.core.spec_decode import accept_greedy
from inflight.worker.sampler import Sampler, SamplerOutput, SamplingMetadata, SamplingRow
from inflight.worker.swap import Swapper


@dataclass
class StepInputs:
    """The flattened batch of one step."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    md: AttentionMetadata
    logits_indices: torch.Tensor  # rows whose hidden state is projected to logits
    sampling: list[ScheduledRequest]  # in logits row order; one with k drafts has k + 1 rows


class ModelRunner:
    """Owns the model, the KV pools and per-request sampling state (seeded
    generators); knows nothing of HTTP or scheduling policy."""

    def __init__(self, model: torch.nn.Module, kv_caches: list, block_size: int, vocab_size: int,
                 device: torch.device, seed: int = 0, swapper: Optional[Swapper] = None) -> None:
        self.model = model
        self.swapper = swapper or Swapper(kv_caches, 0, device)  # host pool for swap preemption
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.device = device
        self.sampler = Sampler(torch.Generator(device=device).manual_seed(seed))
        self.generators: dict[str, torch.Generator] = {}
        self.graph_runner = None  # CudaGraphRunner for decode-only steps; set by the builder on CUDA (issue 8)

    def prepare_inputs(self, sched: SchedulerOutput) -> StepInputs:
        """Flatten every scheduled token; decodes (one-token rows) first."""
        items = sorted(sched.scheduled, key=lambda s: s.num_new_tokens != 1)
        ids: list[int] = []
        q_lens, starts, tables = [], [], []
        for s in items:
            nc = s.request.num_computed_tokens
            ids.extend(s.request.all_token_ids[nc:nc + s.num_new_tokens - len(s.spec_token_ids)])
            ids.extend(s.spec_token_ids)
            q_lens.append(s.num_new_tokens)
            starts.append(nc)
            tables.append(s.block_ids)
        dev = self.device
        B = len(items)
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        seq_lens = [a + n for a, n in zip(starts, q_lens)]
        max_blocks = max(len(t) for t in tables)
        # one tensor from padded rows: a tensor per row costs ~4 us each at 128 rows
        bt = torch.tensor([list(t) + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.int64)
        q_lens_t = torch.tensor(q_lens, dtype=torch.int64)
        offsets = torch.tensor(starts, dtype=torch.int64) - torch.tensor(qsl[:-1], dtype=torch.int64)
        positions = torch.arange(qsl[-1], dtype=torch.int64) + torch.repeat_interleave(offsets, q_lens_t)
        req_idx = torch.repeat_interleave(torch.arange(B), q_lens_t)
        bs = self.block_size
        slots = bt[req_idx, positions // bs] * bs + positions % bs
        num_decodes = sum(1 for n in q_lens if n == 1)
        md = AttentionMetadata(
            slot_mapping=slots.to(dev), block_tables=bt.to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=dev),
            query_start_loc_list=qsl, seq_lens_list=seq_lens, num_decodes=num_decodes, block_size=bs,
            max_decode_seq_len=max(seq_lens[:num_decodes], default=0))
        sampling = [s for s in items if s.samples]
        # a request with drafts samples after its last known token and after every draft
        logits_idx = [j for i, s in enumerate(items) if s.samples
                      for j in range(qsl[i + 1] - 1 - len(s.spec_token_ids), qsl[i + 1])]
        return StepInputs(torch.tensor(ids, dtype=torch.int64, device=dev), positions.to(dev), md,
                          torch.tensor(logits_idx, dtype=torch.int64, device=dev), sampling)

    def _sampling_rows(self, sampling: list[ScheduledRequest]) -> list[SamplingRow]:
        rows = []
        for s in sampling:
            req = s.request
            p = req.sampling_params
            gen: Optional[torch.Generator] = None
            if p.seed is not None and not p.greedy:
                gen = self.generators.get(req.request_id)
                if gen is None:
                    gen = torch.Generator(device=self.device).manual_seed(p.seed)
                    self.generators[req.request_id] = gen
            eos = [] if p.ignore_eos else list(req.eos_token_ids)
            # draft rows: only plain greedy requests draft, so the rows share one setting
            rows.extend([SamplingRow(p, req.prompt_token_ids, req.output_token_ids, eos, gen)]
                        * (1 + len(s.spec_token_ids)))
        return rows

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: forward the whole batch, then sample the rows that need it."""
        self.swapper.apply(sched)  # swap preemption's block copies, before the forward pass (even if empty)
        for rid in sched.finished_req_ids:
            self.generators.pop(rid, None)
        if sched.is_empty:
            return ModelRunnerOutput()
        inp = self.prepare_inputs(sched)
        # --- CUDA graphs for decode-only steps (issue 8; worker/cuda_graphs.py): replay when one fits ---
        if self.graph_runner is not None and self.graph_runner.can_run(inp.input_ids, inp.md):
            hidden = self.graph_runner.run(inp.input_ids, inp.positions, inp.md)
        else:
            hidden = self.model(inp.input_ids, inp.positions, self.kv_caches, inp.md)
        if not inp.sampling:
            return ModelRunnerOutput()
        md = SamplingMetadata.from_rows(self._sampling_rows(inp.sampling), self.vocab_size, self.device)
        result = self._sample(hidden[inp.logits_indices], md)
        out = ModelRunnerOutput()
        row = 0
        for s in inp.sampling:
            rid = s.request.request_id
            k = len(s.spec_token_ids)
            out.sampled_token_ids[rid] = accept_greedy(s.spec_token_ids, result.sampled_token_ids[row:row + k + 1])
            if result.logprobs is not None and s.request.sampling_params.logprobs is not None:
                out.logprobs[rid] = result.logprobs[row]
            row += k + 1
        return out

    def _sample(self, hidden: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        """Tokens (and logprobs) for the hidden states of the rows that sample."""
        greedy = getattr(self.model, "greedy_tokens", None)
        if md.greedy_only and greedy is not None:
            tokens = greedy(hidden, self.vocab_size)  # argmax inside the logits GEMM: no logits written
            if tokens is not None:
                return SamplerOutput(tokens.tolist(), None)
        return self.sampler(self.model.compute_logits(hidden), md)
