"""Validation of an added handler's fields (before any code is checked or stored)."""

from __future__ import annotations

from typing import Any

import pytest

from queue_daemon.api.errors import ApiError
from queue_daemon.api.handler_fields import parse_handler


def test_minimal_and_full_handlers() -> None:
    assert parse_handler({"lang": "python", "body": "def handler(p, ctx): pass"}) == {
        "lang": "python",
        "body": "def handler(p, ctx): pass",
        "before": "",
        "beforeEach": "",
        "afterEach": "",
        "eid": "",
        "then": "",
        "timeout": 30,
        "maxAttempts": 5,
    }
    full = {
        "lang": "node",
        "body": "module.exports = () => 1",
        "before": "x=1",
        "beforeEach": "y=1",
        "afterEach": "z=1",
        "eid": "shared",
        "timeout": 2.5,
        "then": "next.step",
        "maxAttempts": 9,
    }
    assert parse_handler(full) == full


@pytest.mark.parametrize(
    "fields",
    [
        [],
        {"body": "x"},
        {"lang": "cobol", "body": "x"},
        {"lang": "python"},
        {"lang": "python", "body": "   "},
        {"lang": "python", "body": 3},
        {"lang": "python", "body": "x", "timeout": 0},
        {"lang": "python", "body": "x", "timeout": -1},
        {"lang": "python", "body": "x", "timeout": "5"},
        {"lang": "python", "body": "x", "timeout": True},
        {"lang": "python", "body": "x", "timeout": 100000},
        {"lang": "python", "body": "x", "then": "a|b"},
        {"lang": "python", "body": "x", "eid": "a b"},
        {"lang": "python", "body": "x", "maxAttempts": 0},
        {"lang": "python", "body": "x", "maxAttempts": 2.5},
        {"lang": "python", "body": "x\x00"},
        {"lang": "python", "body": "x", "colour": "red"},
        {"lang": "shell", "body": "cat", "before": "echo hi"},
    ],
)
def test_bad_handlers_are_rejected(fields: Any) -> None:
    with pytest.raises(ApiError) as info:
        parse_handler(fields)
    assert (info.value.status, info.value.kind) == (400, "bad_handler")


def test_huge_source_is_too_large() -> None:
    with pytest.raises(ApiError) as info:
        parse_handler({"lang": "python", "body": "#" * (2 << 20)})
    assert info.value.status == 413


@pytest.mark.parametrize("field", ["before", "beforeEach", "afterEach", "then", "eid"])
@pytest.mark.parametrize("value", [1, 2.5, True, None, ["x"], {"a": "b"}])
def test_fields_of_the_wrong_type_are_bad_handler(field: str, value: Any) -> None:
    with pytest.raises(ApiError) as info:
        parse_handler({"lang": "python", "body": "def handler(p, ctx): pass", field: value})
    assert (info.value.status, info.value.kind) == (400, "bad_handler")


@pytest.mark.parametrize("field", ["timeout", "maxAttempts"])
@pytest.mark.parametrize("value", [None, "5", [5], {"n": 5}, float("nan"), float("inf")])
def test_numbers_of_the_wrong_type_are_bad_handler(field: str, value: Any) -> None:
    with pytest.raises(ApiError) as info:
        parse_handler({"lang": "python", "body": "def handler(p, ctx): pass", field: value})
    assert (info.value.status, info.value.kind) == (400, "bad_handler")


def test_the_source_limit_is_per_field_and_in_bytes() -> None:
    fields = {"lang": "python", "body": "#" + "é" * 50, "before": "x" * 102}  # 101, 102 bytes
    with pytest.raises(ApiError) as info:
        parse_handler(fields, handler_limit=101)
    assert (info.value.status, info.value.kind, info.value.message) == (
        413,
        "too_large",
        "before is over 101 bytes",
    )
    assert parse_handler({**fields, "before": "x" * 101}, handler_limit=102)["before"] == "x" * 101
    with pytest.raises(ApiError):
        parse_handler({"lang": "python", "body": "#" + "é" * 51}, handler_limit=102)
