"""The route table: every URL of docs/api.md and the function that answers it."""

from __future__ import annotations

from aiohttp import web

from queue_daemon.api import (
    admin,
    blobs,
    done,
    handlers,
    health,
    jobs,
    openapi,
    overview,
    pauses,
    pull,
    schedules,
)
from queue_daemon.api.web import SERVICES, Services, error_middleware


def build_app(services: Services) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware], client_max_size=services.settings.body_limit
    )
    app[SERVICES] = services
    router = app.router
    router.add_get("/", overview.dashboard)
    # before /{client}/overview, which would take "admin" for a client name
    router.add_get("/admin/overview", overview.admin_overview)
    router.add_get("/admin/workers", pull.admin_workers)
    router.add_post("/{client}/job/{type}/add", jobs.add_jobs)
    router.add_get("/{client}/job/{id}", jobs.get_job)
    router.add_post("/{client}/job/{id}/cancel", jobs.cancel_job)
    router.add_post("/{client}/job/{id}/rerun", done.rerun_job)
    router.add_get("/{client}/jobs", jobs.list_jobs)
    router.add_post("/{client}/jobs/delete", done.delete_jobs)
    router.add_post("/{client}/jobs/rerun", done.rerun_jobs)
    router.add_get("/{client}/stats", jobs.stats)
    router.add_post("/{client}/type/{type}/pause", pauses.pause_type)
    router.add_post("/{client}/type/{type}/resume", pauses.resume_type)
    router.add_post("/{client}/job/{type}/claim", pull.claim)
    router.add_post("/{client}/job/{id}/renew", pull.renew_one)
    router.add_post("/{client}/job/{id}/complete", pull.complete_one)
    router.add_post("/{client}/job/{id}/release", pull.release_one)
    router.add_post("/{client}/jobs/renew", pull.renew_many)
    router.add_post("/{client}/jobs/complete", pull.complete_many)
    router.add_post("/{client}/jobs/release", pull.release_many)
    router.add_get("/{client}/workers", pull.workers)
    router.add_get("/{client}/overview", overview.tenant_overview)
    router.add_post("/{client}/handler/add/{type}", handlers.add_handler)
    router.add_post("/{client}/handler/del/{type}", handlers.delete_handler)
    router.add_get("/{client}/handler/get/{type}", handlers.get_handler)
    router.add_post("/{client}/schedule/add/{name}", schedules.add_schedule)
    router.add_post("/{client}/schedule/del/{name}", schedules.delete_schedule)
    router.add_get("/{client}/schedules", schedules.list_schedules)
    router.add_put("/{client}/blob", blobs.put_blob)
    router.add_get("/{client}/blob/{addr}", blobs.get_blob)
    router.add_delete("/{client}/blob/{addr}", blobs.delete_blob)
    router.add_get("/admin/tenants", admin.list_tenants)
    router.add_get("/admin/tenants/{client}/limits", admin.get_limits)
    router.add_post("/admin/tenants/{client}/limits", admin.set_limits)
    router.add_post("/admin/tenants/{client}/pause", pauses.pause_tenant)
    router.add_post("/admin/tenants/{client}/resume", pauses.resume_tenant)
    router.add_get("/healthz", health.healthz)
    router.add_get("/livez", health.livez)
    router.add_get("/readyz", health.readyz)
    router.add_get("/metrics", health.metrics)
    router.add_get("/openapi.json", openapi.serve)
    return app
