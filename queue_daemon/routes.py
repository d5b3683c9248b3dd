"""The route table: every URL of API.md and the function that answers it."""

from __future__ import annotations

from aiohttp import web

from queue_daemon import (
    admin_routes,
    handler_routes,
    health_routes,
    http,
    openapi,
    overview_routes,
)
from queue_daemon.http import SERVICES, Services, error_middleware


def build_app(services: Services) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware], client_max_size=services.settings.body_limit
    )
    app[SERVICES] = services
    router = app.router
    router.add_get("/", overview_routes.dashboard)
    # before /{client}/overview, which would take "admin" for a client name
    router.add_get("/admin/overview", overview_routes.admin_overview)
    router.add_post("/{client}/job/{type}/add", http.add_jobs)
    router.add_get("/{client}/job/{id}", http.get_job)
    router.add_post("/{client}/job/{id}/cancel", http.cancel_job)
    router.add_get("/{client}/jobs", http.list_jobs)
    router.add_get("/{client}/stats", http.stats)
    router.add_get("/{client}/overview", overview_routes.tenant_overview)
    router.add_post("/{client}/handler/add/{type}", handler_routes.add_handler)
    router.add_post("/{client}/handler/del/{type}", handler_routes.delete_handler)
    router.add_get("/{client}/handler/get/{type}", handler_routes.get_handler)
    router.add_get("/admin/tenants", admin_routes.list_tenants)
    router.add_get("/admin/tenants/{client}/limits", admin_routes.get_limits)
    router.add_post("/admin/tenants/{client}/limits", admin_routes.set_limits)
    router.add_get("/healthz", health_routes.healthz)
    router.add_get("/livez", health_routes.livez)
    router.add_get("/readyz", health_routes.readyz)
    router.add_get("/metrics", health_routes.metrics)
    router.add_get("/openapi.json", openapi.serve)
    return app
