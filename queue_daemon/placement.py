"""How the daemon places itself on its host before it serves: its own CPU place
(taken before the embedded PostgreSQL starts, so the server's processes start there
too and share the daemon's weight), its open-files limit, and the
permissions of its files, and, as root, the sweep of the directories it keeps
below ``/var/lib/queue-daemon`` for data directories deleted since.

The app owns these decisions; the cgroup and scheduling-class mechanics are the
sandbox's (``queue_daemon.runners.sandbox.cpuplace``). Real-time priority while a tenant is busy
is opt-in (``serve --realtime``, passed to the runners).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import threading
from pathlib import Path

from queue_daemon.runners.sandbox.cpuplace import DaemonPlace
from queue_daemon.store.embedded import SERVER_HOME, host_home, open_to_others
from queue_daemon.store.homes import sweep_homes

logger = logging.getLogger(__name__)


class CpuPlacement:
    """The daemon's CPU place for the life of a daemon: nothing where there is none
    (not root, no v1 cpu controller)."""

    def __init__(self) -> None:
        self._place: DaemonPlace | None = None

    async def take(self) -> None:
        """Move the daemon into its place now, before it starts any process."""
        self._place = await asyncio.to_thread(DaemonPlace.take)

    def serve(self, pgdata: Path) -> None:
        """The PostgreSQL server in ``pgdata`` was started in the daemon's place."""
        if self._place is not None:
            self._place.serve(pgdata)

    async def release(self) -> None:
        """Back where the daemon came from, once nothing else uses its place."""
        place, self._place = self._place, None
        if place is not None:
            await asyncio.to_thread(place.release)


def protect_daemon_files(data_dir: Path, journal: Path, queuelog: Path, *, made: bool) -> None:
    """Keep the daemon's files from handler processes (other uids); blocking.

    The journal and the queue log create their files private already; this
    also closes those left by earlier versions. Journal directories
    (``data_dir/journal-*`` and ``journal``) become 0700 and their files 0600,
    queue logs 0600. ``data_dir`` itself becomes 0711 when the daemon ``made``
    it (other users may pass through it to the runner work root, ``run``, but
    not list it); one the operator made only loses its read and write bits for
    group and others: no directory the daemon did not make is ever widened.
    """
    journals = {journal, *data_dir.glob("journal-*")}
    for path in journals:
        if not path.is_dir():
            continue
        os.chmod(path, 0o700)
        for entry in path.rglob("*"):
            os.chmod(entry, 0o700 if entry.is_dir() else 0o600)
    for log in {queuelog, *data_dir.glob("queue-*.log*")}:
        if log.is_file():
            os.chmod(log, 0o600)
    if made:
        os.chmod(data_dir, 0o711)
    else:
        os.chmod(data_dir, data_dir.stat().st_mode & 0o7711)


def runner_work_root(data_dir: Path) -> Path:
    """Where handler processes get their private directories: ``data_dir/run``,
    unless the daemon is root and ``data_dir``'s path does not let other users
    (the tenants' uids) through; then a directory of the daemon's own below
    ``/var/lib/queue-daemon`` (``queue_daemon.store.embedded.host_home``), since no directory
    the daemon did not make is widened for them."""
    if os.geteuid() != 0 or open_to_others(data_dir.resolve()):
        return (data_dir / "run").resolve()
    return host_home(data_dir) / "run"


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; return it.

    Every client connection holds a descriptor: at the usual soft limit of
    1024, a thousand idle or slow connections would leave none for the
    journal, the store pool and the handler contexts.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or resource.RLIM_INFINITY in (soft, hard):
        return soft  # an unlimited hard limit is not a number the kernel takes back
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.warning(
            "open files limit stays at %d: %s", soft, exc, extra={"action": "nofile_limit"}
        )
        return soft
    return hard


def sweep_homes_in_background() -> threading.Thread | None:
    """As root, remove the directories below ``SERVER_HOME`` of data directories
    that are gone (``queue_daemon.store.homes``), in a thread of its own: a
    daemon's start does not wait for it, and a failure is logged, never raised."""
    if os.geteuid() != 0:
        return None
    thread = threading.Thread(target=_sweep_logged, name="sweep-homes", daemon=True)
    thread.start()
    return thread


def _sweep_logged() -> None:
    try:
        outcomes = sweep_homes()
    except Exception:
        logger.warning(
            "sweeping %s failed", SERVER_HOME, exc_info=True, extra={"action": "home_sweep"}
        )
        return
    removed = sum(o.removed for o in outcomes)
    logger.log(
        logging.INFO if outcomes else logging.DEBUG,
        "swept %s: %d directories of deleted data directories removed, %d kept",
        SERVER_HOME,
        removed,
        len(outcomes) - removed,
        extra={"action": "home_sweep"},
    )
