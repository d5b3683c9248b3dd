"""CLI checks that need no store: a password on the command line (readable by every
local user) warns; a reserved tenant name is refused."""

from __future__ import annotations

import pytest

from queue_daemon.cli import main, password_in_argv


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--store", "postgresql://app:s3cret@db/queue"],
        ["serve", "--store=postgresql://app:s3cret@db/queue"],
        ["serve", "--store", "host=db user=app password=s3cret"],
        ["tenant", "add", "x", "--store", "dbname=q password = s3cret"],
    ],
)
def test_a_password_in_argv_is_found(argv: list[str]) -> None:
    assert password_in_argv(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["serve", "--store", "postgresql://app@db/queue"],
        ["serve", "--store", "postgresql:///queue?host=/run/postgresql"],
        ["serve", "--store"],
        ["serve", "--data-dir", "password=x"],
    ],
)
def test_no_password_no_warning(argv: list[str]) -> None:
    assert not password_in_argv(argv)


def test_admin_is_no_tenant_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tenant", "add", "admin", "--store", "postgresql://nowhere.invalid/x"]) == 2
    assert "reserved" in capsys.readouterr().err
