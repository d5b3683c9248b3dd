"""The OpenAPI 3 document of every route in ``routes.py``, served at ``GET /openapi.json``.

Built once, by hand, next to the code it describes: docs/api.md is the contract and
this is its machine-readable form (tests/acceptance/test_openapi.py fuzzes the
live daemon against it with schemathesis).
"""

from __future__ import annotations

import functools
from typing import Any

import orjson
from aiohttp import web

from runners.models import LANGS

CLIENT_PATTERN = "^[a-z0-9_]{1,40}$"
TYPE_PATTERN = "^[A-Za-z0-9_.:-]{1,100}$"
OPTIONAL_TYPE_PATTERN = "^([A-Za-z0-9_.:-]{1,100})?$"
MAX_DELAY_S = 10 * 365 * 24 * 3600

JSON = "application/json"
TEXT = "text/plain"

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


_SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": {"type": "string", "description": "machine-readable kind"},
            "message": {"type": "string", "description": "a human sentence"},
        },
    },
    "Ids": {
        "type": "object",
        "required": ["ids"],
        "additionalProperties": False,
        "properties": {"ids": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    },
    "Job": {
        "type": "object",
        "required": [
            "id",
            "type",
            "state",
            "dt",
            "create_dt",
            "done_dt",
            "attempts",
            "code",
            "exitcode",
            "result",
            "payload",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "type": {"type": "string", "pattern": TYPE_PATTERN},
            "state": {"type": "string", "enum": ["waiting", "running", "done"]},
            "dt": {"type": "string", "format": "date-time"},
            "create_dt": {"type": "string", "format": "date-time"},
            "done_dt": _nullable({"type": "string", "format": "date-time"}),
            "attempts": {"type": "integer", "minimum": 0},
            "code": _nullable({"type": "string", "enum": ["ok", "failed", "retry", "error", None]}),
            "exitcode": _nullable({"type": "integer"}),
            "result": _nullable({"type": "string"}),
            "payload": {"type": "string"},
        },
    },
    "JobPage": {
        "type": "object",
        "required": ["jobs", "next"],
        "additionalProperties": False,
        "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "next": _nullable({"type": "string", "description": "cursor for ?after="}),
        },
    },
    "TypeStats": {
        "type": "object",
        "required": ["waiting", "scheduled", "running", "done_ok", "done_failed", "done_error"],
        "additionalProperties": False,
        "properties": {
            name: {"type": "integer", "minimum": 0}
            for name in ("waiting", "scheduled", "running", "done_ok", "done_failed", "done_error")
        },
    },
    "Stats": {
        "type": "object",
        "required": ["types"],
        "additionalProperties": False,
        "properties": {"types": {"type": "object", "additionalProperties": _ref("TypeStats")}},
    },
    "HandlerAdd": {
        "type": "object",
        "required": ["lang", "body"],
        "additionalProperties": False,
        "properties": {
            "lang": {"type": "string", "enum": list(LANGS)},
            "body": {"type": "string", "minLength": 1},
            "before": {"type": "string"},
            "beforeEach": {"type": "string"},
            "afterEach": {"type": "string"},
            "eid": {"type": "string", "pattern": OPTIONAL_TYPE_PATTERN},
            "timeout": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 3600},
            "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 100},
            "then": {"type": "string", "pattern": OPTIONAL_TYPE_PATTERN},
        },
    },
    "Handler": {
        "type": "object",
        "required": [
            "id",
            "type",
            "dt",
            "lang",
            "body",
            "before",
            "beforeEach",
            "afterEach",
            "eid",
            "then",
            "timeout",
            "maxAttempts",
        ],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "description": "version id"},
            "type": {"type": "string", "pattern": TYPE_PATTERN},
            "dt": {"type": "string", "format": "date-time"},
            "lang": {"type": "string", "enum": list(LANGS)},
            "body": {"type": "string"},
            "before": {"type": "string"},
            "beforeEach": {"type": "string"},
            "afterEach": {"type": "string"},
            "eid": {"type": "string"},
            "then": {"type": "string"},
            "timeout": {"type": "number"},
            "maxAttempts": {"type": "integer"},
        },
    },
    "Deleted": {
        "type": "object",
        "required": ["deleted"],
        "additionalProperties": False,
        "properties": {"deleted": {"type": "string", "pattern": TYPE_PATTERN}},
    },
    "Limits": {
        "type": "object",
        "description": "a tenant's limits; 0 means no limit for running, waiting, rate, handlers",
        "additionalProperties": False,
        "properties": {
            "running": {"type": "integer", "minimum": 0},
            "waiting": {"type": "integer", "minimum": 0},
            "rate": {"type": "number", "minimum": 0},
            "burst": {"type": "number", "minimum": 1},
            "payload": {"type": "integer", "minimum": 1},
            "result": {"type": "integer", "minimum": 0},
            "handlers": {"type": "integer", "minimum": 0},
        },
    },
    "TenantLimits": {
        "type": "object",
        "required": ["client", "overrides", "effective"],
        "additionalProperties": False,
        "properties": {
            "client": {"type": "string", "pattern": CLIENT_PATTERN},
            "overrides": _ref("Limits"),
            "effective": _ref("Limits"),
        },
    },
    "Tenants": {
        "type": "object",
        "required": ["tenants", "defaults"],
        "additionalProperties": False,
        "properties": {
            "tenants": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": [
                        "client",
                        "state",
                        "created_at",
                        "live_tokens",
                        "grace_until",
                        "limits",
                    ],
                    "properties": {
                        "client": {"type": "string", "pattern": CLIENT_PATTERN},
                        "state": {"type": "string", "enum": ["active", "revoked"]},
                        "created_at": {"type": "string"},
                        "live_tokens": {"type": "integer", "minimum": 0},
                        "grace_until": _nullable({"type": "string"}),
                        "limits": _ref("Limits"),
                    },
                },
            },
            "defaults": _ref("Limits"),
        },
    },
    "Overview": {
        "type": "object",
        "description": "what the dashboard shows: every tenant (operator) or one",
        "required": [
            "scope",
            "client",
            "sysid",
            "now",
            "step_s",
            "queues",
            "queues_cut",
            "running",
            "failures",
            "daemons",
        ],
        "additionalProperties": False,
        "properties": {
            "scope": {"type": "string", "enum": ["operator", "tenant"]},
            "client": _nullable({"type": "string", "pattern": CLIENT_PATTERN}),
            "sysid": {"type": "string", "description": "the daemon that answered"},
            "now": {"type": "string", "format": "date-time"},
            "step_s": {"type": "number", "description": "seconds between throughput points"},
            "queues": {
                "type": "array",
                "maxItems": 1000,
                "items": {
                    "type": "object",
                    "required": [
                        "client",
                        "type",
                        "waiting",
                        "scheduled",
                        "running",
                        "done_ok",
                        "done_failed",
                        "done_error",
                        "capped",
                        "per_s",
                        "throughput",
                    ],
                    "additionalProperties": False,
                    "properties": {
                        "client": {"type": "string", "pattern": CLIENT_PATTERN},
                        "type": {"type": "string"},
                        **{
                            name: {"type": "integer", "minimum": 0}
                            for name in (
                                "waiting",
                                "scheduled",
                                "running",
                                "done_ok",
                                "done_failed",
                                "done_error",
                            )
                        },
                        "capped": {
                            "type": "boolean",
                            "description": "waiting or scheduled is at the 10,000 counted",
                        },
                        "per_s": _nullable(
                            {
                                "type": "number",
                                "minimum": 0,
                                "description": "jobs/s archived over about the last minute",
                            }
                        ),
                        "throughput": {
                            "type": "array",
                            "description": "jobs/s archived per step_s, oldest first",
                            "items": {"type": "number", "minimum": 0},
                        },
                    },
                },
            },
            "queues_cut": {"type": "boolean", "description": "more types than listed"},
            "running": {
                "type": "object",
                "required": ["total", "oldest"],
                "additionalProperties": False,
                "properties": {
                    "total": {"type": "integer", "minimum": 0},
                    "oldest": {
                        "type": "array",
                        "maxItems": 500,
                        "items": {
                            "type": "object",
                            "required": [
                                "id",
                                "client",
                                "type",
                                "sysid",
                                "attempts",
                                "create_dt",
                                "age_s",
                                "lease_until",
                            ],
                            "additionalProperties": False,
                            "properties": {
                                "id": {"type": "string"},
                                "client": {"type": "string", "pattern": CLIENT_PATTERN},
                                "type": {"type": "string"},
                                "sysid": {"type": "string"},
                                "attempts": {"type": "integer", "minimum": 0},
                                "create_dt": {"type": "string", "format": "date-time"},
                                "age_s": {"type": "number", "minimum": 0},
                                "lease_until": {"type": "string", "format": "date-time"},
                            },
                        },
                    },
                },
            },
            "failures": {
                "type": "array",
                "maxItems": 500,
                "items": {
                    "type": "object",
                    "required": [
                        "id",
                        "client",
                        "type",
                        "code",
                        "exitcode",
                        "attempts",
                        "create_dt",
                        "done_dt",
                        "result",
                        "result_cut",
                    ],
                    "additionalProperties": False,
                    "properties": {
                        "id": {"type": "string"},
                        "client": {"type": "string", "pattern": CLIENT_PATTERN},
                        "type": {"type": "string"},
                        "code": {"type": "string", "enum": ["failed", "error"]},
                        "exitcode": _nullable({"type": "integer"}),
                        "attempts": {"type": "integer", "minimum": 0},
                        "create_dt": {"type": "string", "format": "date-time"},
                        "done_dt": {"type": "string", "format": "date-time"},
                        "result": _nullable(
                            {"type": "string", "description": "at most 500 characters"}
                        ),
                        "result_cut": {"type": "boolean"},
                    },
                },
            },
            "daemons": {
                "type": "array",
                "maxItems": 100,
                "items": {
                    "type": "object",
                    "required": ["sysid", "state", "expires", "expires_in_s", "released_at"],
                    "additionalProperties": False,
                    "properties": {
                        "sysid": {"type": "string"},
                        "state": {"type": "string", "enum": ["live", "expired", "released"]},
                        "expires": _nullable({"type": "string", "format": "date-time"}),
                        "expires_in_s": _nullable({"type": "number"}),
                        "released_at": _nullable({"type": "string", "format": "date-time"}),
                        "host": _nullable({"type": "string", "description": "operator only"}),
                        "data_dir": _nullable({"type": "string", "description": "operator only"}),
                    },
                },
            },
        },
    },
    "Health": {
        "type": "object",
        "required": ["sysid", "store", "journal", "ingest_lag", "ingested"],
        "properties": {
            "status": {"type": "string", "enum": ["ok"]},
            "sysid": {"type": "string"},
            "store": {"type": "string", "enum": ["ok", "unreachable"]},
            "journal": {"type": "string", "enum": ["ok", "failed"]},
            "ingest_lag": {
                "type": "object",
                "required": ["lines", "bytes", "oldest_ms"],
                "properties": {
                    "lines": {"type": "integer", "minimum": 0},
                    "bytes": {"type": "integer", "minimum": 0},
                    "oldest_ms": _nullable({"type": "integer", "minimum": 0}),
                },
            },
            "ingested": {"type": "integer", "minimum": 0},
            "error": {"type": "string", "enum": ["unavailable"]},
            "message": {"type": "string"},
        },
    },
    "Check": {
        "type": "object",
        "required": ["ok"],
        "properties": {
            "ok": {"type": "boolean"},
            "reason": {"type": "string", "description": "why the check failed"},
        },
    },
    "Readiness": {
        "type": "object",
        "required": ["sysid", "checks"],
        "properties": {
            "status": {"type": "string", "enum": ["ok"]},
            "error": {"type": "string", "enum": ["unavailable"]},
            "message": {"type": "string", "description": "every failed check's reason"},
            "sysid": {"type": "string"},
            "checks": {
                "type": "object",
                "required": ["store", "journal", "ingest_lag", "sysid"],
                "additionalProperties": _ref("Check"),
            },
        },
    },
}


