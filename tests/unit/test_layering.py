"""The package boundaries of docs/architecture.md, checked on the source: who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["journal", "store", "scheduler", "runners", "queue_daemon"]

# the rooms that live in folders of their own, linked into queue_daemon/
LINKED = ["journal", "store", "scheduler", "runners"]
# package -> module prefixes it must never import
FORBIDDEN = {
    "journal": ["aiohttp", "asyncpg", "queue_daemon"],
    "store": ["aiohttp", "queue_daemon", "subprocess"],
    "scheduler": [
        "aiohttp",
        "asyncpg",
        "aiofiles",
        "asyncio",
        "socket",
        "subprocess",
        "queue_daemon",
    ],
    "runners": ["asyncpg", "aiohttp.web", "queue_daemon"],
    "queue_daemon": ["asyncpg"],
}
# package -> the parts of queue_daemon it may import all the same (its own modules)
# and the domain leaf, which every room may import
OWN = {package: [f"queue_daemon.{package}", "queue_daemon.domain"] for package in LINKED}
# the exceptions, each with its reason
ALLOWED = {
    # the embedded server's control runs the server's own binaries (initdb, pg_ctl)
    # as its unprivileged user; the rest of the store speaks SQL only
    ("store/embedded.py", "subprocess"),
}
# only the daemon exposes metrics: the other parts expose plain numbers it reads
for _package in ("journal", "store", "scheduler", "runners"):
    FORBIDDEN[_package].append("prometheus_client")


def sources_of(package: str) -> list[Path]:
    """The package's own files (queue_daemon's without the linked rooms), or the
    one module ``package`` names."""
    base = ROOT / package
    if base.is_file():
        return [base]
    return sorted(
        path
        for path in base.rglob("*.py")
        if not any((base / part).is_symlink() for part in path.relative_to(base).parts[:1])
    )


def imports_of(package: str) -> list[tuple[str, str]]:
    found = []
    for path in sources_of(package):
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
        if (name == prefix or name.startswith(prefix + "."))
        and (where, name) not in ALLOWED
        and not any(name == own or name.startswith(own + ".") for own in OWN.get(package, []))
    ]
    assert bad == []


@pytest.mark.parametrize("package", [*PACKAGES, "bench", "tests"])
def test_one_import_namespace(package: str) -> None:
    """The linked rooms are imported as queue_daemon.journal and so on, never bare:
    nothing is installed as a top-level journal, store, runners or scheduler."""
    bad = [(where, name) for where, name in imports_of(package) if name.split(".")[0] in LINKED]
    assert bad == []


def test_the_domain_is_a_leaf() -> None:
    """The shared types import nothing of ours and no I/O library."""
    ours_or_io = ("queue_daemon", "tests", "bench", "asyncpg", "aiohttp", "asyncio", "subprocess")
    bad = [
        (where, name)
        for where, name in imports_of("queue_daemon/domain")
        if name.split(".")[0] in ours_or_io and not name.startswith("queue_daemon.domain")
    ]
    assert bad == []


def test_the_linked_rooms_are_links() -> None:
    for package in LINKED:
        link = ROOT / "queue_daemon" / package
        assert link.is_symlink() and link.resolve() == (ROOT / package).resolve()


def test_sql_lives_in_store_only() -> None:
    keywords = ("SELECT ", "INSERT INTO", "UPDATE jobs", "DELETE FROM", "CREATE TABLE")
    offenders = []
    for package in PACKAGES:
        if package == "store":
            continue
        for path in sources_of(package):
            text = path.read_text()
            offenders += [(str(path), k) for k in keywords if k in text]
    assert offenders == []


# package -> the top-level modules it must never import: the fault campaign runs without
# the test tools, so what it shares with the tests lives in harness/, not in tests/
NOT_FROM_TESTS = {"bench": ["tests"], "harness": ["tests", "pytest", "_pytest"]}


@pytest.mark.parametrize("package", sorted(NOT_FROM_TESTS))
def test_bench_and_harness_do_not_import_the_tests(package: str) -> None:
    bad = [
        (where, name)
        for where, name in imports_of(package)
        if name.split(".")[0] in NOT_FROM_TESTS[package]
    ]
    assert bad == []
