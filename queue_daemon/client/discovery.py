"""``discover``: the URLs of the daemons that advertise themselves on the local
network (``serve --mdns``), found with multicast DNS (python-zeroconf, imported
only when called)."""

from __future__ import annotations

import asyncio

SERVICE = "_queue-daemon._tcp.local."


async def discover(timeout: float = 3.0) -> list[str]:  # noqa: ASYNC109
    """Browse for ``timeout`` seconds; the URL of every daemon that answered
    (``http://<address>:<port>``, one per advertised address), sorted."""
    from zeroconf import IPVersion, ServiceStateChange
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

    names: set[str] = set()

    def seen(
        zeroconf: object, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        if state_change is not ServiceStateChange.Removed:
            names.add(name)

    zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
    try:
        browser = AsyncServiceBrowser(zc.zeroconf, SERVICE, handlers=[seen])
        try:
            await asyncio.sleep(timeout)
        finally:
            await browser.async_cancel()
        urls: set[str] = set()
        for name in sorted(names):
            info = AsyncServiceInfo(SERVICE, name)
            if not await info.async_request(zc.zeroconf, 1000) or info.port is None:
                continue
            path = (info.properties or {}).get(b"path") or b"/"
            suffix = path.decode(errors="replace").rstrip("/")
            for address in info.parsed_addresses(IPVersion.V4Only):
                urls.add(f"http://{address}:{info.port}{suffix}")
        return sorted(urls)
    finally:
        await zc.async_close()
