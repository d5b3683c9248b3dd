"""An external PostgreSQL on TCP, TLS only, passwords checked with scram-sha-256.

Debian's ``postgresql`` package (its binaries under ``/usr/lib/postgresql/<ver>/bin``)
run as the package's ``postgres`` user; a CA and a server certificate for a host
name are made with ``openssl``. Connections over TCP must use TLS
(``hostssl`` only) and a password; the test itself talks to the server as its
superuser over the Unix socket in the server's directory.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import asyncpg

from harness.pgpair import debian_bindir as pg_bindir

PG_USER = "postgres"


def missing() -> str | None:
    """Why the server cannot be made here, or None."""
    for tool in ("openssl", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if pg_bindir() is None:
        return "Debian's postgresql is not installed (apt-get install postgresql)"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"there is no {PG_USER!r} user (made by Debian's postgresql package)"
    return None


def _run(argv: list[str], *, user: str | None = None, cwd: Path | None = None) -> str:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def make_certificates(directory: Path, server_name: str) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signs for ``server_name``: (ca.crt, server.crt,
    server.key). P-256 keys: quick to make."""
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    argv = ["openssl", "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca_crt)]
    argv += ["-days", "2", "-subj", "/CN=queue-daemon test CA"]
    argv += ["-addext", "basicConstraints=critical,CA:TRUE"]
    _run([*argv, "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    argv = ["openssl", "req", *ec, "-keyout", str(key), "-out", str(csr)]
    _run([*argv, "-subj", f"/CN={server_name}"])
    ext = directory / "server.ext"
    ext.write_text(
        f"subjectAltName=DNS:{server_name}\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\n"
    )
    argv = ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key)]
    _run([*argv, "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt)])
    return ca_crt, crt, key


class TlsPostgres:
    """A cluster in a directory of its own, listening on ``address``:``port`` (TLS) and
    on a Unix socket in that directory."""

    def __init__(self, *, address: str, server_name: str, networks: list[str]) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        self.bindir = bindir
        self.address = address
        self.server_name = server_name
        self.networks = networks  # CIDRs allowed to connect over TCP (TLS only)
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="qd-hosts-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.password = secrets.token_urlsafe(18)
        self.ca_crt = self.dir / "ca.crt"
        self._started = False

    def start(self) -> None:
        entry = pwd.getpwnam(PG_USER)
        os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.dir.chmod(0o755)  # the CA certificate is read by the hosts' copies
        ca, crt, key = make_certificates(self.dir, self.server_name)
        for path in (crt, key):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        key.chmod(0o600)
        self.ca_crt = ca
        argv = [str(self.bindir / "initdb"), "-D", str(self.data), "-U", PG_USER]
        _run(
            [*argv, "--auth-local=trust", "--auth-host=reject", "-E", "UTF8", "--no-sync"],
            user=PG_USER,
            cwd=self.dir,
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n".join(
                    [
                        "",
                        f"listen_addresses = '{self.address}'",
                        f"port = {self.port}",
                        f"unix_socket_directories = '{self.dir}'",
                        "ssl = on",
                        f"ssl_cert_file = '{crt}'",
                        f"ssl_key_file = '{key}'",
                        "ssl_min_protocol_version = 'TLSv1.2'",
                        "password_encryption = 'scram-sha-256'",
                        "max_connections = 100",
                        # a host cut off mid-transaction holds its row locks until the
                        # server drops its connection: notice a silent peer in seconds
                        "tcp_keepalives_idle = 5",
                        "tcp_keepalives_interval = 2",
                        "tcp_keepalives_count = 3",
                        "tcp_user_timeout = 10000",
                        "idle_in_transaction_session_timeout = '30s'",
                        "",
                    ]
                )
            )
        lines = ["local all all trust"]
        lines += [f"hostssl all all {net} scram-sha-256" for net in self.networks]
        (self.data / "pg_hba.conf").write_text("\n".join(lines) + "\n")
        _run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "start"],
            user=PG_USER,
            cwd=self.dir,
        )
        self._started = True

    async def create(self, role: str, database: str) -> None:
        conn = await self.connect_admin()
        try:
            await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{self.password}'")
            await conn.execute(f"CREATE DATABASE {database} OWNER {role}")
        finally:
            await conn.close()

    async def connect_admin(self, database: str = "postgres") -> asyncpg.Connection:
        """The superuser over the Unix socket (the test's own view of the store)."""
        return await asyncpg.connect(
            host=str(self.dir), port=self.port, user=PG_USER, database=database
        )

    def dsn(self, role: str, database: str, *, ca: Path, host: str | None = None) -> str:
        """A client's DSN: by the certificate's name, verified against ``ca``."""
        return (
            f"postgresql://{role}:{self.password}@{host or self.server_name}:{self.port}"
            f"/{database}?sslmode=verify-full&sslrootcert={ca}"
        )

    def server_pids(self) -> list[int]:
        """The postmaster and every backend (children of the postmaster)."""
        pidfile = self.data / "postmaster.pid"
        if not pidfile.exists():
            return []
        master = int(pidfile.read_text().split()[0])
        children = Path(f"/proc/{master}/task/{master}/children")
        kids = [int(p) for p in children.read_text().split()] if children.exists() else []
        return [master, *kids]

    def stop(self) -> None:
        if self._started:
            argv = ["runuser", "-u", PG_USER, "--", str(self.bindir / "pg_ctl")]
            subprocess.run(
                [*argv, "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=60,
                check=False,
            )
            self._started = False
        shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
