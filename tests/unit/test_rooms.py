"""The rooms inside the packages, checked on the source: who may import or touch what."""

from __future__ import annotations

import pytest

from tests.unit.test_layering import PACKAGES, ROOT, imports_of, sources_of

# the rooms inside queue_daemon: room -> rooms (and packages) it must never import
ROOMS = {
    "queue_daemon/engine": [
        "queue_daemon.api",
        "queue_daemon.tools",
        "queue_daemon.cli",
        "aiohttp",
    ],
    "queue_daemon/observe": [
        "queue_daemon.api",
        "queue_daemon.engine",
        "queue_daemon.tools",
        "queue_daemon.cli",
        "aiohttp",
    ],
    "queue_daemon/tools": ["queue_daemon.api", "queue_daemon.engine", "queue_daemon.cli"],
    "queue_daemon/api": ["queue_daemon.tools", "queue_daemon.cli", "queue_daemon.app"],
    # the client runs on machines without the daemon: it imports none of it
    "queue_daemon/client": [
        "queue_daemon.api",
        "queue_daemon.engine",
        "queue_daemon.observe",
        "queue_daemon.tools",
        "queue_daemon.cli",
        "queue_daemon.app",
        "queue_daemon.store",
        "queue_daemon.journal",
        "queue_daemon.runners",
        "queue_daemon.scheduler",
        "asyncpg",
    ],
}


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_rooms_import_one_way(room: str) -> None:
    """The API may use the engine and observability, never the reverse; the engine
    may write to observability; offline tools stand apart."""
    bad = [
        (where, name)
        for where, name in imports_of(room)
        for prefix in ROOMS[room]
        if name == prefix or name.startswith(prefix + ".")
    ]
    assert bad == []


def test_only_the_cli_imports_the_offline_tools() -> None:
    # (the bench may: it measures them)
    users = {
        where
        for package in PACKAGES
        for where, name in imports_of(package)
        if name == "queue_daemon.tools" or name.startswith("queue_daemon.tools.")
    }
    assert {
        u for u in users if not u.startswith(("queue_daemon/cli", "queue_daemon/tools"))
    } == set()


def test_only_the_sandbox_touches_cgroups_and_scheduling_classes() -> None:
    marks = ("/sys/fs/cgroup", "cgroup.procs", "sched_setscheduler", "cpu.shares", "cpu.idle")
    offenders = []
    for package in PACKAGES:
        for path in sources_of(package):
            relative = str(path.relative_to(ROOT))
            if relative.startswith("runners/sandbox/"):
                continue
            text = path.read_text()
            offenders += [(relative, mark) for mark in marks if mark in text]
    assert offenders == []


# the engine's phases: each may import itself, the shared modules at the
# engine's top (backoff, handlers, graph, sysid, releases, ...) and the phases
# named here; admission is the one way in for every kind of add
PHASES = {
    "admit": [],
    "ingest": [],
    "run": ["admit"],
    "pull": ["admit"],
    "schedule": ["admit"],
    "upkeep": [],
}


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_engine_phases_import_one_way(phase: str) -> None:
    others = [p for p in PHASES if p != phase and p not in PHASES[phase]]
    bad = [
        (where, name)
        for where, name in imports_of(f"queue_daemon/engine/{phase}")
        for other in others
        if name == f"queue_daemon.engine.{other}"
        or name.startswith(f"queue_daemon.engine.{other}.")
    ]
    assert bad == []


def test_the_engine_is_its_phases() -> None:
    """Every module of the engine lives in a phase, or is shared at its top."""
    engine = ROOT / "queue_daemon" / "engine"
    folders = {p.name for p in engine.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(PHASES)


def test_the_engines_shared_modules_import_no_phase_but_admission() -> None:
    """What the phases share sits at the engine's top and leans on no phase
    (follow-on jobs in the shared releases go through admission)."""
    engine = ROOT / "queue_daemon" / "engine"
    bad = [
        (path.name, name)
        for path in sorted(engine.glob("*.py"))
        for _, name in imports_of(f"queue_daemon/engine/{path.name}")
        for phase in PHASES
        if phase != "admit"
        and (
            name == f"queue_daemon.engine.{phase}"
            or name.startswith(f"queue_daemon.engine.{phase}.")
        )
    ]
    assert bad == []
