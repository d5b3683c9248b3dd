"""What an ingester keeps of the batches it settled, for a failover: kept until the
store was seen alive on their history long enough after, and inserted again when
a standby is promoted (a new timeline), not when the same server restarts."""

from __future__ import annotations

from queue_daemon.domain.jobs import NewJob
from queue_daemon.domain.pulled import OptedJobs
from queue_daemon.engine.ingest.recent import History, Recent

E1, RESTARTED, PROMOTED, AGAIN = "s1 tl00000001", "s2 tl00000001", "s3 tl00000002", "s4 tl00000003"


def _batch(name: str, at: float, epoch: str = E1, size: int = 10) -> Recent:
    return Recent(at, epoch, [], [], frozenset({name}), size)


class Reinserts:
    def __init__(self, epochs: list[str]) -> None:
        self.epochs = epochs  # the epoch each insert lands on, in turn
        self.names: list[str] = []

    async def __call__(
        self, jobs: list[NewJob], opted: list[OptedJobs], dispatched: frozenset[str]
    ) -> str:
        self.names.append(next(iter(dispatched)))
        return self.epochs.pop(0) if len(self.epochs) > 1 else self.epochs[0]


async def test_a_batch_is_let_go_once_the_store_was_seen_alive_long_after_it() -> None:
    history = History(Reinserts([E1]), seconds=10, limit=1000)
    await history.seen(E1, 90.0)
    history.keep(_batch("a", 100.0))
    history.keep(_batch("b", 105.0))
    await history.seen(E1, 109.0)
    assert len(history) == 2
    await history.seen(E1, 111.0)  # alive 11 s after a
    assert len(history) == 1
    await history.seen(E1, 200.0)
    assert len(history) == 0


async def test_the_oldest_go_first_over_the_limit() -> None:
    reinserts = Reinserts([PROMOTED])
    history = History(reinserts, seconds=10, limit=25)
    await history.seen(E1, 90.0)
    for name in "abc":
        history.keep(_batch(name, 100.0))
    await history.seen(PROMOTED, 500.0)  # an outage of any length drops nothing by age
    assert reinserts.names == ["b", "c"]
    assert len(history) == 2  # their time on the new history counts from now


async def test_a_restart_counts_the_kept_batches_time_from_now() -> None:
    history = History(Reinserts([E1]), seconds=10, limit=1000)
    await history.seen(E1, 90.0)
    history.keep(_batch("a", 100.0))
    await history.seen(RESTARTED, 500.0)  # back after a long outage
    assert len(history) == 1
    await history.seen(RESTARTED, 509.0)
    assert len(history) == 1
    await history.seen(RESTARTED, 511.0)
    assert len(history) == 0


async def test_the_first_flush_compares_batches_put_in_again_elsewhere() -> None:
    reinserts = Reinserts([PROMOTED])
    history = History(reinserts, seconds=10, limit=1000)
    history.keep(_batch("flushed", 100.0))  # on E1, before any history was seen
    history.keep(_batch("again", 100.0, PROMOTED))
    await history.seen(PROMOTED, 101.0)
    assert reinserts.names == ["flushed"]


async def test_a_promotion_inserts_again_what_was_settled_on_the_old_timeline() -> None:
    reinserts = Reinserts([PROMOTED])
    history = History(reinserts, seconds=10, limit=1000)
    await history.seen(E1, 90.0)
    history.keep(_batch("old", 100.0))
    history.keep(_batch("new", 101.0, PROMOTED))  # flushed on the new primary already
    await history.seen(PROMOTED, 102.0)
    assert reinserts.names == ["old"]
    assert history.epoch == PROMOTED and not history.replaying
    await history.seen(PROMOTED, 103.0)
    assert reinserts.names == ["old"]  # once


async def test_a_restart_on_the_same_timeline_inserts_nothing_again() -> None:
    reinserts = Reinserts([RESTARTED])
    history = History(reinserts, seconds=10, limit=1000)
    await history.seen(E1, 90.0)
    history.keep(_batch("a", 100.0))
    await history.seen(RESTARTED, 101.0)
    assert reinserts.names == []
    await history.seen(PROMOTED, 102.0)  # then a promotion: a is on it too
    assert reinserts.names == ["a"]


async def test_a_second_promotion_during_the_inserts_inserts_them_again() -> None:
    reinserts = Reinserts([PROMOTED, AGAIN, AGAIN])
    history = History(reinserts, seconds=10, limit=1000)
    await history.seen(E1, 90.0)
    history.keep(_batch("a", 100.0))
    history.keep(_batch("b", 100.5))
    await history.seen(PROMOTED, 102.0)
    # a landed on PROMOTED, b on AGAIN: a goes in again on AGAIN
    assert reinserts.names == ["a", "b", "a"]
    assert history.epoch == AGAIN


async def test_a_limit_of_nothing_keeps_nothing_to_insert_again() -> None:
    # the daemon's ingester on its embedded server: no standby could be promoted
    reinserts = Reinserts([PROMOTED])
    history = History(reinserts, seconds=10, limit=0)
    await history.seen(E1, 90.0)
    history.keep(_batch("a", 100.0, size=1))
    assert len(history) == 0
    await history.seen(PROMOTED, 101.0)
    assert reinserts.names == []


async def test_a_batch_kept_from_the_old_timeline_later_is_compared_on_the_next_look() -> None:
    # looks on an unchanged history skip the kept batches, but not one kept since
    # from another history (a flush that ran on the old primary)
    reinserts = Reinserts([PROMOTED])
    history = History(reinserts, seconds=10, limit=1000)
    await history.seen(PROMOTED, 90.0)
    history.keep(_batch("new", 100.0, PROMOTED))
    await history.seen(PROMOTED, 101.0)
    history.keep(_batch("late", 101.5))
    await history.seen(PROMOTED, 102.0)
    assert reinserts.names == ["late"]
    await history.seen(PROMOTED, 103.0)
    assert reinserts.names == ["late"]  # once
    assert len(history) == 2


async def test_a_batch_left_on_another_history_by_the_inserts_is_compared_again() -> None:
    # the inserts land on AGAIN, then back on PROMOTED: the first batch, on
    # AGAIN, goes in again on the next look at PROMOTED
    reinserts = Reinserts([AGAIN, PROMOTED, PROMOTED])
    history = History(reinserts, seconds=10, limit=1000)
    await history.seen(E1, 90.0)
    history.keep(_batch("a", 100.0))
    history.keep(_batch("b", 100.5))
    await history.seen(PROMOTED, 102.0)
    assert reinserts.names == ["a", "b"]
    assert history.epoch == PROMOTED
    await history.seen(PROMOTED, 103.0)
    assert reinserts.names == ["a", "b", "a"]
    await history.seen(PROMOTED, 104.0)
    assert reinserts.names == ["a", "b", "a"]
