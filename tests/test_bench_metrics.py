"""Benchmark metrics against hand-made timings: exact numbers, no server."""
import math

import pytest

from inflight.bench.metrics import (RequestRecord, format_table, meets_slo, nearest_rank, parse_goodput,
                                    percentile, summarize)


def rec(id, ttft, e2e, n, itl=(), start=0.0, prompt=10, success=True):
    return RequestRecord(id=id, prompt_tokens=prompt, max_tokens=n, output_tokens=n, success=success,
                         start=start, ttft=ttft, e2e=e2e, itl=list(itl))


def test_percentile_interpolates_linearly_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 90) == pytest.approx(3.7)  # h = 2.7 -> 3 + 0.7 * 1
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_nearest_rank_returns_an_observed_value():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted: 1 2 3 4; rank round(p/100 * 3)
    assert [nearest_rank(xs, p) for p in (0, 50, 90, 99, 100)] == [1.0, 3.0, 4.0, 4.0, 4.0]
    assert nearest_rank([7.0], 50) == 7.0
    assert math.isnan(nearest_rank([], 50))
    assert math.isnan(percentile([], 50))


def test_tpot_is_decode_time_per_token_after_the_first():
    r = rec("a", ttft=0.5, e2e=2.5, n=5)
    assert r.tpot == pytest.approx((2.5 - 0.5) / 4)
    assert rec("b", ttft=0.5, e2e=0.5, n=1).tpot is None  # one token: no TPOT
    assert rec("c", ttft=None, e2e=1.0, n=3, success=False).tpot is None
    assert r.end == 2.5 and rec("d", 0.1, 1.0, 2, start=3.0).end == 4.0


def test_summary_numbers_are_exact():
    records = [
        rec("a", ttft=0.1, e2e=1.1, n=11, itl=[0.1] * 10, start=0.0, prompt=20),   # tpot 0.1
        rec("b", ttft=0.2, e2e=0.6, n=5, itl=[0.1, 0.1, 0.1, 0.1], start=0.5, prompt=30),  # tpot 0.1
        rec("c", ttft=0.3, e2e=2.3, n=3, itl=[1.0, 1.0], start=1.0, prompt=40),  # tpot 1.0
        rec("d", ttft=None, e2e=0.05, n=0, start=1.5, success=False),
    ]
    records[3].output_tokens = 0
    s = summarize(records, duration=4.0, slo={"ttft": 250, "tpot": 150})
    assert (s["num_requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["total_input_tokens"] == 90 and s["total_output_tokens"] == 19
    assert s["request_throughput"] == pytest.approx(3 / 4.0)
    assert s["output_throughput"] == pytest.approx(19 / 4.0)
    assert s["total_token_throughput"] == pytest.approx(109 / 4.0)
    assert s["ttft_mean_ms"] == pytest.approx(200.0)
    assert s["ttft_p50_ms"] == pytest.approx(200.0)
    assert s["ttft_p90_ms"] == pytest.approx(280.0)  # 200 + 0.8 * 100
    assert s["tpot_mean_ms"] == pytest.approx(400.0)
    assert s["tpot_p50_ms"] == pytest.approx(100.0)
    assert s["tpot_p99_ms"] == pytest.approx(982.0)  # 100 + 0.98 * 900
    # ITL pools every gap of every successful request: 14 gaps of 100 ms, 2 of 1000 ms.
    assert s["itl_mean_ms"] == pytest.approx((14 * 100 + 2 * 1000) / 16)
    assert s["itl_p50_ms"] == pytest.approx(100.0)
    assert s["e2el_mean_ms"] == pytest.approx(4000 / 3)
    assert s["e2el_p50_ms"] == pytest.approx(1100.0)
    # Goodput: a (ttft 100, tpot 100) and b (200, 100) meet both SLOs; c misses both; d failed.
    assert s["good_requests"] == 2
    assert s["goodput"] == pytest.approx(2 / 4.0)


def test_goodput_needs_every_slo_and_the_boundary_counts():
    a = rec("a", ttft=0.25, e2e=1.25, n=11)  # ttft 250 ms, tpot 100 ms
    assert meets_slo(a, {"ttft": 250, "tpot": 100})
    assert not meets_slo(a, {"ttft": 249.9})
    assert not meets_slo(a, {"tpot": 99.9})
    assert meets_slo(a, {"e2el": 1250}) and not meets_slo(a, {"e2el": 1249})
    assert meets_slo(rec("one", ttft=0.1, e2e=0.1, n=1), {"tpot": 1})  # no TPOT: meets it
    assert not meets_slo(rec("f", ttft=0.1, e2e=0.2, n=2, success=False), {"ttft": 1e9})
    s = summarize([a], 1.0)
    assert "goodput" not in s  # no SLO given: no goodput


def test_parse_goodput():
    assert parse_goodput(["ttft:500", "tpot:50.5", "e2el:9000"]) == {"ttft": 500.0, "tpot": 50.5, "e2el": 9000.0}
    assert parse_goodput(None) == {}
    for bad in (["ttft"], ["itl:5"], ["tpot:-1"], ["tpot:x"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_custom_percentiles_and_table():
    s = summarize([rec("a", 0.1, 0.5, 5, itl=[0.1] * 4)], 1.0, {"ttft": 1000}, percentiles=(25, 99.9))
    assert "ttft_p25_ms" in s and "ttft_p99_9_ms" in s and "ttft_p50_ms" not in s
    table = format_table("t", s, (25, 99.9))
    assert "Goodput" in table and "p99_9" in table and "TPOT (ms)" in table


def test_empty_run_has_nan_latencies_not_errors():
    s = summarize([rec("f", None, 0.1, 0, success=False)], 1.0)
    assert s["completed"] == 0 and s["failed"] == 1 and s["output_throughput"] == 0
    assert math.isnan(s["ttft_p99_ms"])
    assert "TTFT" not in format_table("t", s)
