"""The peers table's arithmetic (bench/peers/run.py): which peer is best, and the
ratio turned so that above 1 this project is ahead, for rates and for latencies."""

from __future__ import annotations

import pytest

from bench.peers.ours import percentiles
from bench.peers.run import Row, render
from bench.procs import BenchError


def test_a_rate_is_compared_with_the_fastest_peer() -> None:
    row = Row(
        "e2e", "jobs/s", True, ours=30_000.0, peers={"pgqueuer": 10_000.0, "procrastinate": 500.0}
    )
    assert row.best_peer == ("pgqueuer", 10_000.0)
    assert row.ratio == pytest.approx(3.0)


def test_a_latency_is_compared_with_the_quickest_peer_and_turned() -> None:
    row = Row("p50", "ms", False, ours=4.0, peers={"pgqueuer": 8.0, "procrastinate": 3000.0})
    assert row.best_peer == ("pgqueuer", 8.0)
    assert row.ratio == pytest.approx(2.0)  # above 1: this project starts jobs sooner
    slower = Row("p50", "ms", False, ours=16.0, peers={"pgqueuer": 8.0})
    assert slower.ratio == pytest.approx(0.5)


def test_a_failed_figure_has_no_ratio_and_a_failed_peer_is_not_the_best() -> None:
    row = Row("e2e", "jobs/s", True, ours=None, peers={"pgqueuer": 10.0})
    assert row.ratio is None
    row = Row("e2e", "jobs/s", True, ours=20.0, peers={"pgqueuer": None, "procrastinate": 5.0})
    assert row.best_peer == ("procrastinate", 5.0)
    assert row.ratio == pytest.approx(4.0)
    assert Row("e2e", "jobs/s", True, ours=20.0, peers={"pgqueuer": None}).ratio is None


def test_the_table_shows_every_figure_and_failures() -> None:
    rows = [
        Row(
            "enqueue",
            "jobs/s",
            True,
            ours=2_520.4,
            peers={"pgqueuer": 2_086.0, "procrastinate": None},
        ),
        Row("p50", "ms", False, ours=3.5, peers={"pgqueuer": 7.97, "procrastinate": 3_175.0}),
    ]
    text = render(rows).splitlines()
    assert text[0].split()[:3] == ["workload", "unit", "this"]
    assert "2,520" in text[2] and "2,086" in text[2] and "FAILED" in text[2] and "1.21" in text[2]
    assert "3.50" in text[3] and "7.97" in text[3] and "3,175" in text[3] and "2.28" in text[3]


def test_percentiles() -> None:
    assert percentiles([float(i) for i in range(1, 101)]) == (50.5, 99.0)
    with pytest.raises(BenchError):
        percentiles([])
