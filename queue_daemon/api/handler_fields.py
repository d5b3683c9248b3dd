"""Handlers as the API speaks of them: validation of an added handler and the
stored form shown back to its tenant."""

from __future__ import annotations

import math
from typing import Any

from queue_daemon.api import errors
from queue_daemon.api.blobs import ADDR_RE
from queue_daemon.domain.names import JobType, iso, valid_type
from queue_daemon.domain.tenants import HandlerRecord
from queue_daemon.engine.admit.limits import MAX_LIMIT
from queue_daemon.engine.handlers import PULLED_LANG
from queue_daemon.runners.models import LANGS
from queue_daemon.settings import DEFAULTS

MAX_TIMEOUT_S = 3600.0
MAX_ATTEMPTS = 100
MAX_KEY_CONCURRENCY = 10_000  # jobs of one key running at once
_TEXT_FIELDS = ("body", "before", "beforeEach", "afterEach")
_WASM_FIELDS = ("module", "memory")
MIN_MEMORY = 1 << 16  # one WebAssembly page
PULLED_LEASE = 60  # the default lease of a claim of a pulled type, seconds


def bad_handler(message: str) -> errors.ApiError:
    return errors.ApiError(400, "bad_handler", message)


def _source(fields: dict[str, Any], name: str, limit: int) -> str:
    value = fields.get(name, "")
    if not isinstance(value, str):
        raise bad_handler(f"{name} must be a string")
    if "\x00" in value:
        raise bad_handler(f"{name} contains a NUL character")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise errors.too_large(f"{name} is over {limit} bytes")
    return value


def parse_handler(fields: Any, *, handler_limit: int = DEFAULTS.handler_limit) -> dict[str, object]:
    """The stored ``data`` of a handler from the fields a tenant sent, or ApiError."""
    if not isinstance(fields, dict):
        raise bad_handler("a JSON handler must be an object")
    known = {
        *_TEXT_FIELDS,
        "lang",
        "eid",
        "timeout",
        "then",
        "maxAttempts",
        "keyConcurrency",
        *_WASM_FIELDS,
    }
    unknown = set(fields) - known
    if unknown:
        raise bad_handler(f"unknown fields: {', '.join(sorted(unknown))}")
    lang = fields.get("lang")
    if lang not in (*LANGS, PULLED_LANG):
        raise bad_handler(f"lang must be one of {', '.join((*LANGS, PULLED_LANG))}")
    data: dict[str, object] = {"lang": lang}
    for name in _TEXT_FIELDS:
        data[name] = _source(fields, name, handler_limit)
    if lang == PULLED_LANG:
        # no code: the tenant's own workers claim the type's jobs
        if any(data[n] for n in _TEXT_FIELDS):
            raise bad_handler(
                f"a {PULLED_LANG} handler has no body, before, beforeEach or afterEach:"
                " the tenant's workers run its jobs"
            )
    elif lang == "wasm":
        data.update(_wasm(fields, data))
    elif not str(data["body"]).strip():
        raise bad_handler("body is required")
    if lang not in ("python", "node") and any(
        data[n] for n in ("before", "beforeEach", "afterEach")
    ):
        raise bad_handler(f"before, beforeEach and afterEach apply to python and node, not {lang}")
    if lang != "wasm" and any(name in fields for name in _WASM_FIELDS):
        raise bad_handler(f"module and memory apply to wasm, not {lang}")
    eid = fields.get("eid", "")
    if not isinstance(eid, str) or (eid and not valid_type(eid)):
        raise bad_handler("eid must match [A-Za-z0-9_.:-]{1,100}")
    data["eid"] = eid
    then = fields.get("then", "")
    if not isinstance(then, str) or (then and not valid_type(then)):
        raise bad_handler("then must be a type name, [A-Za-z0-9_.:-]{1,100}")
    data["then"] = then
    # a pulled type's timeout is the lease of a claim
    timeout = fields.get("timeout", PULLED_LEASE if lang == PULLED_LANG else 30)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT_S
    ):
        raise bad_handler(
            f"timeout must be a number of seconds, above 0 and at most {MAX_TIMEOUT_S:g}"
        )
    data["timeout"] = timeout
    data["maxAttempts"] = _count(fields, "maxAttempts", 5, MAX_ATTEMPTS)
    # absent: keys cap nothing (docs/api.md, "Concurrency keys")
    cap = _count(fields, "keyConcurrency", None, MAX_KEY_CONCURRENCY)
    if cap is not None:
        data["keyConcurrency"] = cap
    return data


def _count(fields: dict[str, Any], name: str, default: int | None, most: int) -> int | None:
    """The integer field ``name``, 1 to ``most``, or ``default`` when absent."""
    if name not in fields or (default is None and fields[name] is None):
        return default
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise bad_handler(f"{name} must be an integer from 1 to {most}")
    return value


def _wasm(fields: dict[str, Any], data: dict[str, object]) -> dict[str, object]:
    """A wasm handler's module (its body, or a blob's address) and memory cap."""
    extra: dict[str, object] = {}
    module = fields.get("module")
    if module is not None:
        if not isinstance(module, str) or ADDR_RE.fullmatch(module) is None:
            raise bad_handler("module must be a blob address, sha256: and 64 lowercase hex digits")
        if str(data["body"]).strip():
            raise bad_handler("a wasm handler has a body or a module, not both")
        extra["module"] = module
    elif not str(data["body"]).strip():
        raise bad_handler("a wasm handler needs a body (the module) or a module (a blob's address)")
    memory = fields.get("memory")
    if memory is not None:
        if isinstance(memory, bool) or not isinstance(memory, int) or not memory >= MIN_MEMORY:
            raise bad_handler(f"memory must be a whole number of bytes, at least {MIN_MEMORY}")
        extra["memory"] = min(memory, MAX_LIMIT)
    return extra


def handler_body(record: HandlerRecord) -> dict[str, object]:
    """A stored handler as the API shows it to its tenant."""
    return {
        "id": record.id,
        "type": JobType.parse(record.type).name,
        "dt": iso(record.dt),
        **record.data,
    }
