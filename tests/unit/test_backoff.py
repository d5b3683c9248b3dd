"""The one backoff of the retry loops: doubling to a cap, a reset, bounded jitter."""

from __future__ import annotations

import pytest

from queue_daemon.engine.backoff import Backoff


def test_delays_double_up_to_the_cap_and_start_again_after_a_reset() -> None:
    backoff = Backoff(0.05, 0.3)
    assert [backoff.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    backoff.reset()
    assert backoff.next() == 0.05


def test_jitter_stays_within_half_and_one_and_a_half_of_each_delay() -> None:
    backoff = Backoff(1.0, 8.0, jitter=True)
    for base in (1.0, 2.0, 4.0, 8.0, 8.0):
        assert 0.5 * base <= backoff.next() <= 1.5 * base


@pytest.mark.parametrize(("first", "cap"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_a_backoff_that_could_not_wait_is_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError):
        Backoff(first, cap)
