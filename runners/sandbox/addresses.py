"""Which addresses the daemon may connect to on behalf of an ``http`` handler.

The daemon itself POSTs an http handler's payload, from its own network: a
tenant must not point it at the daemon's API on loopback, a TCP store, the
local network or a cloud metadata service (169.254.169.254). Refused unless
an operator opens them (``--http-allow CIDR,…``): loopback, link-local,
unspecified, multicast, private (RFC 1918, fc00::/7), shared (100.64.0.0/10)
and every other address that is not globally routable (documentation,
benchmarking, reserved ranges). An IPv4 address inside IPv6 (``::ffff:a.b.c.d``)
is judged as the IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (not "private" in 3.11)


class AddressRefused(OSError):
    """A connection the address policy does not allow (the message says why)."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """``CIDR[,CIDR…]`` (a bare address is a /32 or /128); ValueError names a bad one."""
    networks = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"not an address or CIDR range: {item!r}") from None
    return tuple(networks)


def kind(address: Address) -> str | None:
    """What kind of non-public address ``address`` is, or None for a public one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address in SHARED:
        return "shared (100.64.0.0/10)"
    if address.is_private:
        return "private"
    if not address.is_global or address.is_reserved:
        return "not globally routable"
    return None


class AddressPolicy:
    """Public addresses, plus the networks an operator allowed."""

    def __init__(self, allow: Iterable[Network] = ()) -> None:
        self.allow = tuple(allow)

    def problem(self, host: str) -> str | None:
        """Why the daemon must not connect to the address ``host``, or None."""
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return f"{host!r} is not an address"
        what = kind(address)
        if what is None:
            return None
        plain = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        for network in self.allow:
            if _within(address, network) or (plain is not None and _within(plain, network)):
                return None
        return f"{address} is a {what} address (allow it with --http-allow)"

    def check(self, host: str) -> None:
        problem = self.problem(host)
        if problem is not None:
            raise AddressRefused(problem)


def _within(address: Address, network: Network) -> bool:
    # ``in`` does not compare versions: 127.0.0.1 would be "in" ::/0
    return address.version == network.version and address in network
