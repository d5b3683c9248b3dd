"""TenantStore: tenants, tokens and their rotation, uid slots, limits, operator tokens."""

from __future__ import annotations

import pytest

from queue_daemon.store.errors import Conflict, NotFound
from tests.contract.conftest import Rig


async def test_a_tenant_is_added_once_and_may_come_back_after_a_revoke(rig: Rig) -> None:
    s = rig.store
    await s.add_tenant("acme", b"t1")
    with pytest.raises(Conflict):
        await s.add_tenant("acme", b"t2")
    with pytest.raises(Conflict):
        await s.add_tenant("other", b"t1")  # the hash is in use
    assert await s.tenant_tokens() == {b"t1": "acme"}
    (tenant,) = await s.list_tenants()
    assert (tenant.client, tenant.token_hash, tenant.live_tokens, tenant.revoked_at) == (
        "acme",
        b"t1",
        1,
        None,
    )
    await s.revoke_tenant("acme")
    with pytest.raises(NotFound):
        await s.revoke_tenant("acme")
    assert await s.tenant_tokens() == {}
    (tenant,) = await s.list_tenants()
    assert tenant.revoked_at is not None and tenant.live_tokens == 0
    await s.add_tenant("acme", b"t3")
    assert await s.tenant_tokens() == {b"t3": "acme"}


async def test_a_rotation_keeps_the_previous_token_for_its_grace(rig: Rig) -> None:
    s = rig.store
    with pytest.raises(NotFound):
        await s.rotate_tenant("acme", b"t2", 60)
    await s.add_tenant("acme", b"t1")
    await s.rotate_tenant("acme", b"t2", 60)
    assert await s.tenant_tokens() == {b"t1": "acme", b"t2": "acme"}
    (tenant,) = await s.list_tenants()
    assert tenant.token_hash == b"t2" and tenant.live_tokens == 2
    assert tenant.grace_until is not None
    await s.rotate_tenant("acme", b"t3", 0)  # t1 goes, t2 ends now
    assert await s.tenant_tokens() == {b"t3": "acme"}
    with pytest.raises(Conflict):
        await s.rotate_tenant("acme", b"t3", 0)


async def test_uid_slots_are_unique_and_kept(rig: Rig) -> None:
    s = rig.store
    await s.add_tenant("a", b"1")
    await s.add_tenant("b", b"2")
    slots = await s.tenant_uid_slots()
    assert set(slots) == {"a", "b"} and len(set(slots.values())) == 2
    assert await s.ensure_uid_slot("a") == slots["a"]
    c = await s.ensure_uid_slot("c")
    assert c not in slots.values() and await s.ensure_uid_slot("c") == c
    await s.revoke_tenant("a")
    await s.add_tenant("a", b"3")
    assert (await s.tenant_uid_slots())["a"] == slots["a"]


async def test_limits_are_replaced_whole_for_active_tenants(rig: Rig) -> None:
    s = rig.store
    with pytest.raises(NotFound):
        await s.get_tenant_limits("acme")
    with pytest.raises(NotFound):
        await s.set_tenant_limits("acme", {"x": 1.0})
    await s.add_tenant("acme", b"t1")
    await s.add_tenant("calm", b"t2")
    assert await s.get_tenant_limits("acme") == {}
    assert await s.set_tenant_limits("acme", {"max_jobs": 5.0, "rate": 2.5}) == {
        "max_jobs": 5.0,
        "rate": 2.5,
    }
    assert await s.set_tenant_limits("acme", {"rate": 1.0}) == {"rate": 1.0}
    assert await s.tenant_limits() == {"acme": {"rate": 1.0}}
    await s.revoke_tenant("acme")
    assert await s.tenant_limits() == {}


async def test_operator_tokens_rotate_and_are_revoked_together(rig: Rig) -> None:
    s = rig.store
    assert await s.admin_tokens() == set()
    await s.new_admin_token(b"o1", 60)
    await s.new_admin_token(b"o2", 60)
    assert await s.admin_tokens() == {b"o1", b"o2"}
    await s.new_admin_token(b"o3", 0)
    assert await s.admin_tokens() == {b"o3"}
    assert await s.revoke_admin_tokens() == 2  # o2 (its grace ended) and o3
    assert await s.admin_tokens() == set()
    assert await s.revoke_admin_tokens() == 0


async def test_the_token_key_is_a_stable_secret(rig: Rig) -> None:
    key = await rig.store.token_key()
    assert len(key) >= 16 and await rig.store.token_key() == key
