"""Who on the host already has a uid a tenant would run under."""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_daemon.runners.sandbox.users import host_owner


def test_users_and_groups_own_their_ids() -> None:
    assert host_owner(0) == "the user 'root'"
    assert host_owner(65534) is not None  # nobody, or nogroup


def test_a_subordinate_id_range_owns_its_ids() -> None:
    table = Path("/etc/subuid")
    ranges = [line.split(":") for line in table.read_text().splitlines()] if table.exists() else []
    ranges = [r for r in ranges if len(r) == 3 and r[1].isdigit() and r[2].isdigit()]
    if not ranges:
        pytest.skip("no subordinate uid ranges on this host")
    name, first, count = ranges[0]
    inside = int(first) + int(count) - 1
    owner = host_owner(inside)
    assert owner is not None and (name in owner or "user" in owner or "group" in owner)
