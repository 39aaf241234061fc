"""Reference attention in plain torch: works on any device, easy to check."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from inflight.attention.base import AttentionBackend, AttentionMetadata
from inflight.attention.kv_quant import is_quantized


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter the step's new K/V rows into their cache slots."""
    if is_quantized(k_cache):  # fp8 KV cache: quantize on write; indexing it dequantizes (kv_quant.py)
        k_cache.write(k, slot_mapping)
        v_cache.write(v, slot_mapping)
        return
    nb, bs, kvh, d = k_cache.shape
    k_cache.view(nb * bs, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, length: int, first_block: int = 0) -> torch.Tensor:
    """Contiguous [length - first_block * block_size, KVH, D] view of one request's
    cached tokens from block ``first_block`` on."""
    nblocks = -(-length // cache.shape[1])
    return cache[block_ids[first_block:nblocks]].flatten(0, 1)[:length - first_block * cache.shape[1]]


class TorchAttentionBackend(AttentionBackend):
    """Decodes in one batched SDPA call over a padded gather; each prefill chunk
    in its own SDPA call (causal, offset by the cached prefix). With a sliding
    window, the gathers start at the block holding the window's first key. A logit
    soft-cap always runs here, whatever the subclass: no fast kernel takes one."""

    def forward(self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float,
                sliding_window: Optional[int] = None, logits_soft_cap: Optional[float] = None) -> torch.Tensor:
        self._write_kv(k, v, k_cache, v_cache, md.slot_mapping)
        out = torch.empty_like(q)
        nd = md.num_decodes
        if logits_soft_cap:
            ref = TorchAttentionBackend
            if nd:
                out[:nd] = ref._decode(q[:nd], k_cache, v_cache, md, scale, sliding_window, logits_soft_cap)
            qsl = md.query_start_loc_list
            for i in range(nd, md.num_reqs):
                s, e = qsl[i], qsl[i + 1]
                out[s:e] = ref._prefill(q[s:e], k[s:e], v[s:e], k_cache, v_cache, md.block_tables[i],
                                        md.seq_lens_list[i], scale, sliding_window, logits_soft_cap)
            return out
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, md, scale, sliding_window=sliding_window)
        if md.num_reqs > nd:
            self._prefills(q, k, v, k_cache, v_cache, md, scale, out, sliding_window)
        return out

    @staticmethod
    def _write_kv(k, v, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
        write_kv(k, v, k_cache, v_cache, slot_mapping)

    def _prefills(self, q, k, v, k_cache, v_cache, md: AttentionMetadata, scale: float, out: torch.Tensor,
                  sliding_window: Optional[int] = None) -> None:
        """Every prefill chunk of the step (requests ``num_decodes..``) into ``out``."""
        qsl = md.query_start_loc_list
        for i in range(md.num_decodes, md.num_reqs):
            s, e = qsl[i], qsl[i + 1]
            out[s:e] = self._prefill(q[s:e], k[s:e], v[s:e], k_cache, v_cache,
                                     md.block_tables[i], md.seq_lens_list[i], scale, sliding_window)

    @staticmethod
    def _decode(q, k_cache, v_cache, md: AttentionMetadata, scale: float,
                sliding_window: Optional[int] = None, logits_soft_cap: Optional[float] = None) -> torch.Tensor:
        nd, bs = md.num_decodes, md.block_size
        seq_lens = md.seq_lens[:nd]
        if sliding_window:
            # each row from the block of its window's first key: O(window) per row
            lo = (seq_lens - sliding_window).clamp(min=0)
            first = lo // bs
            # the most blocks a window can span: a fixed shape, no host sync (CUDA graphs)
            nblocks = min((sliding_window + 2 * bs - 2) // bs, md.block_tables.shape[1])
            idx = (first[:, None] + torch.arange(nblocks, device=q.device)).clamp(max=md.block_tables.shape[1] - 1)
            bt = md.block_tables[:nd].gather(1, idx)
            pos = first[:, None] * bs + torch.arange(nblocks * bs, device=q.device)[None, :]
            pad = (pos >= seq_lens[:, None]) | (pos < lo[:, None])
            length = nblocks * bs
        else:
            length = md.max_decode_seq_len
            bt = md.block_tables[:nd, :-(-length // bs)]
            pad = torch.arange(length, device=q.device)[None, :] >= seq_lens[:, None]
        keys = k_cache[bt].flatten(1, 2)[:, :length]  # [nd, L, KVH, D]
        vals = v_cache[bt].flatten(1, 2)[:, :length]
        # Grouped-query attention as two batched matmuls: [nd, KVH, G, D] x [nd, KVH, D, L].
        # For one query row this beats SDPA's flash kernel on the CPU.
        kvh, d = keys.shape[2], keys.shape[3]
        qg = q.view(nd, kvh, -1, d)
        scores = torch.matmul(qg, keys.permute(0, 2, 3, 1).to(q.dtype)).float() * scale
        if logits_soft_cap:
            scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        o = torch.matmul(probs, vals.transpose(1, 2).to(q.dtype))  # [nd, KVH, G, D]
        return o.reshape(nd, -1, d)

    @staticmethod
    def _prefill(q, k, v, k_cache, v_cache, block_ids, seq_len: int, scale: float,
                 sliding_window: Optional[int] = None, logits_soft_cap: Optional[float] = None) -> torch.Tensor:
        qlen = q.shape[0]
        first = max(seq_len - qlen - sliding_window + 1, 0) // k_cache.shape[1] if sliding_window else 0
        # no cached prefix, no window, no cap: SDPA's causal kernel over the chunk itself
        if qlen == seq_len and not sliding_window and not logits_soft_cap:
            keys, vals, mask, causal = k, v, None, True
        else:
            if qlen == seq_len:
                keys, vals = k, v
            else:
                keys = gather_kv(k_cache, block_ids, seq_len, first).to(q.dtype)
                vals = gather_kv(v_cache, block_ids, seq_len, first).to(q.dtype)
            pos_q = torch.arange(seq_len - qlen, seq_len, device=q.device)[:, None]
            pos_k = torch.arange(seq_len - keys.shape[0], seq_len, device=q.device)[None, :]
            mask = pos_k <= pos_q
            if sliding_window:
                mask &= pos_k > pos_q - sliding_window
            causal = False
        group = q.shape[1] // keys.shape[1]
        if group > 1:
            # NOTE: with enable_gqa=True the CPU picks SDPA's unfused math path, several
            # times slower than the flash kernel on keys repeated per query head.
            keys, vals = keys.repeat_interleave(group, dim=1), vals.repeat_interleave(group, dim=1)
        if logits_soft_cap:
            return _softcapped_attention(q, keys, vals, mask, scale, logits_soft_cap)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0), vals.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale)
        return o[0].transpose(0, 1)


def _softcapped_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor,
                          scale: float, cap: float) -> torch.Tensor:
    """Attention with scores ``cap * tanh(scores / cap)`` (Gemma 2), which SDPA cannot do;
    q: [Lq, H, D], keys/vals: [Lk, H, D], mask: [Lq, Lk] True where a key is seen."""
    scores = torch.einsum("qhd,khd->hqk", q, keys).float() * scale
    scores = torch.tanh(scores / cap) * cap
    scores.masked_fill_(~mask[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.einsum("hqk,khd->qhd", probs, vals)