def _error(description: str, kinds: list[str], *, retry_after: bool = False) -> Schema:
    schema: Schema = {
        "allOf": [
            _ref("Error"),
            {"type": "object", "properties": {"error": {"type": "string", "enum": kinds}}},
        ]
    }
    response: Schema = {"description": description, "content": {JSON: {"schema": schema}}}
    if retry_after:
        response["headers"] = {
            "Retry-After": {"description": "seconds", "schema": {"type": "string"}}
        }
    return response


_RESPONSES: dict[str, Schema] = {
    "BadName": _error("a client or type name breaks the naming rules", ["bad_name"]),
    "BadRequest": _error("a name or query parameter is not valid", ["bad_name", "bad_request"]),
    "BadPayload": _error(
        "a bad name, payload (empty line, invalid UTF-8, bad JSON) or query parameter",
        ["bad_name", "bad_payload", "bad_request"],
    ),
    "BadHandler": _error(
        "a bad name, or a handler that cannot be stored", ["bad_name", "bad_handler"]
    ),
    "Unauthorized": {
        **_error("missing or invalid bearer token", ["unauthorized"]),
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
    },
    "Forbidden": _error(
        "the token belongs to another client (or is not an operator token)", ["forbidden"]
    ),
    "NotFound": _error("no such job or handler (of this client)", ["not_found"]),
    "MethodNotAllowed": _error("the route has no such method", ["method_not_allowed"]),
    "Conflict": _error("only a waiting job can be cancelled", ["conflict"]),
    "HandlerLimit": _error("the tenant has its limit of handlers", ["conflict"]),
    "BadLimits": _error("a bad name, or limits that are not valid", ["bad_name", "bad_request"]),
    "TooLarge": _error("a payload, handler source or body over its limit", ["too_large"]),
    "Timeout": _error(
        "the body did not arrive within the client timeout (the connection is closed)",
        ["timeout"],
    ),
    "RateLimited": _error(
        "over the tenant's add rate or waiting limit; retry after Retry-After",
        ["rate_limited"],
        retry_after=True,
    ),
    "Unavailable": _error(
        "the store or the journal cannot be reached; nothing was done",
        ["unavailable"],
        retry_after=True,
    ),
}


