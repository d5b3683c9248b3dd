"""Which addresses the daemon may connect to on behalf of an ``http`` handler.

The daemon itself POSTs an http handler's payload, from its own network: a
tenant must not point it at the daemon's API on loopback, a TCP store, the
local network or a cloud metadata service (169.254.169.254). Refused unless
an operator opens them (``--http-allow CIDR,…``): loopback, link-local,
unspecified, multicast, private (RFC 1918, fc00::/7), shared (100.64.0.0/10)
and every other address that is not globally routable (documentation,
benchmarking, reserved ranges). An IPv6 address that carries an IPv4 one
(mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, 6to4 ``2002::/16``,
Teredo ``2001::/32``, NAT64 ``64:ff9b::/96`` and ``64:ff9b:1::/48``) is
refused when the IPv4 address is, since a relay or translator on the way may
deliver it there.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (not "private" in 3.11)
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


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


def embedded(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (see the module's doc), or None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's own address
    number = int(address)
    if any(address in network for network in NAT64) or 1 < number < 1 << 32:
        return ipaddress.IPv4Address(number & 0xFFFFFFFF)  # NAT64, or IPv4-compatible
    return None


def kind(address: Address) -> str | None:
    """What kind of non-public address ``address`` is, or None for a public one."""
    inner = embedded(address)
    if inner is None:
        return _kind(address)
    what = _kind(inner)
    assert isinstance(address, ipaddress.IPv6Address)
    if address.ipv4_mapped is not None:  # the IPv4 address itself, as IPv6 writes it
        return what
    if what is None and any(address in network for network in NAT64):
        return None  # a translator's way to a public IPv4 address
    return _kind(address) if what is None else f"{what} ({inner} inside)"


def _kind(address: Address) -> str | None:
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
        plain = embedded(address)
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
