"""HandlerStore: versions of a type's handler, deletes, the tenant's limit."""

from __future__ import annotations

import pytest

from queue_daemon.store.errors import LimitReached, NotFound
from tests.contract.conftest import Rig


async def test_the_newest_version_is_the_handler(rig: Rig) -> None:
    s = rig.store
    with pytest.raises(NotFound):
        await s.get_handler("a-t")
    one = await s.put_handler("a-t", {"lang": "python", "body": "1", "nested": {"k": [1]}})
    assert one.type == "a-t" and one.data == {"lang": "python", "body": "1", "nested": {"k": [1]}}
    two = await s.put_handler("a-t", {"lang": "python", "body": "2"})
    assert two.id != one.id and two.id > one.id
    assert await s.get_handler("a-t") == two
    assert await s.count_handlers("a") == 1


async def test_a_deleted_handler_is_gone_until_put_again(rig: Rig) -> None:
    s = rig.store
    with pytest.raises(NotFound):
        await s.delete_handler("a-t")
    await s.put_handler("a-t", {"lang": "python", "body": "1"})
    await s.delete_handler("a-t")
    with pytest.raises(NotFound):
        await s.get_handler("a-t")
    with pytest.raises(NotFound):
        await s.delete_handler("a-t")
    assert await s.count_handlers("a") == 0
    again = await s.put_handler("a-t", {"lang": "python", "body": "3"})
    assert await s.get_handler("a-t") == again


async def test_the_handler_limit_counts_live_types_only(rig: Rig) -> None:
    s = rig.store
    await s.put_handler("a-one", {"lang": "python", "body": "1"}, max_handlers=2)
    await s.put_handler("a-two", {"lang": "python", "body": "1"}, max_handlers=2)
    await s.put_handler("b-one", {"lang": "python", "body": "1"}, max_handlers=2)
    await s.put_handler("a-two", {"lang": "python", "body": "2"}, max_handlers=2)  # a new version
    with pytest.raises(LimitReached):
        await s.put_handler("a-three", {"lang": "python", "body": "1"}, max_handlers=2)
    await s.delete_handler("a-one")
    await s.put_handler("a-three", {"lang": "python", "body": "1"}, max_handlers=2)
    assert await s.count_handlers("a") == 2 and await s.count_handlers("b") == 1
