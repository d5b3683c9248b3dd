"""SysidLeases: unique leased sysids, renewals, takeovers and releases."""

from __future__ import annotations

import pytest

from queue_daemon.store.errors import SysidTaken
from tests.contract.conftest import Rig


async def test_new_sysids_are_distinct(rig: Rig) -> None:
    s = rig.store
    got = {
        await s.reserve_sysid(None, holder=f"h{n}", host="x", data_dir="/d", lease=60)
        for n in range(5)
    }
    assert len(got) == 5


async def test_a_live_lease_is_refused_to_others_until_it_lapses(rig: Rig) -> None:
    s = rig.store
    assert await s.reserve_sysid("7", holder="h1", host="x", data_dir="/d", lease=60) == "7"
    assert await s.reserve_sysid("7", holder="h1", host="x", data_dir="/d", lease=60) == "7"
    with pytest.raises(SysidTaken):
        await s.reserve_sysid("7", holder="h2", host="y", data_dir="/d", lease=60)
    with pytest.raises(SysidTaken):  # a takeover needs the same host and data dir
        await s.reserve_sysid("7", holder="h2", host="y", data_dir="/d", lease=60, takeover=True)
    assert (
        await s.reserve_sysid("7", holder="h2", host="x", data_dir="/d", lease=60, takeover=True)
        == "7"
    )
    with pytest.raises(SysidTaken):
        await s.renew_sysid("7", holder="h1", lease=60)
    await s.renew_sysid("7", holder="h2", lease=60)
    await rig.lapse_sysid("7")
    assert await s.reserve_sysid("7", holder="h3", host="z", data_dir="/e", lease=60) == "7"


async def test_a_released_sysid_is_free_and_cannot_be_renewed(rig: Rig) -> None:
    s = rig.store
    await s.reserve_sysid("3", holder="h1", host="x", data_dir="/d", lease=60)
    await s.release_sysid("3", holder="someone-else")  # not theirs: nothing happens
    with pytest.raises(SysidTaken):
        await s.reserve_sysid("3", holder="h2", host="y", data_dir="/d", lease=60)
    await s.release_sysid("3", holder="h1")
    await s.release_sysid("3", holder="h1")  # twice: nothing more
    with pytest.raises(SysidTaken):
        await s.renew_sysid("3", holder="h1", lease=60)
    with pytest.raises(SysidTaken):
        await s.renew_sysid("unknown", holder="h1", lease=60)
    assert await s.reserve_sysid("3", holder="h2", host="y", data_dir="/d", lease=60) == "3"
