"""The batches an ingester keeps after settling them, for a failover: by age, by
size, and by the history they were settled on."""

from __future__ import annotations

from queue_daemon.engine.ingest.recent import Recent, RecentBatches


def _batch(name: str, size: int = 10) -> Recent:
    return Recent(0.0, "", [], [], frozenset({name}), size)


def test_batches_older_than_the_window_go() -> None:
    kept = RecentBatches(seconds=10, limit=1000)
    kept.add(100.0, "e1", _batch("a"))
    kept.add(105.0, "e1", _batch("b"))
    assert kept.prune(109.0) and len(kept) == 2
    assert kept.prune(111.0) and len(kept) == 1  # a is 11 s old
    assert not kept.prune(116.0)  # b too: nothing left to watch
    assert len(kept) == 0


def test_the_oldest_go_first_over_the_limit() -> None:
    kept = RecentBatches(seconds=10, limit=25)
    for name in "abc":
        kept.add(100.0, "e1", _batch(name))
    assert [next(iter(r.dispatched)) for r in kept.not_on("e0")] == ["b", "c"]


def test_only_batches_settled_on_another_history_are_to_insert_again() -> None:
    kept = RecentBatches(seconds=10, limit=1000)
    kept.add(100.0, "e1", _batch("a"))
    kept.add(101.0, "e2", _batch("b"))
    assert [next(iter(r.dispatched)) for r in kept.not_on("e2")] == ["a"]
    assert [r.epoch for r in kept.not_on("e3")] == ["e1", "e2"]
    assert kept.not_on("e1")[0].at == 101.0
