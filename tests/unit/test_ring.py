"""The recent lines of a child's output, and the tenant's output budget."""

from __future__ import annotations

from queue_daemon.runners.budget import OutputBudget
from queue_daemon.runners.ring import MAX_LINE, LineRing


def test_lines_across_reads_are_joined_and_only_the_last_are_kept() -> None:
    ring = LineRing(3)
    ring.feed(b"one\ntw")
    ring.feed(b"o\nthr")
    assert ring.lines() == ["one", "two"]
    ring.feed(b"ee\nfour\nfive\nsi")
    assert ring.lines() == ["three", "four", "five"]
    ring.close()
    assert ring.lines() == ["four", "five", "si"]
    assert ring.total == 6


def test_a_flood_of_lines_is_counted_without_a_step_per_line() -> None:
    ring = LineRing(2)
    ring.feed(b"partial")
    ring.feed(b"\n" * 1_000_000 + b"last\nrest")
    assert ring.lines() == ["", "last"]
    assert ring.total == 1_000_001
    ring.feed(b"x" * (10 * MAX_LINE))  # a line without end is kept only as shown
    ring.close()
    assert ring.lines()[-1] == "rest" + "x" * (MAX_LINE - 4)


def test_the_output_budget_waits_once_a_tenants_bytes_are_spent() -> None:
    now = [0.0]
    budget = OutputBudget(rate=100, burst=200, clock=lambda: now[0])
    assert budget.wait_for("a", 150) == 0.0
    assert budget.wait_for("a", 100) == 0.5  # 50 bytes over, at 100 bytes a second
    assert budget.wait_for("b", 200) == 0.0  # another tenant's budget is its own
    now[0] = 2.0
    assert budget.wait_for("a", 100) == 0.0  # refilled (to the burst at most)
    assert OutputBudget(rate=0, burst=1).wait_for("a", 10**9) == 0.0
