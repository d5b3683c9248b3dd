"""The address policy of http handlers: what the daemon refuses to connect to."""

from __future__ import annotations

import argparse

import pytest

from queue_daemon.cli import CliError, build_parser, settings_from
from queue_daemon.runners.sandbox.addresses import AddressPolicy, AddressRefused, parse_networks


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("100.64.0.1", "shared (100.64.0.0/10)"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("192.0.2.1", "private"),  # documentation range
        ("240.0.0.1", "private"),  # reserved
        ("2002:7f00:1::", "loopback (127.0.0.1 inside)"),  # 6to4
        ("2002:a00:1::5", "private (10.0.0.1 inside)"),
        ("2002:a9fe:a9fe::", "link-local (169.254.169.254 inside)"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback (127.0.0.1 inside)"),  # Teredo
        ("::127.0.0.1", "loopback (127.0.0.1 inside)"),  # IPv4-compatible
        ("::10.1.2.3", "private (10.1.2.3 inside)"),
        ("64:ff9b::a00:1", "private (10.0.0.1 inside)"),  # NAT64
        ("64:ff9b:1::7f00:1", "loopback (127.0.0.1 inside)"),
    ],
)
def test_non_public_addresses_are_refused(host: str, kind: str) -> None:
    problem = AddressPolicy().problem(host)
    assert problem is not None and f"is a {kind} address" in problem, problem
    with pytest.raises(AddressRefused):
        AddressPolicy().check(host)


@pytest.mark.parametrize(
    "host",
    [
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "100.128.0.1",
        "2002:808:808::",
        "64:ff9b::808:808",
    ],
)
def test_public_addresses_are_allowed(host: str) -> None:
    assert AddressPolicy().problem(host) is None


def test_allow_list_opens_ranges() -> None:
    policy = AddressPolicy(parse_networks("127.0.0.1/32, 10.0.0.0/8,fd00::/8"))
    assert policy.problem("127.0.0.1") is None
    assert policy.problem("::ffff:127.0.0.1") is None
    assert policy.problem("10.200.0.1") is None
    assert policy.problem("fd00::5") is None
    assert policy.problem("127.0.0.2") is not None
    assert policy.problem("192.168.0.1") is not None


def test_an_ipv6_range_does_not_open_ipv4() -> None:
    assert AddressPolicy(parse_networks("::/0")).problem("127.0.0.1") is not None


def test_parse_networks() -> None:
    assert [str(n) for n in parse_networks("127.0.0.1, ::1,10.0.0.0/8,")] == [
        "127.0.0.1/32",
        "::1/128",
        "10.0.0.0/8",
    ]
    assert parse_networks("") == ()
    with pytest.raises(ValueError, match="not an address or CIDR range: 'nope'"):
        parse_networks("10.0.0.0/8,nope")


def _serve(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_http_allow_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from(_serve()).http_allow == ()
    settings = settings_from(_serve("--http-allow", "127.0.0.0/8,fd00::/8"))
    assert [str(n) for n in settings.http_allow] == ["127.0.0.0/8", "fd00::/8"]
    monkeypatch.setenv("QUEUE_DAEMON_HTTP_ALLOW", "10.0.0.0/8")
    assert [str(n) for n in settings_from(_serve()).http_allow] == ["10.0.0.0/8"]
    with pytest.raises(CliError, match="--http-allow: not an address or CIDR range"):
        settings_from(_serve("--http-allow", "10.0.0.0/33"))
