"""Choosing, leasing and renewing this daemon's sysid, and opening its journal.

A sysid and a journal go together: ``journal-<sysid>`` is only ever written by
the daemon that holds the sysid. The journal's file lock proves, on this
machine, that no live daemon still uses it, so a restarted daemon adopts an
orphaned journal (and its sysid) and ingests what the dead one acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from queue_daemon.domain.names import valid_sysid
from queue_daemon.journal import Journal, JournalInUse
from queue_daemon.settings import Settings
from queue_daemon.store.errors import StoreError, SysidTaken
from queue_daemon.store.ports import SysidLeases

logger = logging.getLogger(__name__)

SYSID_FILE = "sysid"
PINNED_WAIT_S = 10.0  # how long a daemon given --sysid waits for its journal's lock


class SysidError(Exception):
    """No sysid could be taken; the message says why."""


@dataclass(slots=True)
class Identity:
    sysid: str
    holder: str
    journal: Journal
    # the lease's health, kept by keep_leased() for /readyz and the metrics
    renewed_at: float = field(default_factory=time.monotonic)  # last successful lease
    renew_failures: int = 0
    lost: bool = False  # another daemon took the sysid over


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def open_journal(path: Path, settings: Settings) -> Journal | None:
    """The journal at ``path``, or None if a live process holds it (its file lock)."""
    try:
        return await Journal.open(
            path, segment_bytes=settings.segment_bytes, inline=settings.inline_journal
        )
    except JournalInUse:
        return None


def _write_sysid(path: Path, sysid: str) -> None:
    (path / SYSID_FILE).write_text(sysid + "\n")


def _read_sysid(path: Path) -> str | None:
    try:
        text = (path / SYSID_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return text if valid_sysid(text) else None


async def acquire(store: SysidLeases, settings: Settings) -> Identity:
    """Take a sysid in the store and open its journal (see module docstring)."""
    holder = holder_name()
    host = socket.gethostname()
    data_dir = str(settings.data_dir.resolve())

    async def lease(sysid: str | None, takeover: bool) -> str:
        return await store.reserve_sysid(
            sysid,
            holder=holder,
            host=host,
            data_dir=data_dir,
            lease=settings.lease,
            takeover=takeover,
        )

    if settings.sysid is not None:
        path = settings.journal_dir(settings.sysid)
        journal = await open_journal(path, settings)
        deadline = time.monotonic() + PINNED_WAIT_S
        while journal is None and time.monotonic() < deadline:
            # another daemon may be ingesting it as an orphan (engine.ingest.adoption)
            await asyncio.sleep(0.5)
            journal = await open_journal(path, settings)
        if journal is None:
            raise SysidError(f"journal {path} is in use by another daemon")
        try:
            sysid = await lease(settings.sysid, True)
        except SysidTaken:
            await journal.close()
            raise SysidError(f"sysid {settings.sysid} is leased by another daemon") from None
        _write_sysid(path, sysid)
        return Identity(sysid, holder, journal)

    for path, known in candidates(settings):
        journal = await open_journal(path, settings)
        if journal is None:
            continue
        try:
            sysid = await lease(known, True)
        except SysidTaken:
            await journal.close()
            continue
        logger.info(
            "adopted journal %s as sysid %s", path, sysid, extra={"action": "sysid_adopted"}
        )
        return Identity(sysid, holder, journal)

    sysid = await lease(None, False)
    path = settings.journal_dir(sysid)
    journal = await open_journal(path, settings)
    if journal is None:
        raise SysidError(f"journal {path} is in use by another daemon")
    _write_sysid(path, sysid)
    return Identity(sysid, holder, journal)


def candidates(settings: Settings) -> list[tuple[Path, str]]:
    """Existing journals this daemon may resume, with their sysids."""
    if settings.journal is not None:
        known = _read_sysid(settings.journal)
        return [(settings.journal, known)] if known else []
    found = []
    if settings.data_dir.is_dir():
        for path in sorted(settings.data_dir.glob("journal-*")):
            known = _read_sysid(path)
            if known is not None and path.name == f"journal-{known}":
                found.append((path, known))
    return found


async def keep_leased(store: SysidLeases, identity: Identity, lease: float) -> None:
    """Renew the sysid lease at a third of its length, forever."""
    while True:
        await asyncio.sleep(lease / 3)
        try:
            await store.renew_sysid(identity.sysid, holder=identity.holder, lease=lease)
            identity.renewed_at = time.monotonic()
            identity.lost = False
        except SysidTaken:
            identity.renew_failures += 1
            identity.lost = True
            logger.error(
                "sysid %s was taken over by another daemon",
                identity.sysid,
                extra={"action": "sysid_lost"},
            )
        except StoreError as exc:
            identity.renew_failures += 1
            logger.warning(
                "sysid lease not renewed: %s", exc, extra={"action": "sysid_renew_failed"}
            )
