"""``GET /openapi.json``: the OpenAPI 3 document of every route, kept as data.

The document is ``openapi.json`` beside this module, written by hand like the
docs it mirrors (docs/api.md): a data file reads as the contract it is, diffs
line by line in review, and needs no code to build. It is loaded once and
checked as it loads, so a document that drifted from the code fails the
daemon's start and the tests rather than misleading a client: it must be
OpenAPI 3, every ``$ref`` must resolve, and every list of handler languages in
it must be the runners' own (``queue_daemon.runners.models.LANGS``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

from queue_daemon.runners.models import LANGS


class DocumentError(ValueError):
    """``openapi.json`` does not match the code."""


def _walk(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair in the document, depth first."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield name, value
            yield from _walk(value, name)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, key)


def _lang_enums(doc: dict[str, Any]) -> list[list[str]]:
    """The enums of every ``lang``: a body property or a query parameter."""
    enums = []
    for name, value in _walk(doc):
        if name == "lang" and isinstance(value, dict) and "enum" in value:
            enums.append(value["enum"])
        elif isinstance(value, dict) and value.get("name") == "lang" and "schema" in value:
            enums.append(value["schema"]["enum"])
    return enums


def check(doc: dict[str, Any]) -> None:
    """Raise DocumentError where ``doc`` does not match the code."""
    if not str(doc.get("openapi", "")).startswith("3."):
        raise DocumentError("not an OpenAPI 3 document")
    if not isinstance(doc.get("paths"), dict) or not doc["paths"]:
        raise DocumentError("the document has no paths")
    components = doc.get("components", {})
    for name, ref in _walk(doc):
        if name != "$ref":
            continue
        section, _, target = str(ref).removeprefix("#/components/").partition("/")
        if target not in components.get(section, {}):
            raise DocumentError(f"{ref} does not resolve")
    enums = _lang_enums(doc)
    if not enums or any(enum != list(LANGS) for enum in enums):
        raise DocumentError(f"handler languages {enums} are not the runners' {list(LANGS)}")


@functools.cache
def document_bytes() -> bytes:
    """The document as served: ``openapi.json`` loaded and checked once."""
    raw = resources.files("queue_daemon.api").joinpath("openapi.json").read_bytes()
    doc = orjson.loads(raw)
    check(doc)
    return orjson.dumps(doc)


def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of the daemon's HTTP API (a new dict each call)."""
    parsed: dict[str, Any] = orjson.loads(document_bytes())
    return parsed


async def serve(request: web.Request) -> web.Response:
    """``GET /openapi.json``: no authentication."""
    return web.Response(body=document_bytes(), content_type="application/json")
