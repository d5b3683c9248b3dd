"""The per-tenant add-rate token bucket."""

from __future__ import annotations

import math

from queue_daemon.engine.admit.quotas import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_rate_then_refill() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=20, clock=clock)
    assert limiter.take("a", 15) == 0.0
    assert limiter.take("a", 5) == 0.0
    wait = limiter.take("a", 5)  # bucket empty: 5 tokens take half a second
    assert math.isclose(wait, 0.5)
    clock.now += 0.5
    assert limiter.take("a", 5) == 0.0
    clock.now += 100  # refills only up to the burst
    assert limiter.take("a", 20) == 0.0
    assert limiter.take("a", 1) > 0


def test_tenants_have_their_own_buckets_and_zero_is_unlimited() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=1, burst=2, clock=clock)
    assert limiter.take("a", 2) == 0.0
    assert limiter.take("a", 1) > 0
    assert limiter.take("b", 2) == 0.0  # a's flood does not touch b
    assert math.isinf(limiter.take("b", 3))  # never fits in the burst
    assert RateLimiter(rate=0, burst=1).take("a", 10**9) == 0.0


def test_a_refused_request_takes_nothing() -> None:
    clock = Clock()
    limiter = RateLimiter(rate=10, burst=10, clock=clock)
    assert limiter.take("a", 8) == 0.0
    assert limiter.take("a", 5) > 0
    assert limiter.take("a", 2) == 0.0  # the refused 5 were not taken


def test_take_up_to_takes_what_the_bucket_holds() -> None:
    clock = Clock()
    rl = RateLimiter(rate=10, burst=25, clock=clock)
    assert rl.take_up_to("t", 1000) == 25  # the burst, at most
    assert rl.take_up_to("t", 1000) == 0
    clock.now += 0.35  # 3.5 tokens: whole ones only
    assert rl.take_up_to("t", 1000) == 3
    rl.refund("t", 2)
    assert rl.take_up_to("t", 1) == 1
    assert RateLimiter(rate=0, burst=1, clock=clock).take_up_to("t", 1000) == 1000  # no limit
