"""The daemon's cache of current handler versions, and the runners' view of a stored handler."""

from __future__ import annotations

import time

from queue_daemon.domain.names import JobType
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.runners.models import HandlerSpec
from queue_daemon.store.errors import NotFound
from queue_daemon.store.ports import HandlerLookup

PULLED_LANG = "worker"  # a handler of this lang marks its type as pulled: workers claim it


def spec_of(record: HandlerRecord) -> HandlerSpec:
    client, name = JobType.parse(record.type)
    data = record.data
    return HandlerSpec(
        version=record.id,
        client=client,
        type=name,
        lang=str(data["lang"]),
        body=str(data.get("body", "")),
        before=str(data.get("before", "")),
        before_each=str(data.get("beforeEach", "")),
        after_each=str(data.get("afterEach", "")),
        eid=str(data.get("eid", "")),
        timeout=float(data.get("timeout", 30)),  # type: ignore[arg-type]
        then=str(data.get("then", "")),
        max_attempts=int(data.get("maxAttempts", 5)),  # type: ignore[call-overload]
        module=str(data.get("module", "")),
        memory=int(data.get("memory", 0)),  # type: ignore[call-overload]
    )


class HandlerCache:
    """Current handler version per stored jobtype.

    Entries are dropped when the store announces a change (LISTEN) and, as a
    safety net for a missed notification, after ``ttl`` seconds. A read that
    was in flight when its type was invalidated is returned but not kept: it
    may have read the version before the change.
    """

    def __init__(self, store: HandlerLookup, ttl: float = 30.0) -> None:
        self._store = store
        self._ttl = ttl
        self._entries: dict[str, tuple[float, HandlerSpec | None]] = {}
        self._changes = 0  # invalidations so far

    def invalidate(self, jobtype: str) -> None:
        self._entries.pop(jobtype, None)
        self._changes += 1

    def cached(self, jobtype: str) -> HandlerSpec | None:
        """The handler for ``jobtype`` if the cache holds it and it is fresh; None
        otherwise (none, or not known without a read)."""
        entry = self._entries.get(jobtype)
        if entry is not None and time.monotonic() - entry[0] < self._ttl:
            return entry[1]
        return None

    async def get(self, jobtype: str) -> HandlerSpec | None:
        """The handler for ``jobtype`` (client-type), None if it has none."""
        entry = self._entries.get(jobtype)
        now = time.monotonic()
        if entry is not None and now - entry[0] < self._ttl:
            return entry[1]
        changes = self._changes
        try:
            spec: HandlerSpec | None = spec_of(await self._store.get_handler(jobtype))
        except NotFound:
            spec = None
        if changes == self._changes:
            self._entries[jobtype] = (now, spec)
        return spec

    async def at_least(self, jobtype: str, version: str | None) -> HandlerSpec | None:
        """The handler for ``jobtype`` as of the store's version ``version`` or
        later (None: the type had none): the cached one if it is that version,
        else read again."""
        spec = await self.get(jobtype)
        if (spec.version if spec is not None else None) == version:
            return spec
        self.invalidate(jobtype)
        return await self.get(jobtype)
