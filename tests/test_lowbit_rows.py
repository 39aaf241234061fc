"""The low-bit panels' row limit, measured at load (kernels/cpu/lowbit_rows.py): the
search stops at the first row count where the fp32 panels are clearly faster (a near-tie
counts for the low-bit ones), the answer is kept per machine and model so a warm start
measures nothing (unless it was measured on a busy machine), and the environment variable
overrides both."""
import pytest
import torch
from torch import nn

from inflight.kernels.cpu import lowbit_rows
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32
from inflight.kernels.cpu.lowbit_rows import measure_max_rows, tune_lowbit_max_rows
from inflight.kernels.cpu.panel_lowbit import LOWBIT_MAX_ROWS

pytest.importorskip("gguf")
from tests.test_panel_lowbit import gguf_weight  # noqa: E402


def fake_timer(lowbit_faster_up_to: int, calls: list):
    def timer(rows: int, lowbit: bool) -> float:
        calls.append((rows, lowbit))
        fp32 = 1.0 + rows
        return fp32 * (0.8 if rows <= lowbit_faster_up_to else 1.2) if lowbit else fp32
    return timer


@pytest.mark.parametrize("crossover,expected", [(8, 8), (12, 8), (64, 64), (1000, LOWBIT_MAX_ROWS), (2, 0)])
def test_the_limit_is_the_last_row_count_where_low_bit_wins(crossover, expected):
    calls = []
    assert measure_max_rows(fake_timer(crossover, calls)) == expected
    tried = sorted({r for r, _ in calls})
    # it stops at the first loss: no time spent on larger steps
    first_loss = min([r for r in lowbit_rows.CANDIDATE_ROWS if r > crossover], default=LOWBIT_MAX_ROWS)
    assert tried == [r for r in lowbit_rows.CANDIDATE_ROWS if r <= first_loss]
    for rows in tried:  # both kinds, the same number of rounds, neither always first
        mine = [low for r, low in calls if r == rows]
        assert mine.count(True) == mine.count(False) == lowbit_rows.ROUNDS
        firsts = [mine[i] for i in range(0, len(mine), 2)]
        assert True in firsts and False in firsts


def test_a_near_tie_counts_for_the_low_bit_panels():
    """Within TIE of the fp32 panels the low-bit ones still count (they leave the DRAM to
    attention in a real step); clearly slower, the search stops."""
    def timer(slower):
        return lambda rows, lowbit: (1.0 + rows) * ((1 + slower) if lowbit and rows > 8 else 1.0)

    assert measure_max_rows(timer(lowbit_rows.TIE * 0.6)) == LOWBIT_MAX_ROWS
    assert measure_max_rows(timer(lowbit_rows.TIE * 2)) == 8


def test_a_slow_outlier_does_not_decide():
    """Interrupted rounds (another process took the core) must not flip the answer."""
    seen = []

    def timer(rows, lowbit):
        seen.append(rows)
        t = (0.5 if lowbit else 1.0) * rows
        return t * 50 if lowbit and seen.count(rows) in (2, 4) else t

    assert measure_max_rows(timer) == LOWBIT_MAX_ROWS


class TwoLayers(nn.Module):
    def __init__(self, lowbit: bool = True):
        super().__init__()
        self.a = PanelLinearF32(gguf_weight(64, 64, seed=1), None, lowbit=lowbit)
        self.b = PanelLinearF32(gguf_weight(96, 64, "Q8_0", seed=2), None, lowbit=lowbit)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(lowbit_rows.ENV, raising=False)
    measured = []

    def measure(timer, *a, **kw):
        timer(8, True)  # the real timer runs over the model
        measured.append(1)
        return 16

    monkeypatch.setattr(lowbit_rows, "measure_max_rows", measure)
    monkeypatch.setattr(lowbit_rows, "cpu_share", lambda wall, cpu: 1.0)  # a quiet machine
    return tmp_path, measured


def test_measured_once_then_read_back(cache):
    tmp_path, measured = cache
    model = TwoLayers()
    assert tune_lowbit_max_rows(model) == 16 and measured == [1]
    assert model.a.lowbit_max_rows == model.b.lowbit_max_rows == 16
    again = TwoLayers()
    assert tune_lowbit_max_rows(again) == 16 and measured == [1]  # from the cache
    assert again.a.lowbit_max_rows == 16
    assert len(list((tmp_path / "tune").iterdir())) == 1


def test_another_thread_count_or_model_measures_again(cache):
    _, measured = cache
    tune_lowbit_max_rows(TwoLayers())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        tune_lowbit_max_rows(TwoLayers())
    finally:
        torch.set_num_threads(threads)
    assert len(measured) == 2
    other = TwoLayers()
    other.b = PanelLinearF32(gguf_weight(128, 64, "Q8_0", seed=2), None)
    tune_lowbit_max_rows(other)
    assert len(measured) == 3


def test_a_measurement_on_a_busy_machine_is_used_but_not_kept(cache, monkeypatch):
    tmp_path, measured = cache
    monkeypatch.setattr(lowbit_rows, "cpu_share", lambda wall, cpu: lowbit_rows.QUIET_SHARE / 2)
    model = TwoLayers()
    assert tune_lowbit_max_rows(model) == 16 and model.a.lowbit_max_rows == 16
    assert not (tmp_path / "tune").exists() or not list((tmp_path / "tune").iterdir())
    monkeypatch.setattr(lowbit_rows, "cpu_share", lambda wall, cpu: 1.0)
    tune_lowbit_max_rows(TwoLayers())  # measured again, on a quiet machine this time: kept
    assert len(measured) == 2 and len(list((tmp_path / "tune").iterdir())) == 1


def test_a_corrupt_cache_entry_measures_again(cache):
    tmp_path, measured = cache
    tune_lowbit_max_rows(TwoLayers())
    (entry,) = (tmp_path / "tune").iterdir()
    entry.write_text("{not json")
    assert tune_lowbit_max_rows(TwoLayers()) == 16 and len(measured) == 2


def test_the_environment_sets_the_limit_without_measuring(cache, monkeypatch):
    _, measured = cache
    monkeypatch.setenv(lowbit_rows.ENV, "-1")
    model = TwoLayers()
    assert tune_lowbit_max_rows(model) == -1 and measured == []
    calls = []
    real = model.a.lib

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    model.a.lib = Spy()
    model.a(torch.randn(1, 64))
    assert calls == ["gemm_f32"]  # even one row reads the fp32 panels
    monkeypatch.setenv(lowbit_rows.ENV, "many")
    with pytest.raises(ValueError, match="INFLIGHT_LOWBIT_MAX_ROWS"):
        tune_lowbit_max_rows(model)


def test_a_model_without_low_bit_panels_is_left_alone(cache):
    _, measured = cache
    model = TwoLayers(lowbit=False)
    assert tune_lowbit_max_rows(model) is None and measured == []
    assert model.a.lowbit_max_rows == LOWBIT_MAX_ROWS
