"""BlobStore: content-addressed bytes per tenant, the bytes limit, deletes."""

from __future__ import annotations

import pytest

from queue_daemon.store.errors import Conflict, LimitReached, NotFound
from tests.contract.conftest import Rig

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


async def test_a_blob_is_its_tenants_alone_and_put_once(rig: Rig) -> None:
    s = rig.store
    assert await s.read_blob("a", A) is None
    assert await s.put_blob("a", A, b"\x00bytes\xff") is True
    assert await s.put_blob("a", A, b"\x00bytes\xff") is False
    assert await s.read_blob("a", A) == b"\x00bytes\xff"
    assert await s.read_blob("b", A) is None
    with pytest.raises(NotFound):
        await s.delete_blob("b", A)
    await s.delete_blob("a", A)
    assert await s.read_blob("a", A) is None
    with pytest.raises(NotFound):
        await s.delete_blob("a", A)


async def test_the_bytes_limit_counts_a_tenants_blobs(rig: Rig) -> None:
    s = rig.store
    await s.put_blob("a", A, b"x" * 60, max_bytes=100)
    with pytest.raises(LimitReached):
        await s.put_blob("a", B, b"y" * 41, max_bytes=100)
    assert await s.put_blob("a", A, b"x" * 60, max_bytes=60) is False  # held already
    assert await s.put_blob("b", B, b"y" * 41, max_bytes=100) is True  # another tenant's
    await s.delete_blob("a", A)
    assert await s.put_blob("a", B, b"y" * 41, max_bytes=100) is True


async def test_a_handler_names_only_a_blob_its_tenant_holds(rig: Rig) -> None:
    s = rig.store
    with pytest.raises(NotFound):
        await s.put_handler("a-t", {"lang": "wasm", "body": "", "module": A})
    await s.put_blob("b", A, b"(module)")
    with pytest.raises(NotFound):  # another tenant's
        await s.put_handler("a-t", {"lang": "wasm", "body": "", "module": A}, max_handlers=5)
    await s.put_blob("a", A, b"(module)")
    stored = await s.put_handler("a-t", {"lang": "wasm", "body": "", "module": A})
    assert stored.data["module"] == A


async def test_a_blob_the_current_handler_runs_is_not_deleted(rig: Rig) -> None:
    s = rig.store
    await s.put_blob("a", A, b"(module)")
    await s.put_handler("a-t", {"lang": "wasm", "body": "", "module": A})
    with pytest.raises(Conflict):
        await s.delete_blob("a", A)
    await s.put_handler("a-t", {"lang": "wasm", "body": "(module)"})  # a newer version
    await s.delete_blob("a", A)
    await s.put_blob("a", A, b"(module)")
    await s.put_handler("a-u", {"lang": "wasm", "body": "", "module": A})
    await s.delete_handler("a-u")
    await s.delete_blob("a", A)
