"""Validation of the names docs/api.md fixes: clients and jobtypes."""

from __future__ import annotations

import re

CLIENT_RE = re.compile(r"[a-z0-9_]{1,40}")
TYPE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,100}")
SYSID_RE = re.compile(r"[a-z0-9_]{1,32}")


def valid_client(name: str) -> bool:
    return CLIENT_RE.fullmatch(name) is not None


def valid_type(name: str) -> bool:
    return TYPE_RE.fullmatch(name) is not None


def valid_sysid(name: str) -> bool:
    return SYSID_RE.fullmatch(name) is not None
