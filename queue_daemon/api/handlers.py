"""The handler routes of docs/api.md: add (JSON, or source text with ``?lang=``), del, get."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from queue_daemon.api import errors
from queue_daemon.api.auth import authorize
from queue_daemon.api.blobs import blob_read
from queue_daemon.api.handler_fields import bad_handler, handler_body, parse_handler
from queue_daemon.api.web import SERVICES, jobtype_of, json_response, read_body
from queue_daemon.domain.names import JobType
from queue_daemon.engine.handlers import PULLED_LANG
from queue_daemon.runners.check import check_handler
from queue_daemon.store.errors import LimitReached, NotFound


async def add_handler(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    jobtype = jobtype_of(request)
    settings = services.settings
    if request.content_type == "application/json":
        body = await read_body(request, client, settings.body_limit)
        try:
            fields = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_handler(f"body is not valid JSON: {exc}") from None
    else:
        # the body is the source itself: no more than one source's limit is read
        body = await read_body(request, client, settings.handler_limit)
        try:
            source = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise bad_handler(f"body is not valid UTF-8 at byte {exc.start}") from None
        fields = {"lang": request.query.get("lang", ""), "body": source}
    data = parse_handler(fields, handler_limit=settings.handler_limit)
    if "module" in data:
        async with blob_read():  # the blob and its compile, a few at a time
            blob = await services.blobs.read_blob(client, str(data["module"]))
            if blob is None:
                raise bad_handler(f"this tenant has no blob {data['module']}")
            from queue_daemon.runners.modules import check_module  # wasmtime when used

            problem = await asyncio.to_thread(check_module, blob)
    elif data["lang"] == PULLED_LANG:
        problem = None
    else:
        problem = await asyncio.to_thread(
            check_handler,
            str(data["lang"]),
            str(data["body"]),
            before=str(data["before"]),
            before_each=str(data["beforeEach"]),
            after_each=str(data["afterEach"]),
        )
    if problem is not None:
        raise bad_handler(problem)
    max_handlers = services.limits.of(client).handlers
    try:
        record = await services.handler_store.put_handler(
            JobType(client, jobtype).stored, data, max_handlers=max_handlers or None
        )
    except LimitReached:
        raise errors.conflict(
            f"this tenant has its limit of {max_handlers} handlers; delete one first"
        ) from None
    except NotFound:  # its module's blob was deleted meanwhile
        raise bad_handler(f"this tenant has no blob {data['module']}") from None
    services.handlers.invalidate(record.type)
    return json_response(handler_body(record))


async def get_handler(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    try:
        stored = JobType(client, jobtype_of(request)).stored
        record = await services.handler_store.get_handler(stored)
    except NotFound:
        raise errors.not_found("no handler for this type") from None
    return json_response(handler_body(record))


async def delete_handler(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    client = await authorize(request, services)
    jobtype = jobtype_of(request)
    try:
        await services.handler_store.delete_handler(JobType(client, jobtype).stored)
    except NotFound:
        raise errors.not_found("no handler for this type") from None
    services.handlers.invalidate(JobType(client, jobtype).stored)
    return json_response({"deleted": jobtype})
