"""``serve --mdns``: the daemon advertised on the local network with multicast DNS
(python-zeroconf), as ``_queue-daemon._tcp.local.`` with its port and, in the
TXT record, its sysid, version and URL path; ``queue_daemon.client.discover``
finds them.

A daemon listening on every address (``--host 0.0.0.0``) advertises each IPv4
address of its interfaces but loopback; one listening on one address,
that address. A daemon that cannot advertise (no multicast, no interface) logs
a warning and serves on: discovery is a convenience, not a dependency.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from importlib.metadata import PackageNotFoundError, version

from zeroconf import Error as ZeroconfError
from zeroconf import IPVersion, ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

SERVICE = "_queue-daemon._tcp.local."

logger = logging.getLogger(__name__)


def _version() -> str:
    try:
        return version("queue-daemon")
    except PackageNotFoundError:
        return "unknown"


def addresses(host: str) -> list[str]:
    """The IPv4 addresses a daemon listening on ``host`` is reached at."""
    if host not in ("", "0.0.0.0", "::"):
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            return [socket.gethostbyname(host)]
    import ifaddr  # python-zeroconf's own dependency

    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback:
                found.append(ip.ip)
    return found


class Advertiser:
    """The daemon's mDNS record, from ``start`` to ``stop``."""

    def __init__(self, sysid: str, host: str, port: int) -> None:
        self._sysid = sysid
        self._host = host
        self._port = port
        self._zc: AsyncZeroconf | None = None
        self._info: ServiceInfo | None = None

    async def start(self) -> None:
        try:
            found = await asyncio.to_thread(addresses, self._host)  # may resolve a name
            if not found:
                raise OSError("no address but loopback to advertise")
            host = socket.gethostname().split(".")[0][:40]
            name = f"queue-daemon {host} {self._sysid}"[:63]
            info = ServiceInfo(
                SERVICE,
                f"{name}.{SERVICE}",
                port=self._port,
                properties={"sysid": self._sysid, "version": _version(), "path": "/"},
                parsed_addresses=found,
                server=f"{f'qd-{host}-{self._sysid}'[:63]}.local.",
            )
            zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
            try:
                await zc.async_register_service(info, allow_name_change=True)
            except BaseException:
                await zc.async_close()
                raise
        except (OSError, ValueError, RuntimeError, ZeroconfError) as exc:
            logger.warning(
                "cannot advertise this daemon with mDNS: %s", exc, extra={"action": "mdns"}
            )
            return
        self._zc, self._info = zc, info
        logger.info("advertised as %s on %s", info.name, ", ".join(found), extra={"action": "mdns"})

    async def stop(self) -> None:
        zc, info, self._zc, self._info = self._zc, self._info, None, None
        if zc is None or info is None:
            return
        try:
            await zc.async_unregister_service(info)
        except (OSError, RuntimeError, ZeroconfError) as exc:  # the stop goes on
            logger.warning("the mDNS record was not withdrawn: %s", exc, extra={"action": "mdns"})
        finally:
            await zc.async_close()
