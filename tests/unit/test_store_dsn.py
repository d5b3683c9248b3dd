"""A DSN's TLS files are checked before connecting, a certificate the DSN does
not accept is a setting to fix, not an outage to wait out, and a DSN naming
several hosts is tried one host at a time."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from queue_daemon.store.dsn import check_tls_files, host_dsns
from queue_daemon.store.errors import StoreError, StoreUnavailable
from queue_daemon.store.translate import is_unavailable, translate

DSN = "postgresql://queue:s3cret@db.example.net:5432/queue"


def test_a_dsn_without_tls_files_passes() -> None:
    check_tls_files(DSN)
    check_tls_files(DSN + "?sslmode=require")


def test_readable_tls_files_pass(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not parsed here\n")
    check_tls_files(f"{DSN}?sslmode=verify-full&sslrootcert={ca}")


@pytest.mark.parametrize("key", ["sslrootcert", "sslcert", "sslkey", "sslcrl"])
def test_a_missing_tls_file_is_named(tmp_path: Path, key: str) -> None:
    missing = tmp_path / "nowhere" / f"{key}.pem"
    with pytest.raises(StoreError) as caught:
        check_tls_files(f"{DSN}?sslmode=verify-full&{key}={missing}")
    assert not isinstance(caught.value, StoreUnavailable)
    message = str(caught.value)
    assert f"{key}={missing}" in message
    assert "No such file" in message
    assert "s3cret" not in message


def test_a_certificate_that_fails_verification_is_no_outage() -> None:
    failed = ssl.SSLCertVerificationError(1, "certificate verify failed: Hostname mismatch")
    assert not is_unavailable(failed)
    with pytest.raises(StoreError) as caught, translate():
        raise failed
    assert not isinstance(caught.value, StoreUnavailable)
    # other socket errors still are
    assert is_unavailable(ConnectionRefusedError(111, "refused"))
    assert is_unavailable(ssl.SSLError(1, "unexpected eof while reading"))


def test_a_url_with_several_hosts_is_one_dsn_per_host_in_order() -> None:
    dsn = "postgresql://q:p%40ss@db1:5432,db2:5433/queue?target_session_attrs=read-write"
    assert host_dsns(dsn) == [
        "postgresql://q:p%40ss@db1:5432/queue?target_session_attrs=read-write",
        "postgresql://q:p%40ss@db2:5433/queue?target_session_attrs=read-write",
    ]
    assert host_dsns("postgres://db1,[::1]:6432/q") == [
        "postgres://db1/q",
        "postgres://[::1]:6432/q",
    ]


def test_any_other_dsn_is_left_as_it_is() -> None:
    for dsn in (
        "postgresql://q@db1:5432/queue?sslmode=verify-full",
        "host=db1,db2 dbname=queue",
        "postgresql://q@/queue?host=/run/pg",
        "http://a,b/x",
    ):
        assert host_dsns(dsn) == [dsn]
