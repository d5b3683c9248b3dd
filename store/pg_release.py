"""Releases written to the store: the end of runs with their outcomes, for the
run loop's batches (``JobQueue.release``) and the pull workers' completes
(``PulledJobs.complete_pulled``) alike, through the statements of
``queries.release``."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import asyncpg

from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.store import queries
from queue_daemon.store.errors import StoreError

if TYPE_CHECKING:
    from queue_daemon.store.pg_base import Connection

RELEASE_TEXT = 64 << 20  # characters of results sent in one release statement


async def write_releases(
    conn: Connection,
    releases: Sequence[Release],
    locks: str | Mapping[str, str],
    *,
    keep_first: bool,
    pulled: tuple[str, str] | None = None,
) -> list[asyncpg.Record]:
    """The rows of the release statements of ``releases`` (sorted by id), each
    applied only where its job holds its lock (``locks``: one for all, or each
    job's by its id). A statement per RELEASE_TEXT characters of results (a batch
    of 1,000 results of 1 MiB would pass PostgreSQL's 1 GB message), in one
    transaction when there are several (begun only then: two more round trips).
    ``keep_first``: the statements that keep the first row of an id done already
    (queries.release); without it, such an id is a unique violation. ``pulled``:
    (client, worker) of a pull worker's complete whose releases all archive
    (queries.release.ARCHIVE_PULLED: scoped to the client, counted for the
    worker; keeps the first row)."""
    q = queries.release
    archive_ok, archive, release = (
        (q.ARCHIVE_OK_KEEP_FIRST, q.ARCHIVE_KEEP_FIRST, q.RELEASE_KEEP_FIRST)
        if keep_first
        else (q.ARCHIVE_OK, q.ARCHIVE, q.RELEASE)
    )
    rows: list[asyncpg.Record] = []
    chunks = _by_result_size(sorted(releases, key=lambda r: r.id))
    together = conn.transaction() if len(chunks) > 1 else contextlib.nullcontext()
    async with together:
        for chunk in chunks:
            held = locks if isinstance(locks, str) else [locks[r.id] for r in chunk]
            if pulled is not None:
                rows += await conn.fetch(q.ARCHIVE_PULLED, *release_params(chunk, held), *pulled)
            elif isinstance(held, str) and " " not in held and all(map(_plain_ok, chunk)):
                rows += await conn.fetch(archive_ok, _joined_ids(chunk), held)
            else:
                every = all(r.how is _ARCHIVE for r in chunk)
                rows += await conn.fetch(
                    archive if every else release, *release_params(chunk, held)
                )
    return rows


_ARCHIVE = ReleaseHow.ARCHIVE  # a module constant: an enum member's lookup costs a job


def _plain_ok(r: Release) -> bool:
    """A release of ``queries.release.ARCHIVE_OK``: done, ok with exit code 200,
    no result, no log, counted."""
    return (
        r.how is _ARCHIVE
        and r.exitcode == 200
        and r.result is None
        and r.code == "ok"
        and not r.refund_attempt
        and r.log is None
    )


def _by_result_size(releases: list[Release]) -> list[list[Release]]:
    """``releases`` in chunks of at most RELEASE_TEXT characters of results (a
    release whose result alone is bigger is a chunk of its own)."""
    chunks: list[list[Release]] = [[]]
    size = 0
    for r in releases:
        n = len(r.result) if r.result else 0
        if size + n > RELEASE_TEXT and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(r)
        size += n
    return chunks


def storable(text: str) -> str:
    """``text`` as PostgreSQL's text takes it: a NUL (which a handler may print or
    return, and which text refuses) as U+FFFD, and so is a lone surrogate. The
    release of a run must not fail for what its handler wrote: its batch would
    be retried forever."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _joined_ids(releases: Sequence[Release]) -> str:
    """The ids of ``releases`` in one text, joined by spaces. StoreError if an id
    holds a space (the text is split on spaces; no id the daemon makes holds one)."""
    ids = " ".join([r.id for r in releases])
    if ids.count(" ") != len(releases) - 1:
        raise StoreError("a job id holds a space: it cannot be released")
    return ids


def release_params(releases: Sequence[Release], locks: str | Sequence[str]) -> tuple[object, ...]:
    """The parameters of ``queries.release.RELEASE`` for ``releases`` (in this
    order), each under its lock (``locks``: one for all, or one per release).
    StoreError if an id or a lock holds a space (as ``_joined_ids``; nor does a
    sysid or a pull worker's lock)."""
    ids = _joined_ids(releases)
    held = " ".join([locks] * len(releases)) if isinstance(locks, str) else " ".join(locks)
    if held.count(" ") != len(releases) - 1:
        raise StoreError("a lock holds a space: it cannot be released")
    return (
        ids,
        " ".join([r.how for r in releases]),  # StrEnum: joined as their text
        " ".join([r.code or "" for r in releases]),
        " ".join(["" if r.exitcode is None else str(r.exitcode) for r in releases]),
        [None if r.result is None else storable(r.result) for r in releases],
        " ".join([repr(float(r.delay)) if r.delay else "0" for r in releases]),
        " ".join(["t" if r.refund_attempt else "f" for r in releases]),
        held,
        [None if r.log is None else storable(r.log) for r in releases],
    )
