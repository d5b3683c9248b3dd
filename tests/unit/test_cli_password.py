"""A store password on the command line is readable by every local user: warn."""

from __future__ import annotations

import pytest

from queue_daemon.cli import password_in_argv


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
