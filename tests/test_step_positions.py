"""The model runner flattens a step's scheduled tokens: each token's position and its
request's row, and from them each new token's KV slot through the block table."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inflight.worker.model_runner import ModelRunner, flat_positions


def naive(q_lens, starts):
    positions = [s + j for s, n in zip(starts, q_lens) for j in range(n)]
    rows = [i for i, n in enumerate(q_lens) for _ in range(n)]
    return positions, rows


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5000)), min_size=1, max_size=20))
def test_positions_and_rows_of_any_mix_of_decodes_and_prefill_chunks(reqs):
    q_lens, starts = [n for n, _ in reqs], [s for _, s in reqs]
    positions, rows = flat_positions(q_lens, starts)
    assert positions.dtype == rows.dtype == np.int64
    assert (positions.tolist(), rows.tolist()) == naive(q_lens, starts)


def test_slots_follow_each_requests_own_block_table():
    runner = ModelRunner.__new__(ModelRunner)  # _block_table needs only the block size and device
    runner.block_size, runner.device = 4, torch.device("cpu")
    # a decode at position 5 (block 1 of [7, 3]), then a 3-token chunk from position 3 over [2, 9]
    positions, rows = flat_positions([1, 3], [5, 3])
    bt, slots = runner._block_table([[7, 3], [2, 9, 4]], rows, positions)
    assert bt.tolist() == [[7, 3, 0], [2, 9, 4]] and bt.dtype == torch.int64
    assert slots.tolist() == [3 * 4 + 1, 2 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1]
