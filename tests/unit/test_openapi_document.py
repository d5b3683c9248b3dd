"""``openapi.json`` loads, matches the code, and every route of the table has its
operation (and the reverse): the document cannot drift from what is served."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from queue_daemon.api.openapi import DocumentError, check, document
from queue_daemon.runners.models import LANGS

ROOT = Path(__file__).resolve().parents[2]
ROUTE = re.compile(r'router\.add_(get|post)\("([^"]+)"')


def test_the_document_loads_and_passes_its_checks() -> None:
    doc = document()
    check(doc)
    assert doc["openapi"].startswith("3.")
    assert document() is not doc  # a new dict each call: callers may change theirs


def test_every_route_has_an_operation_and_every_operation_a_route() -> None:
    table = (ROOT / "queue_daemon" / "api" / "routes.py").read_text()
    routes = {(method.upper(), path) for method, path in ROUTE.findall(table)}
    operations = {
        (method.upper(), path)
        for path, item in document()["paths"].items()
        for method in item
        if method in ("get", "post")
    }
    assert routes and operations == routes


def _lang_property(doc: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = doc["components"]["schemas"]["HandlerAdd"]["properties"]["lang"]
    return schema


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d.update(openapi="2.0"), "OpenAPI 3"),
        (lambda d: _lang_property(d)["enum"].append("ruby"), "handler languages"),
        (lambda d: _lang_property(d)["enum"].remove(LANGS[0]), "handler languages"),
        (
            lambda d: d["components"]["schemas"].pop("Job"),
            "does not resolve",
        ),
    ],
)
def test_a_document_that_drifted_from_the_code_is_refused(change: Any, why: str) -> None:
    doc = copy.deepcopy(document())
    change(doc)
    with pytest.raises(DocumentError, match=why):
        check(doc)
