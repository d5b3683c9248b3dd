"""Throughput from samples of the monotonic archive counters: rates between
samples, the last-minute mean, and a window that forgets old samples."""

from __future__ import annotations

from queue_daemon.observe.throughput import Throughput


def test_no_rate_before_two_samples() -> None:
    t = Throughput(step=5, window=600)
    assert t.series("a-t") == [] and t.recent("a-t") is None
    t.add({"a-t": 10}, at=0.0)
    assert t.series("a-t") == [] and t.recent("a-t") is None


def test_rates_between_samples() -> None:
    t = Throughput(step=5, window=600)
    t.add({"a-t": 100}, at=0.0)
    t.add({"a-t": 150, "a-u": 5}, at=5.0)  # a-u's counter row appears with its first job
    t.add({"a-t": 150, "a-u": 5}, at=15.0)  # a sample missed: the gap's real length counts
    assert t.series("a-t") == [10.0, 0.0]
    assert t.series("a-u") == [1.0, 0.0]
    assert t.series("b-t") == [0.0, 0.0]
    assert t.recent("a-t") == round(50 / 15, 2)


def test_recent_spans_about_a_minute() -> None:
    t = Throughput(step=5, window=600)
    for i in range(40):  # 200 s at 2 jobs/s, then 10 jobs/s for the last 60 s
        t.add({"a-t": 2 * 5 * i}, at=5.0 * i)
    base = 2 * 5 * 39
    for i in range(1, 13):
        t.add({"a-t": base + 10 * 5 * i}, at=5.0 * (39 + i))
    assert t.recent("a-t") == 10.0
    assert t.series("a-t")[-1] == 10.0


def test_window_keeps_the_last_samples_only() -> None:
    t = Throughput(step=5, window=50)
    for i in range(100):
        t.add({"a-t": i}, at=float(i))
    assert len(t.series("a-t")) == 10  # 11 samples kept
    assert t.series("a-t") == [1.0] * 10


def test_a_counter_never_goes_backwards_in_the_rates() -> None:
    t = Throughput(step=5, window=600)
    t.add({"a-t": 10}, at=0.0)
    t.add({"a-t": 4}, at=5.0)  # not from this store (a restore, a hand edit): no negative rate
    assert t.series("a-t") == [0.0]


def test_of_is_recent_and_series_at_once_with_one_list_for_idle_types() -> None:
    t = Throughput(step=5, window=600)
    assert t.of("a-t") == (None, [])
    t.add({"a-t": 100, "b-t": 7}, at=0.0)
    assert t.of("a-t") == (None, [])
    for at in (5.0, 10.0, 70.0):
        t.add({"a-t": 100 + int(at), "b-t": 7}, at=at)
    for stored in ("a-t", "b-t", "c-t"):  # busy, idle with a counter, idle without
        assert t.of(stored) == (t.recent(stored), t.series(stored)), stored
    assert t.of("b-t")[1] is t.of("c-t")[1]  # shared, never changed in place
    t.add({"a-t": 200, "b-t": 7}, at=75.0)
    assert t.of("b-t")[1] == [0.0] * 4 and t.of("a-t")[1] != t.of("b-t")[1]
    same_time = Throughput(step=5, window=600)
    same_time.add({}, at=1.0)
    same_time.add({}, at=1.0)
    assert same_time.of("a-t") == (same_time.recent("a-t"), same_time.series("a-t"))
