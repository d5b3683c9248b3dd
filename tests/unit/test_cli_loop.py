"""``--event-loop``: uvloop unless asked otherwise, by flag or environment."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from queue_daemon.cli import CliError, build_parser
from queue_daemon.cli.config import event_loop


def _loop_of(*argv: str) -> asyncio.AbstractEventLoop:
    args = build_parser().parse_args(["serve", *argv])
    loop = event_loop(args.event_loop)()
    loop.close()
    return loop


def test_uvloop_by_default_and_asyncio_by_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(_loop_of(), uvloop.Loop)
    assert not isinstance(_loop_of("--event-loop", "asyncio"), uvloop.Loop)
    monkeypatch.setenv("QUEUE_DAEMON_EVENT_LOOP", "asyncio")
    assert not isinstance(_loop_of(), uvloop.Loop)
    assert isinstance(_loop_of("--event-loop", "uvloop"), uvloop.Loop)


def test_an_unknown_loop_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--event-loop", "trio"])
    assert "--event-loop" in capsys.readouterr().err
    # argparse does not check a default from the environment against the choices
    monkeypatch.setenv("QUEUE_DAEMON_EVENT_LOOP", "trio")
    with pytest.raises(CliError, match="uvloop or asyncio"):
        _loop_of()
