"""The flags that bound clients and handlers: defaults, flags, environment, bad values."""

from __future__ import annotations

import pytest

from queue_daemon.cli import CliError, build_parser, settings_from
from queue_daemon.settings import MIB


def _settings(*argv: str) -> object:
    return settings_from(build_parser().parse_args(["serve", *argv]))


def test_defaults() -> None:
    settings = settings_from(build_parser().parse_args(["serve"]))
    assert (settings.client_timeout, settings.handler_limit) == (30.0, MIB)


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_DAEMON_CLIENT_TIMEOUT", "7.5")
    monkeypatch.setenv("QUEUE_DAEMON_HANDLER_LIMIT", "4096")
    settings = settings_from(build_parser().parse_args(["serve"]))
    assert (settings.client_timeout, settings.handler_limit) == (7.5, 4096)
    # a flag wins over the environment
    settings = settings_from(
        build_parser().parse_args(["serve", "--client-timeout", "2", "--handler-limit", "99"])
    )
    assert (settings.client_timeout, settings.handler_limit) == (2.0, 99)


def test_realtime_is_opt_in_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    def realtime(*argv: str) -> bool:
        return settings_from(build_parser().parse_args(["serve", *argv])).realtime

    assert realtime() is False
    assert realtime("--realtime") is True
    assert realtime("--no-realtime") is False
    monkeypatch.setenv("QUEUE_DAEMON_REALTIME", "1")
    assert realtime() is True
    assert realtime("--no-realtime") is False  # a flag wins over the environment
    monkeypatch.setenv("QUEUE_DAEMON_NO_REALTIME", "1")  # the old switch still turns it off
    assert realtime() is False
    assert realtime("--realtime") is True


def test_inline_journal_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def inline(*argv: str) -> bool:
        return settings_from(build_parser().parse_args(["serve", *argv])).inline_journal

    assert inline() is True
    assert inline("--no-inline-journal") is False
    monkeypatch.setenv("QUEUE_DAEMON_NO_INLINE_JOURNAL", "1")
    assert inline() is False
    assert inline("--inline-journal") is True  # a flag wins over the environment


@pytest.mark.parametrize(
    "argv",
    [
        ["--client-timeout", "0"],
        ["--client-timeout", "-1"],
        ["--client-timeout", "soon"],
        ["--client-timeout", "nan"],
        ["--client-timeout", "inf"],
        ["--lease", "nan"],
        ["--handler-limit", "0"],
        ["--handler-limit", "1.5"],
    ],
)
def test_bad_values_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(CliError):
        _settings(*argv)
