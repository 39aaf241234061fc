"""Sliding-window attention in every CPU attention path: the torch reference and the C
float32 kernels (decode and prefill, every ISA level this machine runs) against a dense
masked attention in float64, with the blocks before every query's window poisoned so
that a kernel reading them (not just masking them) fails."""
import pytest
import torch

from inflight.attention.cpu_paged import CpuPagedAttentionBackend
from inflight.attention.torch_ref import TorchAttentionBackend
from inflight.kernels.cpu.build import load_library
from inflight.kernels.cpu.isa import supported_levels
from test_cpu_fp32_kernels import make_step, no_fallback

LEVELS = supported_levels()


@pytest.fixture(params=LEVELS, ids=lambda lv: lv.name)
def backend(request):
    return CpuPagedAttentionBackend(load_library("paged_decode", request.param),
                                    load_library("paged_prefill", request.param))


def dense_reference(q, k, v, kc, vc, md, scale, window):
    """Every request's queries over its whole history with transformers' mask: the token
    at position p sees keys (p - window, p]. Float64, from the pool (new K/V included)."""
    kc, vc = kc.clone(), vc.clone()
    TorchAttentionBackend._write_kv(k, v, kc, vc, md.slot_mapping)
    out = torch.empty(q.shape, dtype=torch.float64)
    bs, qsl = md.block_size, md.query_start_loc_list
    for i in range(md.num_reqs):
        s, e, n = qsl[i], qsl[i + 1], md.seq_lens_list[i]
        pos = torch.arange(n)
        slots = md.block_tables[i, pos // bs] * bs + pos % bs
        keys = kc.flatten(0, 1)[slots].double()
        vals = vc.flatten(0, 1)[slots].double()
        group = q.shape[1] // keys.shape[1]
        keys, vals = keys.repeat_interleave(group, 1), vals.repeat_interleave(group, 1)
        pos_q = torch.arange(n - (e - s), n)[:, None]
        mask = (pos[None, :] <= pos_q) & (pos[None, :] > pos_q - window)
        scores = torch.einsum("qhd,khd->hqk", q[s:e].double(), keys) * scale
        probs = scores.masked_fill(~mask[None], float("-inf")).softmax(-1)
        out[s:e] = torch.einsum("hqk,khd->qhd", probs, vals)
    return out


def poison_outside_window(kc, vc, md, window):
    """Point every block-table entry that lies wholly before the window of a request's
    first query at one NaN-filled block, as the KV manager's placeholder for freed blocks."""
    null = min(set(range(kc.shape[0])) - set(md.block_tables.flatten().tolist()))  # a block no request holds
    kc[null], vc[null] = float("nan"), float("nan")
    qsl, bs = md.query_start_loc_list, md.block_size
    poisoned = 0
    for i in range(md.num_reqs):
        first_pos = md.seq_lens_list[i] - (qsl[i + 1] - qsl[i])
        skip = max(first_pos - window + 1, 0) // bs  # blocks every query of the request skips
        md.block_tables[i, :skip] = null
        poisoned += skip
    return poisoned


# decodes below, at and past the window (contexts across 64-key tiles), prefill chunks
# with no cache, chunks over cached prefixes longer than the window, short chunks
STEP = [(0, 1), (5, 1), (16, 1), (17, 1), (40, 1), (300, 1), (0, 5), (0, 77), (33, 31), (100, 65), (0, 90),
        (200, 40), (61, 3), (127, 2)]


@pytest.mark.parametrize("window", [1, 37])
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(9, 3, 64, 16), (16, 1, 36, 5)])
def test_windowed_step_matches_dense_mask(backend, monkeypatch, window, heads, kv_heads, dim, block_size):
    q, k, v, kc, vc, md = make_step(window + heads + dim, heads, kv_heads, dim, block_size, STEP)
    scale = dim ** -0.5
    want = dense_reference(q, k, v, kc, vc, md, scale, window)
    assert poison_outside_window(kc, vc, md, window) > 10
    ref = TorchAttentionBackend().forward(q, k, v, kc.clone(), vc.clone(), md, scale, window)
    torch.testing.assert_close(ref.double(), want, atol=1e-5, rtol=1e-5)
    no_fallback(monkeypatch)
    got = backend.forward(q, k, v, kc, vc, md, scale, window)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_window_wider_than_context_is_global(backend):
    """A window past every context changes nothing: bit-identical to no window."""
    q, k, v, kc, vc, md = make_step(3, 8, 2, 64, 16, STEP)
    want = backend.forward(q, k, v, kc.clone(), vc.clone(), md, 0.125)
    got = backend.forward(q, k, v, kc, vc, md, 0.125, 10_000)
    assert torch.equal(got, want)


def test_bf16_declines_the_window_to_the_reference(backend):
    """The bf16 kernels take no window: the backend runs the torch reference instead."""
    q, k, v, kc, vc, md = make_step(4, 8, 2, 64, 16, [(40, 1), (100, 30)])
    q, k, v, kc, vc = (t.bfloat16() for t in (q, k, v, kc, vc))
    want = dense_reference(q, k, v, kc, vc, md, 0.125, 24)
    poison_outside_window(kc, vc, md, 24)
    got = backend.forward(q, k, v, kc, vc, md, 0.125, 24)
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


def test_triton_backend_declines_the_window_to_the_reference():
    """The Triton kernels take no window: a windowed layer gets the torch reference's result."""
    triton_attn = pytest.importorskip("inflight.attention.triton")
    if not triton_attn.is_available():
        pytest.skip("no Triton")
    q, k, v, kc, vc, md = make_step(6, 8, 2, 64, 16, [(40, 1), (300, 1), (100, 30)])
    want = dense_reference(q, k, v, kc, vc, md, 0.125, 24)
    poison_outside_window(kc, vc, md, 24)
    got = triton_attn.TritonAttentionBackend().forward(q, k, v, kc, vc, md, 0.125, 24)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
