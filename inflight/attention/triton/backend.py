"""The Triton attention backend: kernels (a) write_kv, (b) paged decode, (c) prefill/extend."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from inflight.attention.base import AttentionMetadata
from inflight.attention.torch_ref import TorchAttentionBackend
from inflight.attention.triton import decode as _decode_mod
from inflight.attention.triton import prefill as _prefill_mod
from inflight.attention.triton import write_kv as _write_mod
from inflight.attention.triton.runtime import can_launch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # interpreter: any value; an H100/H200's count keeps CPU tests close to the GPU's splits


class TritonAttentionBackend(TorchAttentionBackend):
    """Triton kernels where they apply; the torch reference (the parent class) for the
    rest: an fp8 KV cache, unsupported dtypes or head sizes, or tensors Triton cannot
    reach (CPU tensors without ``TRITON_INTERPRET=1``).

    Decodes run first (kernel b, split-K chosen from the longest decode context, or
    fixed while a CUDA graph is captured), then every prefill chunk in one launch of
    kernel c. Nothing here synchronises with the host, so decode-only steps can be
    captured in a CUDA graph.
    """

    def __init__(self) -> None:
        self.fixed_num_splits: Optional[int] = None
        self._qsl_md: Optional[AttentionMetadata] = None
        self._qsl: Optional[torch.Tensor] = None
        self._sms: dict[torch.device, int] = {}

    def supports(self, q: torch.Tensor, k_cache) -> bool:
        """Can the kernels run this layer (else the torch reference does)?"""
        return (isinstance(k_cache, torch.Tensor) and q.dtype in _DTYPES and k_cache.dtype in _DTYPES
                and q.shape[-1] <= 256 and q.shape[1] % k_cache.shape[2] == 0 and k_cache.is_contiguous()
                and can_launch(q))

    @contextlib.contextmanager
    def fixed_splits(self, num_splits: int) -> Iterator[None]:
        """Use ``num_splits`` for every decode inside the block (CUDA-graph capture: the
        grid is frozen in the graph, so it must suit the longest context it will replay)."""
        prev, self.fixed_num_splits = self.fixed_num_splits, num_splits
        try:
            yield
        finally:
            self.fixed_num_splits = prev

    def num_splits_for(self, q: torch.Tensor, num_decodes: int, num_kv_heads: int, max_seq_len: int) -> int:
        if self.fixed_num_splits is not None:
            return self.fixed_num_splits
        sms = self._sms.get(q.device)
        if sms is None:
            sms = self._sms[q.device] = _num_sms(q.device)
        return _decode_mod.choose_num_splits(num_decodes, num_kv_heads, max_seq_len, sms)

    def forward(self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float,
                sliding_window: Optional[int] = None, logits_soft_cap: Optional[float] = None) -> torch.Tensor:
        # NOTE: the kernels take no window or soft-cap yet; such a layer runs the torch reference
        if sliding_window or logits_soft_cap or not self.supports(q, k_cache):
            return super().forward(q, k, v, k_cache, v_cache, md, scale, sliding_window, logits_soft_cap)
        _write_mod.write_kv(k, v, k_cache, v_cache, md.slot_mapping)
        out = torch.empty_like(q)
        nd = md.num_decodes
        if nd:
            self._decode(q[:nd], k_cache, v_cache, md, scale, out=out[:nd])
        if md.num_reqs > nd:
            qsl = md.query_start_loc_list
            max_q = max(qsl[i + 1] - qsl[i] for i in range(nd, md.num_reqs))
            _prefill_mod.prefill_attention(q, k_cache, v_cache, md.block_tables, md.seq_lens,
                                           self._query_start(md, q.device), nd, md.num_reqs - nd, max_q,
                                           scale, out)
        return out

    def _decode(self, q, k_cache, v_cache, md: AttentionMetadata, scale: float,
                out: Optional[torch.Tensor] = None, sliding_window: Optional[int] = None) -> torch.Tensor:
        if sliding_window or not self.supports(q, k_cache):
            return super()._decode(q, k_cache, v_cache, md, scale, sliding_window=sliding_window)
        nd = md.num_decodes
        splits = self.num_splits_for(q, nd, k_cache.shape[2], md.max_decode_seq_len)
        return _decode_mod.paged_decode(q[:nd], k_cache, v_cache, md.block_tables, md.seq_lens, scale,
                                        splits, out)

    def _query_start(self, md: AttentionMetadata, device: torch.device) -> torch.Tensor:
        """``query_start_loc`` on the device, copied once per step: every layer gets the same
        metadata object, so later layers reuse the first layer's copy."""
        # NOTE: keyed by identity with a reference held, so a later step's metadata can never
        # reuse a freed object's id and pick up a stale copy.
        if self._qsl_md is not md or self._qsl is None or self._qsl.device != device:
            self._qsl = torch.tensor(md.query_start_loc_list, dtype=torch.int32).to(device, non_blocking=True)
            self._qsl_md = md
        return self._qsl
