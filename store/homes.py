"""The daemon's own directories below ``/var/lib/queue-daemon`` (as root), one per
data directory (``queue_daemon.store.embedded.host_home``): the embedded server's
data (``pg``) and the handlers' directories (``run``). Nothing in the data
directory points back at them but the link ``DATA_DIR/pg``, so deleting a data
directory left them behind; the sweep here removes them.

Each home holds a file ``data_dir``: the data directory's path and the device
of the directory above it. A home is removed only when that proves its data
directory gone and nothing uses the home:

- the path is absent, and the nearest directory above it that exists is on the
  recorded device (an unmounted file system is not a deleted data directory);
- no directory beside the old path holds a ``pg`` link to the home's server
  (a data directory renamed in place: its home is re-marked and kept);
- no process has its working directory, root or an open file in the home or
  below the old path (a daemon still running on a deleted data directory
  holds its ``pg.users`` lock), and the home's PostgreSQL has no client
  connections. Its postmaster is then stopped with ``pg_ctl stop``, and the
  home is renamed away and removed.

A home without that file (made by an earlier version, never started since) is
never removed unless asked for (``unmarked_older_than``), and then only when no
process uses it, no PostgreSQL runs in it and nothing in it changed for that
long. The names of other entries (``pginstall-*``, the lock) are not homes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

OWNER_FILE = "data_dir"  # in a home: the data directory it serves
LOCK_FILE = ".homes.lock"  # in the root: held while a home is made, marked or swept
SWEPT = ".swept-"  # a home being removed (renamed away first)
HOME_NAME = re.compile(r"[0-9a-f]{16}")
SIBLINGS_LOOKED_AT = 10_000  # entries beside a gone data directory checked for a move


def home_name(owner: Path) -> str:
    """The name of the home of the data directory ``owner`` (an absolute path)."""
    return hashlib.sha256(str(owner).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Marker:
    """What a home's ``OWNER_FILE`` says."""

    owner: Path
    parent_dev: int | None  # None: written by an earlier version


def read_marker(home: Path) -> Marker | None:
    try:
        lines = (home / OWNER_FILE).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if not lines or not lines[0].startswith("/"):
        return None
    dev = None
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        if key == "parent_dev" and value.strip().isdigit():
            dev = int(value)
    return Marker(Path(lines[0]), dev)


def write_marker(home: Path, owner: Path) -> None:
    """Name ``owner`` (an existing directory's absolute path) as ``home``'s data
    directory, unless it already is; call under ``homes_lock``."""
    text = f"{owner}\nparent_dev {os.stat(owner.parent).st_dev}\n"
    path = home / OWNER_FILE
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text() == text:
            return
    tmp = home / f".{OWNER_FILE}.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def homes_lock(root: Path) -> Iterator[None]:
    """Making or marking a home and sweeping one exclude each other (briefly)."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass
class Outcome:
    """What the sweep did with one home whose data directory is not known to exist."""

    home: Path
    owner: Path | None
    removed: bool
    reason: str


@dataclass
class _Proc:
    pid: int
    ppid: int
    comm: str
    cwd: str | None
    paths: list[str] = field(default_factory=list)  # cwd, root and open files


def _link(path: str) -> str | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return target.removesuffix(" (deleted)")


def _read_proc(pid: int, files: bool) -> _Proc | None:
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.find("(") + 1 : stat.rfind(")")]
    ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
    proc = _Proc(pid, ppid, comm, _link(f"{base}/cwd"))
    if files:
        paths = [proc.cwd, _link(f"{base}/root")]
        with contextlib.suppress(OSError):
            paths += [_link(f"{base}/fd/{fd}") for fd in os.listdir(f"{base}/fd")]
        proc.paths = [p for p in paths if p and p.startswith("/") and p != "/"]
    return proc


def _processes() -> dict[int, _Proc]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (proc := _read_proc(int(name), files=True)) is not None:
            found[proc.pid] = proc
    return found


def _below(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _postmaster(pgdata: Path) -> int | None:
    """The pid of the live postmaster of the server in ``pgdata``, if any: the pid
    of its ``postmaster.pid``, a postgres process working in ``pgdata`` (a pid of
    an unrelated process is a stale file)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    proc = _read_proc(pid, files=False)
    if proc is None or proc.comm not in ("postgres", "postmaster"):
        return None
    if proc.cwd is not None and proc.cwd != os.path.realpath(pgdata):
        return None
    return pid


def _servers(home: Path) -> dict[Path, int]:
    """The home's servers that run (``pg``, and ``pg.left-*`` set aside), by data."""
    found = {}
    with contextlib.suppress(OSError):
        for entry in home.iterdir():
            if entry.name.startswith("pg") and not entry.is_symlink() and entry.is_dir():
                pid = _postmaster(entry)
                if pid is not None:
                    found[entry] = pid
    return found


def _in_use(home: Path, owner: Path | None, procs: dict[int, _Proc], servers: set[int]) -> str:
    """Why the home is in use (empty: it is not). The processes of its own servers
    do not count, unless a server has client connections."""
    cluster = {p.pid for p in procs.values() if p.pid in servers or p.ppid in servers}
    for pid in cluster - servers:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"[local]" in f.read():  # a client backend (the server takes no TCP)
                return f"its PostgreSQL (pid {procs[pid].ppid}) has client connections"
    tops = [os.path.realpath(home)] + ([str(owner)] if owner is not None else [])
    users = sorted(
        p.pid
        for p in procs.values()
        if p.pid not in cluster and any(_below(path, top) for path in p.paths for top in tops)
    )
    return f"in use by pid {', '.join(map(str, users[:5]))}" if users else ""


