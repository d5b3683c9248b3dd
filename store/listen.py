"""LISTEN for the store's notifications on a dedicated connection that reconnects.

One connection of its own (a pooled one would be handed to other callers and
lose its LISTENs), checked by a trivial query every ``KEEPALIVE`` seconds so a
connection that died silently is noticed. Whenever a connection is (re)made,
``on_jobs(None)`` is called once: jobs may have arrived while nobody listened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import asyncpg

from queue_daemon.store import queries
from queue_daemon.store.dsn import connect
from queue_daemon.store.notes import parse_payload
from queue_daemon.store.translate import is_unavailable

logger = logging.getLogger(__name__)

KEEPALIVE = 10.0  # seconds between checks that the connection still answers
_CLOSE_TIMEOUT = 2.0

# what a lost or refused connection raises; anything else is a bug and propagates
_CONNECTION_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


async def _first_of(events: tuple[asyncio.Event, ...], seconds: float) -> None:
    """Return when any of ``events`` is set or after ``seconds``."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _guarded(name: str, call: Callable[[], None]) -> None:
    # a callback that raises must not end the listening
    try:
        call()
    except Exception:
        logger.exception("listen callback %s failed", name, extra={"action": "listen_callback"})


async def _serve(
    conn: asyncpg.Connection,
    closed: asyncio.Event,
    on_jobs: Callable[[dict[str, int] | None], None],
    on_handler: Callable[[str], None],
    *,
    connect_timeout: float,
    on_done: Callable[[set[str] | None], None] | None,
    on_cancel: Callable[[str, str], None] | None,
) -> None:
    """Listen on ``conn`` until ``closed`` is set; raise when the connection is lost."""
    lost = asyncio.Event()

    def on_lost(_conn: Any, /) -> None:
        lost.set()

    def jobs_note(_conn: Any, _pid: int, _channel: str, payload: object, /) -> None:
        _guarded("on_jobs", lambda: on_jobs(parse_payload(str(payload))))

    def handler_note(_conn: Any, _pid: int, _channel: str, payload: object, /) -> None:
        _guarded("on_handler", lambda: on_handler(str(payload)))

    def done_note(_conn: Any, _pid: int, _channel: str, payload: object, /) -> None:
        if on_done is not None:
            types = set(str(payload).split())
            _guarded("on_done", lambda: on_done(types or None))

    def cancel_note(_conn: Any, _pid: int, _channel: str, payload: object, /) -> None:
        sysid, _, job_id = str(payload).partition(" ")
        if on_cancel is not None and job_id:
            _guarded("on_cancel", lambda: on_cancel(sysid, job_id))

    conn.add_termination_listener(on_lost)
    await conn.add_listener(queries.queue.JOBS_CHANNEL, jobs_note)
    await conn.add_listener(queries.queue.HANDLERS_CHANNEL, handler_note)
    if on_done is not None:
        await conn.add_listener(queries.pulled.DONE_CHANNEL, done_note)
    if on_cancel is not None:
        await conn.add_listener(queries.jobs.CANCEL_CHANNEL, cancel_note)
    logger.info("listening for notifications", extra={"action": "listen_connected"})
    _guarded("on_jobs", lambda: on_jobs(None))
    if on_done is not None:
        _guarded("on_done", lambda: on_done(None))
    while not closed.is_set():
        if lost.is_set():
            raise asyncpg.InterfaceError("the listening connection was closed")
        await _first_of((closed, lost), KEEPALIVE)
        if not closed.is_set() and not lost.is_set():
            await conn.fetchval(queries.migrations.PING, timeout=connect_timeout)


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), _CLOSE_TIMEOUT)
    except BaseException:
        conn.terminate()
        raise


class Delays(Protocol):
    """The caller's backoff (``queue_daemon.engine.backoff.Backoff``): how long to wait
    before the next reconnect, and a fresh start once connected."""

    def next(self) -> float: ...

    def reset(self) -> None: ...


async def listen_forever(
    dsn: str,
    closed: asyncio.Event,
    on_jobs: Callable[[dict[str, int] | None], None],
    on_handler: Callable[[str], None],
    *,
    connect_timeout: float,
    retry: Delays,
    on_done: Callable[[set[str] | None], None] | None = None,
    on_cancel: Callable[[str, str], None] | None = None,
) -> None:
    """Deliver notifications until ``closed`` is set or the task is cancelled.

    A lost or refused connection is logged and remade after a delay that grows
    while reconnecting fails; no connection error leaves this function.
    """
    while not closed.is_set():
        try:
            conn = await connect(
                dsn,
                timeout=connect_timeout,
                server_settings={"application_name": "queue_daemon_listen"},
            )
        except _CONNECTION_ERRORS as exc:
            delay = retry.next()
            _log_failure("connect", exc, delay)
        else:
            retry.reset()
            delay = retry.next()  # after the connection is lost
            try:
                await _serve(
                    conn,
                    closed,
                    on_jobs,
                    on_handler,
                    connect_timeout=connect_timeout,
                    on_done=on_done,
                    on_cancel=on_cancel,
                )
            except _CONNECTION_ERRORS as exc:
                _log_failure("listen", exc, delay)
            finally:
                with suppress(*_CONNECTION_ERRORS):
                    await _close(conn)
        if closed.is_set():
            return
        with suppress(TimeoutError):  # not wait_for, which can swallow a cancellation on 3.11
            async with asyncio.timeout(delay):
                await closed.wait()


def _log_failure(step: str, exc: BaseException, delay: float) -> None:
    # a server that is down is expected; anything else (bad credentials, no
    # such database) is retried too, as the operator may fix it, but logged as an error
    level = logging.WARNING if is_unavailable(exc) else logging.ERROR
    logger.log(
        level,
        "listening: %s failed: %s: %s; retrying in %.1f s",
        step,
        type(exc).__name__,
        exc,
        delay,
        extra={"action": "listen_lost", "step": step, "retry_in": delay},
    )
