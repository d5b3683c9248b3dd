"""Per-tenant limit overrides: validation, defaults and change notification."""

from __future__ import annotations

import math

import pytest

from queue_daemon.engine.admit.limits import Limits, LimitsError, TenantLimits, validate_overrides


def test_valid_overrides_keep_integers_integral() -> None:
    assert validate_overrides({"waiting": 10, "rate": 2, "burst": 1.5}) == {
        "waiting": 10,
        "rate": 2.0,
        "burst": 1.5,
    }
    assert validate_overrides({"waiting": 10.0}) == {"waiting": 10}
    assert validate_overrides({}) == {}


@pytest.mark.parametrize(
    "raw",
    [
        [],
        "waiting=1",
        {"colour": 1},
        {"waiting": -1},
        {"waiting": 1.5},
        {"waiting": True},
        {"waiting": "10"},
        {"burst": 0},
        {"payload": 0},
        {"rate": math.nan},
        {"rate": math.inf},
        {"waiting": 2**60},
    ],
)
def test_bad_overrides_are_refused(raw: object) -> None:
    with pytest.raises(LimitsError):
        validate_overrides(raw)


def test_overrides_apply_to_their_tenant_only_and_notify() -> None:
    defaults = TenantLimits(waiting=100, payload=1000)
    limits = Limits(defaults)
    seen: list[dict[str, TenantLimits]] = []
    limits.on_change(lambda changed: seen.append(changed.overridden()))
    assert seen == [{}]
    limits.update({"a": {"waiting": 5}, "b": {}})
    assert limits.of("a") == TenantLimits(waiting=5, payload=1000)
    assert limits.of("b") is defaults and limits.of("c") is defaults
    assert len(seen) == 2 and set(seen[-1]) == {"a"}
    limits.update({"a": {"waiting": 5}})  # unchanged: no notification
    assert len(seen) == 2
    limits.update({})
    assert limits.of("a") is defaults and len(seen) == 3
