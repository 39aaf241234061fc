"""CUDA graphs for decode-only steps: bucketing and padding on the CPU, capture on a GPU.

On the CPU, :class:`EagerReplayRunner` stands in for capture: its "replay" runs the
model eagerly on the runner's static, padded buffers, so every decode step takes
exactly the padded path a captured graph replays (slot -1 and context length 0 for
padding rows, split count frozen per bucket), through the Triton kernels under
Triton's interpreter. The real capture runs only where CUDA is available.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the @triton.jit decorations

from inflight.attention.base import AttentionMetadata  # noqa: E402
from inflight.worker.cuda_graphs import (PAD_SLOT, CudaGraphRunner, StaticDecodeInputs, capture_sizes,  # noqa: E402
                                         is_decode_only, padded_size)


def test_capture_sizes_and_padding_buckets():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(256)[:5] == [1, 2, 4, 8, 16] and capture_sizes(256)[-1] == 256
    assert capture_sizes(1000)[-1] == 256  # larger batches run eagerly
    sizes = capture_sizes(64)
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 64)] == [1, 2, 4, 8, 8, 16, 64]
    assert padded_size(65, sizes) is None


def decode_md(seq_lens, tables, slots, block_size=4):
    n = len(seq_lens)
    return AttentionMetadata(slot_mapping=torch.tensor(slots), block_tables=torch.tensor(tables),
                             seq_lens=torch.tensor(seq_lens), query_start_loc_list=list(range(n + 1)),
                             seq_lens_list=list(seq_lens), num_decodes=n, block_size=block_size,
                             max_decode_seq_len=max(seq_lens))


def test_static_inputs_fill_pads_and_clears_previous_rows():
    st = StaticDecodeInputs.allocate(8, 5, torch.device("cpu"))
    md = decode_md([5, 9, 2], [[3, 4, 0], [7, 8, 9], [1, 0, 0]], [16, 34, 5])
    st.fill(torch.tensor([11, 12, 13]), torch.tensor([4, 8, 1]), md, padded=4)
    assert st.input_ids[:4].tolist() == [11, 12, 13, 0]
    assert st.slot_mapping[:4].tolist() == [16, 34, 5, PAD_SLOT]
    assert st.seq_lens[:4].tolist() == [5, 9, 2, 0]
    assert st.block_tables[1, :3].tolist() == [7, 8, 9]
    # A smaller batch next: row 2 must become padding, not keep the last step's request.
    st.fill(torch.tensor([21, 22]), torch.tensor([5, 9]), decode_md([6, 10], [[3, 4], [7, 8]], [17, 35]), padded=4)
    assert st.slot_mapping[:4].tolist() == [17, 35, PAD_SLOT, PAD_SLOT]
    assert st.seq_lens[:4].tolist() == [6, 10, 0, 0]
    md4 = st.metadata(4, 4, 64)
    assert md4.num_decodes == md4.num_reqs == 4 and md4.block_tables.shape == (4, 5)


def test_can_run_only_decode_only_batches_that_fit():
    runner = CudaGraphRunner(model=None, kv_caches=[], backend=None, block_size=4, max_model_len=20,
                             max_num_seqs=4, device=torch.device("cpu"))
    runner.graphs = {s: None for s in runner.sizes}
    ids = torch.zeros(3, dtype=torch.int64)
    assert runner.can_run(ids, decode_md([5, 9, 2], [[0]] * 3, [0, 1, 2]))
    mixed = decode_md([5, 9, 2], [[0]] * 3, [0, 1, 2])
    mixed.num_decodes = 2
    assert not is_decode_only(mixed) and not runner.can_run(ids, mixed)
    assert not runner.can_run(torch.zeros(5, dtype=torch.int64), decode_md([1] * 5, [[0]] * 5, [0] * 5))
    wide = decode_md([5], [[0] * 6], [0])  # wider than max_model_len / block_size = 5 blocks
    assert not runner.can_run(ids[:1], wide)


class _EagerReplay:
    """A 'graph' whose replay runs the model eagerly on the static buffers of one bucket."""

    def __init__(self, runner: CudaGraphRunner, size: int) -> None:
        self.runner, self.size = runner, size

    def replay(self) -> None:
        r, n = self.runner, self.size
        md = r.static.metadata(n, r.block_size, r.max_model_len)
        with r.backend.fixed_splits(r._splits(n, r.kv_caches[0][0].shape[2])):
            r.outputs[n] = r.model(r.static.input_ids[:n], r.static.positions[:n], r.kv_caches, md)


class EagerReplayRunner(CudaGraphRunner):
    def capture(self) -> float:
        self.graphs = {s: _EagerReplay(self, s) for s in self.sizes}
        return 0.0


def _tiny_llm(tmp_path, monkeypatch, backend: str):
    from inflight import LLM
    from inflight.loader.testing import tiny_model, write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    if not path.exists():
        write_tiny_gguf(str(path), tiny_model("llama", tie=False))
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path / "cache"))
    return LLM(str(path), dtype="float32", device="cpu", attention_backend=backend, kv_cache_memory=2**20,
               block_size=4, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)


def test_padded_decode_steps_match_eager_end_to_end(tmp_path, monkeypatch):
    """Greedy tokens of a tiny fp32 Llama: torch reference == Triton kernels == Triton kernels
    with every decode step padded to its bucket (3 running requests -> bucket 4)."""
    pytest.importorskip("triton")
    from inflight import SamplingParams

    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [40, 41, 42, 43, 44]]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)

    def run(backend, graphs=False):
        llm = _tiny_llm(tmp_path, monkeypatch, backend)
        runner = llm.llm_engine.runner
        if graphs:
            runner.graph_runner = EagerReplayRunner(runner.model, runner.kv_caches, runner.model.layers[0]
                                                    .self_attn.backend, 4, 64, 4, torch.device("cpu"))
            runner.graph_runner.capture()
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs], runner.graph_runner

    want, _ = run("torch")
    got, _ = run("triton")
    padded, graph_runner = run("triton", graphs=True)
    assert got == want and padded == want
    assert graph_runner.num_replays >= 4  # every decode step went through the padded path


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_captured_graphs_match_eager_on_gpu(tmp_path, monkeypatch):
    from inflight import SamplingParams

    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [40, 41, 42, 43, 44]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        from inflight import LLM
        from inflight.loader.testing import tiny_model, write_tiny_gguf

        path = tmp_path / "tiny.gguf"
        if not path.exists():
            write_tiny_gguf(str(path), tiny_model("llama", tie=False))
        monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path / "cache"))
        llm = LLM(str(path), dtype="float32", device="cuda", enforce_eager=eager, num_gpu_blocks_override=64,
                  block_size=16, max_num_seqs=4, max_model_len=64)
        runner = llm.llm_engine.runner
        assert (runner.graph_runner is None) == eager
        res = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
        outs[eager] = [o.outputs[0].token_ids for o in res]
        if not eager:
            assert runner.graph_runner.num_replays >= 7
    assert outs[True] == outs[False]


def test_memory_profile_batch_is_a_valid_prefill_step():
    """The dummy step the GPU profile runs (worker/kv_cache.py): requests of at most
    max_model_len covering num_tokens, every token in its own slot of the small pool."""
    from inflight.attention.torch_ref import TorchAttentionBackend
    from inflight.models.llama import LlamaForCausalLM
    from inflight.models.registry import ModelArchConfig
    from inflight.worker.kv_cache import dummy_prefill_batch

    cfg = ModelArchConfig("LlamaForCausalLM", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50)
    ids, positions, kv, md = dummy_prefill_batch(cfg, 16, torch.float32, torch.device("cpu"), 100, 40)
    assert md.seq_lens_list == [40, 40, 20] and md.query_start_loc_list == [0, 40, 80, 100]
    assert kv[0].shape == (3 + 3 + 2, 16, 2, 8)
    assert sorted(md.slot_mapping.tolist()) == sorted(set(md.slot_mapping.tolist()))  # no slot twice
    assert positions[:3].tolist() == [0, 1, 2] and positions[40].item() == 0
    model = LlamaForCausalLM(cfg, TorchAttentionBackend(), 64)
    with torch.no_grad():
        hidden = model(ids, positions, [kv] * cfg.num_hidden_layers, md)
    assert hidden.shape == (100, 32) and torch.isfinite(hidden).all()
