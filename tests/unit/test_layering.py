"""The package boundaries of docs/architecture.md, checked on the source: who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["journal", "store", "scheduler", "runners", "queue_daemon"]

# package -> module prefixes it must never import
FORBIDDEN = {
    "journal": ["aiohttp", "asyncpg", "store", "queue_daemon", "runners", "scheduler"],
    "store": ["aiohttp", "journal", "queue_daemon", "runners", "scheduler", "subprocess"],
    "scheduler": [
        "aiohttp",
        "asyncpg",
        "aiofiles",
        "asyncio",
        "socket",
        "subprocess",
        "journal",
        "store",
        "runners",
        "queue_daemon",
    ],
    "runners": ["asyncpg", "aiohttp.web", "store", "queue_daemon"],
    "queue_daemon": ["asyncpg"],
}
# the exceptions, each with its reason
ALLOWED = {
    # the embedded server's control runs the server's own binaries (initdb, pg_ctl)
    # as its unprivileged user; the rest of the store speaks SQL only
    ("store/embedded.py", "subprocess"),
}
# only the daemon exposes metrics: the other parts expose plain numbers it reads
for _package in ("journal", "store", "scheduler", "runners"):
    FORBIDDEN[_package].append("prometheus_client")


def imports_of(package: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((str(path.relative_to(ROOT)), node.module))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_respect_boundaries(package: str) -> None:
    bad = [
        (where, name)
        for where, name in imports_of(package)
        for prefix in FORBIDDEN[package]
        if (name == prefix or name.startswith(prefix + ".")) and (where, name) not in ALLOWED
    ]
    assert bad == []


def test_sql_lives_in_store_only() -> None:
    keywords = ("SELECT ", "INSERT INTO", "UPDATE jobs", "DELETE FROM", "CREATE TABLE")
    offenders = []
    for package in PACKAGES:
        if package == "store":
            continue
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            offenders += [(str(path), k) for k in keywords if k in text]
    assert offenders == []