def _resp(name: str) -> Schema:
    return {"$ref": f"#/components/responses/{name}"}


def _ok(description: str, schema_name: str) -> Schema:
    return {"description": description, "content": {JSON: {"schema": _ref(schema_name)}}}


def _param(name: str, where: str, schema: Schema, description: str, **extra: Any) -> Schema:
    return {"name": name, "in": where, "schema": schema, "description": description, **extra}


_CLIENT = _param(
    "client",
    "path",
    {"type": "string", "pattern": CLIENT_PATTERN},
    "tenant id",
    required=True,
)
_TYPE = _param(
    "type", "path", {"type": "string", "pattern": TYPE_PATTERN}, "jobtype", required=True
)
_ID = _param("id", "path", {"type": "string", "minLength": 1}, "job id", required=True)


_OVERVIEW_LIMIT = _param(
    "limit",
    "query",
    {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
    "running jobs and failures listed at most",
)


def _tenant_op(
    op_id: str, summary: str, ok: Schema, errors: dict[str, str], **extra: Any
) -> Schema:
    responses: dict[str, Any] = {"200": ok}
    common = {"401": "Unauthorized", "403": "Forbidden", "503": "Unavailable"}
    for status, name in sorted({**common, **errors}.items()):
        responses[status] = _resp(name)
    return {
        "operationId": op_id,
        "summary": summary,
        "security": [{"bearer": []}],
        "responses": responses,
        **extra,
    }


def _paths() -> dict[str, Any]:
    job_errors = {"400": "BadName", "404": "NotFound"}
    return {
        "/{client}/job/{type}/add": {
            "parameters": [_CLIENT, _TYPE],
            "post": _tenant_op(
                "addJobs",
                "Add jobs: one payload per line, or a JSON array of payloads",
                _ok("the new jobs' ids, in order, once durably journalled", "Ids"),
                {"400": "BadPayload", "408": "Timeout", "413": "TooLarge", "429": "RateLimited"},
                parameters=[
                    _param(
                        "delay",
                        "query",
                        {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S},
                        "seconds before the jobs are eligible (not with dt)",
                    ),
                    _param(
                        "dt",
                        "query",
                        {"type": "string"},
                        "ISO-8601 time or epoch milliseconds when the jobs are eligible"
                        " (not with delay; at most ten years ahead)",
                    ),
                ],
                requestBody={
                    "required": True,
                    "content": {
                        TEXT: {
                            "schema": {"type": "string", "minLength": 1},
                            "example": "first payload\nsecond|payload\n",
                        },
                        JSON: {
                            "schema": {"type": "array", "minItems": 1, "items": {}},
                            "example": [{"w": 100}, {"w": 200}],
                        },
                    },
                },
            ),
        },
        "/{client}/job/{id}": {
            "parameters": [_CLIENT, _ID],
            "get": _tenant_op("getJob", "A job of this client", _ok("the job", "Job"), job_errors),
        },
        "/{client}/job/{id}/cancel": {
            "parameters": [_CLIENT, _ID],
            "post": _tenant_op(
                "cancelJob",
                "Cancel a waiting job (done, code failed, exitcode 499)",
                _ok("the cancelled job", "Job"),
                {**job_errors, "409": "Conflict"},
            ),
        },
        "/{client}/jobs": {
            "parameters": [_CLIENT],
            "get": _tenant_op(
                "listJobs",
                "A page of the client's jobs, newest first",
                _ok("the page and the cursor of the next one (null at the end)", "JobPage"),
                {"400": "BadRequest"},
                parameters=[
                    _param("type", "query", {"type": "string", "pattern": TYPE_PATTERN}, "jobtype"),
                    _param(
                        "state",
                        "query",
                        {"type": "string", "enum": ["waiting", "running", "done"]},
                        "job state",
                    ),
                    _param(
                        "limit",
                        "query",
                        {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                        "page size",
                    ),
                    _param("after", "query", {"type": "string"}, "the previous page's next"),
                ],
            ),
        },
        "/{client}/stats": {
            "parameters": [_CLIENT],
            "get": _tenant_op(
                "stats",
                "Job counts for each of the client's types",
                _ok("counts", "Stats"),
                {"400": "BadName"},
            ),
        },
        "/{client}/handler/add/{type}": {
            "parameters": [_CLIENT, _TYPE],
            "post": _tenant_op(
                "addHandler",
                "Add (or replace) the handler of a jobtype",
                _ok("the stored handler, with its version id", "Handler"),
                {"400": "BadHandler", "408": "Timeout", "409": "HandlerLimit", "413": "TooLarge"},
                parameters=[
                    _param(
                        "lang",
                        "query",
                        {"type": "string", "enum": list(LANGS)},
                        "the language of a text/plain body",
                    )
                ],
                requestBody={
                    "required": True,
                    "content": {
                        JSON: {"schema": _ref("HandlerAdd")},
                        TEXT: {
                            "schema": {"type": "string", "minLength": 1},
                            "example": "wc -c",
                        },
                    },
                },
            ),
        },
        "/{client}/handler/del/{type}": {
            "parameters": [_CLIENT, _TYPE],
            "post": _tenant_op(
                "deleteHandler",
                "Delete the handler of a jobtype",
                _ok("the type whose handler was deleted", "Deleted"),
                {"400": "BadName", "404": "NotFound"},
            ),
        },
        "/{client}/handler/get/{type}": {
            "parameters": [_CLIENT, _TYPE],
            "get": _tenant_op(
                "getHandler",
                "The handler of a jobtype",
                _ok("the stored handler", "Handler"),
                {"400": "BadName", "404": "NotFound"},
            ),
        },
        "/admin/tenants": {
            "get": _tenant_op(
                "adminTenants",
                "Every tenant, with its limit overrides, and the daemon's default limits"
                " (operator token)",
                _ok("the tenants", "Tenants"),
                {},
            ),
        },
        "/admin/tenants/{client}/limits": {
            "parameters": [_CLIENT],
            "get": _tenant_op(
                "adminGetLimits",
                "A tenant's limit overrides and effective limits (operator token)",
                _ok("the limits", "TenantLimits"),
                {"400": "BadName", "404": "NotFound"},
            ),
            "post": _tenant_op(
                "adminSetLimits",
                "Replace a tenant's limit overrides; a key set to null follows the default"
                " (operator token)",
                _ok("the limits now", "TenantLimits"),
                {"400": "BadLimits", "404": "NotFound", "408": "Timeout", "413": "TooLarge"},
                requestBody={
                    "required": True,
                    "content": {
                        JSON: {
                            "schema": {"type": "object"},
                            "example": {"waiting": 10000, "rate": 50},
                        }
                    },
                },
            ),
        },
        "/": {
            "get": {
                "operationId": "dashboard",
                "summary": "The dashboard page; it asks for a token and polls the overview routes",
                "security": [],
                "responses": {
                    "200": {
                        "description": "one self-contained HTML page",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/admin/overview": {
            "get": _tenant_op(
                "adminOverview",
                "Every tenant's queues, running jobs, recent failures and the daemons"
                " (operator token)",
                _ok("the overview", "Overview"),
                {"400": "BadRequest"},
                parameters=[_OVERVIEW_LIMIT],
            ),
        },
        "/{client}/overview": {
            "parameters": [_CLIENT],
            "get": _tenant_op(
                "overview",
                "The client's queues, running jobs and recent failures, and the daemons",
                _ok("the overview", "Overview"),
                {"400": "BadRequest"},
                parameters=[_OVERVIEW_LIMIT],
            ),
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Whether the daemon can reach its store and journal",
                "security": [],
                "responses": {
                    "200": _ok("healthy", "Health"),
                    "503": _ok("the store or the journal is not reachable", "Health"),
                },
            }
        },
        "/livez": {
            "get": {
                "operationId": "livez",
                "summary": "Liveness: 200 while the daemon serves, with its store, journal"
                " and ingest lag",
                "security": [],
                "responses": {"200": _ok("the daemon serves", "Health")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: store reachable, journal writable, ingest lag under"
                " --ready-lag, sysid lease held",
                "security": [],
                "responses": {
                    "200": _ok("ready", "Readiness"),
                    "503": _ok("not ready; each failed check has a reason", "Readiness"),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus text exposition of the daemon's metrics (operator token)",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {
                        "description": "the metrics",
                        "content": {TEXT: {"schema": {"type": "string"}}},
                    },
                    "401": _resp("Unauthorized"),
                    "403": _resp("Forbidden"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": {
                    "200": {
                        "description": "the OpenAPI 3 document",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }


def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of the daemon's HTTP API (a new dict each call)."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "queue-daemon",
            "version": "1",
            "description": "Multi-tenant job queue daemon; the contract is docs/api.md.",
        },
        "paths": _paths(),
        "components": {
            "schemas": _SCHEMAS,
            "responses": _RESPONSES,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


@functools.cache
def document_bytes() -> bytes:
    """``document()`` serialized once, as served."""
    return orjson.dumps(document())


async def serve(request: web.Request) -> web.Response:
    """``GET /openapi.json``: no authentication."""
    return web.Response(body=document_bytes(), content_type="application/json")