def _gone(marker: Marker) -> bool:
    """Whether the marker proves its data directory deleted (see the module's doc)."""
    try:
        os.lstat(marker.owner)
        return False
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError:
        return False  # unreadable is not gone
    if marker.parent_dev is None:
        return True
    for up in marker.owner.parents:
        try:
            return os.stat(up).st_dev == marker.parent_dev
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return False
    return False


def _moved_to(home: Path, owner: Path) -> Path | None:
    """A directory beside ``owner``'s old path whose ``pg`` links to the home's server."""
    if not (home / "pg").is_dir():
        return None
    target = str(home / "pg")
    try:
        with os.scandir(owner.parent) as entries:
            for entry in itertools.islice(entries, SIBLINGS_LOOKED_AT):
                if _link(os.path.join(entry.path, "pg")) == target:
                    return Path(entry.path)
    except OSError:
        return None
    return None


def _newest_change(home: Path) -> float:
    newest = 0.0
    for top, dirs, files in os.walk(home):
        for name in (top, *(os.path.join(top, n) for n in dirs + files)):
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(name).st_mtime)
    return newest


def _default_root() -> Path:
    from queue_daemon.store import embedded

    return embedded.SERVER_HOME


def _default_stop(pgdata: Path) -> None:
    from queue_daemon.store.embedded import stop_server

    stop_server(pgdata)


def sweep_homes(
    root: Path | None = None,
    *,
    unmarked_older_than: float | None = None,
    also_gone: Callable[[Path], bool] | None = None,
    dry_run: bool = False,
    stop: Callable[[Path], None] | None = None,
) -> list[Outcome]:
    """Remove the homes below ``root`` (default ``SERVER_HOME``) whose data
    directory is gone and that nothing uses, stopping their servers first.

    ``unmarked_older_than``: seconds; homes without a marker that nothing uses
    and nothing changed in for that long are removed too (default: never).
    ``also_gone``: data directories to treat as gone although they exist (the
    test suite's, which pytest keeps a while). ``dry_run``: remove and stop
    nothing. Returns an outcome for every home not kept for its data directory.
    """
    root = _default_root() if root is None else root
    stop = _default_stop if stop is None else stop
    if not root.is_dir():
        return []
    outcomes: list[Outcome] = []
    candidates: list[tuple[Path, Marker | None]] = []
    for home in sorted(root.iterdir()):
        if home.name.startswith(SWEPT) and not dry_run:
            shutil.rmtree(home, ignore_errors=True)  # a removal cut short
            continue
        if not HOME_NAME.fullmatch(home.name) or home.is_symlink() or not home.is_dir():
            continue
        marker = read_marker(home)
        if marker is None:
            if unmarked_older_than is None:
                outcomes.append(Outcome(home, None, False, "no data_dir file names its owner"))
            elif _newest_change(home) > time.time() - unmarked_older_than:
                outcomes.append(Outcome(home, None, False, "unmarked, changed recently"))
            else:
                candidates.append((home, None))
        elif also_gone is not None and also_gone(marker.owner):
            candidates.append((home, marker))
        elif _gone(marker):
            moved = _moved_to(home, marker.owner)
            if moved is None:
                candidates.append((home, marker))
                continue
            if not dry_run:
                with homes_lock(root):
                    write_marker(home, moved)
            outcomes.append(Outcome(home, marker.owner, False, f"its data moved to {moved}"))
    if candidates:
        procs = _processes()
        for home, marker in candidates:
            outcomes.append(_retire(root, home, marker, procs, also_gone, dry_run, stop))
    return outcomes


def _retire(
    root: Path,
    home: Path,
    marker: Marker | None,
    procs: dict[int, _Proc],
    also_gone: Callable[[Path], bool] | None,
    dry_run: bool,
    stop: Callable[[Path], None],
) -> Outcome:
    owner = marker.owner if marker is not None else None

    def kept(reason: str) -> Outcome:
        logger.info("kept %s: %s", home, reason, extra={"action": "home_kept"})
        return Outcome(home, owner, False, reason)

    servers = _servers(home)
    if servers and marker is None:
        return kept(f"unmarked, its PostgreSQL runs (pid {min(servers.values())})")
    busy = _in_use(home, owner, procs, set(servers.values()))
    if busy:
        return kept(busy)
    if dry_run:
        return Outcome(home, owner, False, "would be removed")

    def still_gone() -> bool:
        if marker is None:
            return not _servers(home)
        return (also_gone is not None and also_gone(marker.owner)) or _gone(marker)

    for pgdata, pid in servers.items():
        if not still_gone():
            return kept("its data directory is back")
        stop(pgdata)
        if _postmaster(pgdata) == pid:
            return kept(f"its PostgreSQL (pid {pid}) did not stop")
    with homes_lock(root):
        if not still_gone():
            return kept("its data directory is back")
        trash = root / f"{SWEPT}{home.name}-{os.getpid()}-{threading.get_ident()}"
        home.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
    why = f"{owner} is gone" if owner is not None else "unmarked and unused"
    logger.info("removed %s: %s", home, why, extra={"action": "home_swept"})
    return Outcome(home, owner, True, why)
