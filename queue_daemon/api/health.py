"""Routes for operators' probes: ``/healthz`` (docs/api.md), ``/livez`` (liveness),
``/readyz`` (readiness) and ``/metrics`` (Prometheus text).

``/healthz`` is what docs/api.md fixes: ``200`` when the daemon can reach its store
and journal, else ``503``, with what it knows about both and the ingest lag.
``/livez`` answers ``200`` whenever the process serves HTTP: a daemon whose store
is down keeps accepting adds into its journal, and restarting it would not bring
the store back, so that is the probe to restart on. ``/readyz`` adds the ingest
lag and the sysid lease to the checks: ``503`` with a reason per failed check, so
a load balancer sends adds elsewhere while, say, ingestion is far behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from queue_daemon.api.auth import authorize_admin
from queue_daemon.api.web import SERVICES, Services, json_response
from queue_daemon.store.errors import StoreError

PING_TIMEOUT_S = 2.0  # a store that takes longer to answer a ping counts as unreachable


async def _ping(services: Services) -> str | None:
    """None if the store answers, else why not."""
    try:
        await asyncio.wait_for(services.ping(), PING_TIMEOUT_S)
    except TimeoutError:
        return f"the store did not answer within {PING_TIMEOUT_S:g} s"
    except StoreError as exc:
        return f"the store cannot be reached: {exc}"
    return None


def _lag_ms(services: Services) -> int | None:
    oldest = services.journal.lag.oldest_unread_ms
    return None if oldest is None else max(0, time.time_ns() // 1_000_000 - oldest)


async def _parts(services: Services) -> tuple[dict[str, Any], list[str]]:
    """The state of the store, journal and ingestion, and what is wrong."""
    lag = services.journal.lag
    store_reason = await _ping(services)
    problems = [] if store_reason is None else [store_reason]
    journal_reason = services.journal.write_problem()
    if journal_reason is not None:
        problems.append(f"the journal cannot be written: {journal_reason}")
    body = {
        "sysid": services.sysid,
        "store": "ok" if store_reason is None else "unreachable",
        "journal": "ok" if journal_reason is None else "failed",
        "ingest_lag": {
            "lines": lag.unread_lines,
            "bytes": lag.unread_bytes,
            "oldest_ms": _lag_ms(services),
        },
        "ingested": services.ingester.ingested,
    }
    return body, problems


async def healthz(request: web.Request) -> web.Response:
    """docs/api.md: 200 when the store and the journal can be reached, else 503."""
    body, problems = await _parts(request.app[SERVICES])
    if problems:
        return json_response(
            {"error": "unavailable", "message": "; ".join(problems), **body}, status=503
        )
    return json_response({"status": "ok", **body})


async def livez(request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves, with the state of its parts."""
    body, _ = await _parts(request.app[SERVICES])
    return json_response({"status": "ok", **body})


def _check(reason: str | None, **detail: Any) -> dict[str, Any]:
    check: dict[str, Any] = {"ok": reason is None, **detail}
    if reason is not None:
        check["reason"] = reason
    return check


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 when the store answers, the journal can be written, ingestion
    is within ``--ready-lag`` seconds and the sysid lease is held; else 503 with
    the reason of each failed check."""
    services = request.app[SERVICES]
    settings = services.settings
    lag_ms = _lag_ms(services)
    lag_s = 0.0 if lag_ms is None else lag_ms / 1000
    lease_age = time.monotonic() - services.identity.renewed_at
    lease_reason = None
    if services.identity.lost:
        lease_reason = f"sysid {services.sysid} was taken over by another daemon"
    elif lease_age > settings.lease:
        lease_reason = f"the sysid lease was last renewed {lease_age:.0f} s ago"
    checks = {
        "store": _check(await _ping(services)),
        "journal": _check(services.journal.write_problem()),
        "ingest_lag": _check(
            None
            if lag_s <= settings.ready_lag
            else f"the oldest job not yet in the store is {lag_s:.1f} s old"
            f" (over {settings.ready_lag:g} s)",
            seconds=round(lag_s, 3),
            threshold=settings.ready_lag,
        ),
        "sysid": _check(lease_reason, lease_age_seconds=round(lease_age, 1)),
    }
    reasons = [check["reason"] for check in checks.values() if not check["ok"]]
    if reasons:
        return json_response(
            {
                "error": "unavailable",
                "message": "; ".join(reasons),
                "sysid": services.sysid,
                "checks": checks,
            },
            status=503,
        )
    return json_response({"status": "ok", "sysid": services.sysid, "checks": checks})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text; it names tenants, so it takes the operator token."""
    services = request.app[SERVICES]
    await authorize_admin(request, services)
    await services.metrics.refresh()
    return web.Response(
        body=services.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
