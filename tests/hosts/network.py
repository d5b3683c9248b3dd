"""Hosts made of network namespaces, for daemons that must not share a machine's network.

A ``Network`` is a bridge in the root namespace (the "switch" the store's address
sits on) and, per host, a namespace with two links:

- ``store``: a veth pair whose root end is a port of the bridge; cutting the host
  off the store puts that end down (the cable pulled at the switch: the host's
  packets to the store vanish, nothing answers them);
- ``ctl``: a point-to-point veth pair to the root namespace, where the test
  reaches the daemon's HTTP port; it stays up while the store link is cut, as a
  client's network does when only the database link fails.

A host has no default route, so nothing it sends reaches the store but over its
store link. Each host resolves names through its own hosts file, bound over
``/etc/hosts`` in a mount namespace of the host's processes alone (what
``ip netns exec`` does, without remounting ``/sys``: the daemon's CPU groups
live under ``/sys/fs/cgroup``). Every name made here carries a tag of this
process, so tests running at once on one machine do not meet, and ``close``
removes all of it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.needs import missing

TOOLS = ("ip", "nsenter", "unshare", "mount")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class NetworkError(RuntimeError):
    """A namespace, link or address could not be made."""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """One "machine": a network namespace, its addresses and its own directory."""

    name: str
    netns: str
    store_ip: str  # on the bridge
    ctl_ip: str  # where the daemon listens, reached from the root namespace
    store_port: str  # the bridge's end of the store link (root namespace)
    root: Path  # the host's own files: hosts file, CA copy, data directory
    hosts_file: Path

    def wrap(self) -> list[str]:
        """The argv prefix that runs a command on this host."""
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"',
            str(self.hosts_file),
        ]


class Network:
    """A bridge and hosts on it; see the module's docstring."""

    def __init__(self, root: Path, *, store_name: str) -> None:
        """``store_name``: the store's host name, which every host resolves to the
        bridge's address (where the store listens)."""
        self.root = root
        self.store_name = store_name
        self.tag = f"{os.getpid() & 0xFFFFF:05x}"
        self.bridge = f"qdb{self.tag}"
        self._store_net, self._ctl_net = _free_subnets(2)
        self.store_ip = str(self._store_net.network_address + 1)
        self.hosts: list[Host] = []
        self._netns: list[str] = []
        self._links: list[str] = []
        self._made_bridge = False

    @property
    def store_cidr(self) -> str:
        return str(self._store_net)

    def start(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _ip("addr", "add", f"{self.store_ip}/{self._store_net.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        n = len(self.hosts)
        netns = f"qd{self.tag}-{name}"
        store_root, ctl_root = f"qh{self.tag}s{n}", f"qh{self.tag}c{n}"
        store_ip = self._store_net.network_address + 10 + n
        ctl_base = self._ctl_net.network_address + 4 * n  # a /30 per host
        _ip("netns", "add", netns)
        self._netns.append(netns)
        for link, inner in ((store_root, "store"), (ctl_root, "ctl")):
            _ip("link", "add", link, "type", "veth", "peer", "name", link + "x")
            self._links.append(link)
            _ip("link", "set", link + "x", "netns", netns)
            _ip("-n", netns, "link", "set", link + "x", "name", inner)
        _ip("link", "set", store_root, "master", self.bridge)
        _ip("link", "set", store_root, "up")
        _ip("addr", "add", f"{ctl_base + 1}/30", "dev", ctl_root)
        _ip("link", "set", ctl_root, "up")
        _ip("-n", netns, "addr", "add", f"{store_ip}/{self._store_net.prefixlen}", "dev", "store")
        _ip("-n", netns, "addr", "add", f"{ctl_base + 2}/30", "dev", "ctl")
        for inner in ("lo", "store", "ctl"):
            _ip("-n", netns, "link", "set", inner, "up")
        home = self.root / name
        home.mkdir(parents=True)
        hosts_file = home / "hosts"
        lines = ["127.0.0.1 localhost", f"{store_ip} {name}", f"{self.store_ip} {self.store_name}"]
        hosts_file.write_text("\n".join(lines) + "\n")
        host = Host(
            name=name,
            netns=netns,
            store_ip=str(store_ip),
            ctl_ip=str(ctl_base + 2),
            store_port=store_root,
            root=home,
            hosts_file=hosts_file,
        )
        self.hosts.append(host)
        return host

    def cut(self, host: Host) -> None:
        """Pull the host's store cable at the switch."""
        _ip("link", "set", host.store_port, "down")

    def mend(self, host: Host) -> None:
        _ip("link", "set", host.store_port, "up")

    def close(self) -> None:
        """Remove every namespace and link made here (their veth peers go with them)."""
        for netns in self._netns:
            with contextlib.suppress(NetworkError):
                _ip("netns", "del", netns)
        for link in self._links:
            with contextlib.suppress(NetworkError):
                if _link_exists(link):
                    _ip("link", "del", link)
        if self._made_bridge:
            with contextlib.suppress(NetworkError):
                _ip("link", "del", self.bridge)

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network that still exist (after ``close``: none)."""
        names = set(_ip("netns", "list").split())
        left = [n for n in self._netns if n in names]
        left += [link for link in [*self._links, self.bridge] if _link_exists(link)]
        return left


@contextlib.contextmanager
def hosts_on_a_bridge(
    root: Path, names: Sequence[str], *, store_name: str, test: str
) -> Iterator[Network]:
    """A started ``Network`` with a host per name; skipped (failed in CI) where
    namespaces cannot be made; everything removed at the end, and checked."""
    if os.geteuid() != 0:
        missing(test, "network namespaces need root")
    tools = missing_tools()
    if tools:
        missing(test, f"missing tools: {', '.join(tools)}")
    net = Network(root, store_name=store_name)
    try:
        try:
            net.start()
            for name in names:
                net.add_host(name)
        except NetworkError as exc:
            missing(test, f"network namespaces cannot be made here: {exc}")
        yield net
    finally:
        net.close()
    assert net.leftovers() == [], "namespaces or links left behind"


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """``count`` /24s in 10.0.0.0/8 that no route or address of this machine overlaps."""
    used = []
    for line in json.loads(_ip("-j", "route", "show", "table", "all") or "[]"):
        dst = line.get("dst", "")
        with contextlib.suppress(ValueError):
            if dst and dst != "default":
                used.append(ipaddress.ip_network(dst, strict=False))
    chosen: list[ipaddress.IPv4Network] = []
    rng = random.Random()
    while len(chosen) < count:
        net = ipaddress.IPv4Network(f"10.{rng.randrange(64, 250)}.{rng.randrange(0, 256)}.0/24")
        if net not in chosen and not any(
            net.version == u.version and net.overlaps(u) for u in used
        ):
            chosen.append(net)
    return chosen
