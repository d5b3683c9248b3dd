"""The sweep of the daemon's own directories (``queue_daemon.store.homes``) on a
temporary root, with homes made by hand: kept while their data directory exists
or a process uses them, removed once it is gone."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_daemon.cli import main
from queue_daemon.store import embedded
from queue_daemon.store.homes import (
    OWNER_FILE,
    SWEPT,
    home_name,
    read_marker,
    sweep_homes,
    write_marker,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "var-lib-queue-daemon"
    path.mkdir()
    return path


def make_home(root: Path, data_dir: Path) -> Path:
    """A home as ``host_home`` makes it, with a handlers' directory in it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    home = root / home_name(data_dir)
    (home / "run").mkdir(parents=True)
    write_marker(home, data_dir)
    return home


def no_stop(pgdata: Path) -> None:
    raise AssertionError(f"no server runs in {pgdata}")


def test_a_home_whose_data_directory_exists_is_kept(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    assert sweep_homes(root, stop=no_stop) == []
    assert home.is_dir()
    assert read_marker(home) is not None


def test_a_home_whose_data_directory_is_gone_is_removed(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    (home / "pg").mkdir()
    (home / "pg" / "PG_VERSION").write_text("16\n")
    shutil.rmtree(tmp_path / "data")
    [outcome] = sweep_homes(root, stop=no_stop)
    assert outcome.removed and outcome.owner == tmp_path / "data"
    assert list(root.iterdir()) == [root / ".homes.lock"]


def test_a_home_a_live_process_works_in_is_kept(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    shutil.rmtree(tmp_path / "data")
    # a handler still running in its directory (Popen returns once it runs there)
    handler = subprocess.Popen(["sleep", "600"], cwd=home / "run")
    try:
        [outcome] = sweep_homes(root, stop=no_stop)
        assert not outcome.removed and outcome.reason == f"in use by pid {handler.pid}"
        assert home.is_dir()
    finally:
        handler.kill()
        handler.wait()
    [outcome] = sweep_homes(root, stop=no_stop)
    assert outcome.removed and not home.exists()


def test_a_file_held_open_below_the_deleted_data_directory_keeps_its_home(
    root: Path, tmp_path: Path
) -> None:
    """A daemon whose data directory was deleted under it still holds its lock."""
    data_dir = tmp_path / "data"
    home = make_home(root, data_dir)
    (data_dir / "pg.users").mkdir()
    held = os.open(data_dir / "pg.users" / str(os.getpid()), os.O_RDWR | os.O_CREAT)
    try:
        shutil.rmtree(data_dir)
        [outcome] = sweep_homes(root, stop=no_stop)
        assert not outcome.removed and outcome.reason == f"in use by pid {os.getpid()}"
    finally:
        os.close(held)
    assert sweep_homes(root, stop=no_stop)[0].removed and not home.exists()


def test_a_stale_postmaster_pid_is_no_server(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    (home / "pg").mkdir()
    # the pid of a live process that is not postgres (a pid used again)
    (home / "pg" / "postmaster.pid").write_text(f"{os.getppid()}\n{home / 'pg'}\n")
    shutil.rmtree(tmp_path / "data")
    assert sweep_homes(root, stop=no_stop)[0].removed


def test_a_server_that_runs_in_a_gone_data_directorys_home_is_stopped_first(
    root: Path, tmp_path: Path
) -> None:
    """A stand-in postmaster: a process named postgres working in the home's pg."""
    home = make_home(root, tmp_path / "data")
    pgdata = home / "pg"
    pgdata.mkdir()
    fake = tmp_path / "bin" / "postgres"
    fake.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    server = subprocess.Popen([str(fake), "600"], cwd=pgdata)
    (pgdata / "postmaster.pid").write_text(f"{server.pid}\n{pgdata}\n")
    stopped: list[Path] = []

    def stop(path: Path) -> None:
        stopped.append(path)
        server.terminate()
        server.wait()

    try:
        shutil.rmtree(tmp_path / "data")
        [outcome] = sweep_homes(root, stop=stop)
        assert stopped == [pgdata] and outcome.removed and not home.exists()
    finally:
        server.kill()
        server.wait()


def test_a_server_that_will_not_stop_keeps_its_home(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    (home / "pg").mkdir()
    fake = tmp_path / "postgres"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    server = subprocess.Popen([str(fake), "600"], cwd=home / "pg")
    (home / "pg" / "postmaster.pid").write_text(f"{server.pid}\n")
    try:
        shutil.rmtree(tmp_path / "data")
        [outcome] = sweep_homes(root, stop=lambda pgdata: None)
        assert not outcome.removed and "did not stop" in outcome.reason
        assert home.is_dir()
    finally:
        server.kill()
        server.wait()


def test_a_data_directory_renamed_in_place_keeps_its_home(root: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    home = make_home(root, data_dir)
    (home / "pg").mkdir()
    (data_dir / "pg").symlink_to(home / "pg", target_is_directory=True)
    data_dir.rename(tmp_path / "data.old")
    [outcome] = sweep_homes(root, stop=no_stop)
    assert not outcome.removed and outcome.reason == f"its data moved to {tmp_path / 'data.old'}"
    marker = read_marker(home)
    assert marker is not None and marker.owner == tmp_path / "data.old"
    assert sweep_homes(root, stop=no_stop) == []  # now simply kept


def test_a_path_on_another_file_system_than_recorded_is_not_proof(
    root: Path, tmp_path: Path
) -> None:
    """An unmounted file system is not a deleted data directory."""
    home = make_home(root, tmp_path / "mnt" / "data")
    parent_dev = os.stat(tmp_path).st_dev + 1  # as if mnt had been a mount
    (home / OWNER_FILE).write_text(f"{tmp_path / 'mnt' / 'data'}\nparent_dev {parent_dev}\n")
    shutil.rmtree(tmp_path / "mnt")
    assert sweep_homes(root, stop=no_stop) == []
    assert home.is_dir()


def test_a_home_without_marker_is_kept_unless_asked_for_and_untouched(root: Path) -> None:
    old, new = root / ("a" * 16), root / ("b" * 16)
    for home in (old, new):
        (home / "pg").mkdir(parents=True)
        (home / "pg" / "PG_VERSION").write_text("16\n")
    for path in (old, old / "pg", old / "pg" / "PG_VERSION"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    assert [o.removed for o in sweep_homes(root, stop=no_stop)] == [False, False]
    outcomes = sweep_homes(root, unmarked_older_than=86400, stop=no_stop)
    assert [(o.home, o.removed) for o in outcomes] == [(new, False), (old, True)]
    assert new.is_dir() and not old.exists()


def test_other_entries_are_no_homes_and_cut_short_removals_finish(root: Path) -> None:
    (root / "pginstall-0.16.0" / "bin").mkdir(parents=True)
    (root / ".pginstall-0.16.0.123").mkdir()
    (root / "notes").write_text("")
    (root / f"{SWEPT}{'c' * 16}-1-2" / "pg").mkdir(parents=True)
    assert sweep_homes(root, stop=no_stop) == []
    assert sorted(p.name for p in root.iterdir()) == [
        ".pginstall-0.16.0.123",
        "notes",
        "pginstall-0.16.0",
    ]
    assert sweep_homes(root / "missing") == []


def test_a_dry_run_removes_nothing(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    shutil.rmtree(tmp_path / "data")
    [outcome] = sweep_homes(root, dry_run=True, stop=no_stop)
    assert not outcome.removed and outcome.reason == "would be removed" and home.is_dir()


def test_also_gone_takes_existing_data_directories(root: Path, tmp_path: Path) -> None:
    home = make_home(root, tmp_path / "data")
    outcomes = sweep_homes(root, also_gone=lambda p: p.is_relative_to(tmp_path), stop=no_stop)
    assert [o.removed for o in outcomes] == [True] and not home.exists()


@pytest.fixture
def server_home(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(embedded, "SERVER_HOME", root)
    yield root


def test_the_cli_lists_and_removes(
    server_home: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = make_home(server_home, tmp_path / "data")
    shutil.rmtree(tmp_path / "data")
    monkeypatch.setenv("QUEUE_DAEMON_DRY_RUN", "1")
    assert main(["admin", "sweep-homes"]) == 0
    out = capsys.readouterr()
    assert out.out == f"kept\t{home} ({tmp_path / 'data'})\twould be removed\n"
    assert out.err == "0 removed, 1 kept\n"
    monkeypatch.delenv("QUEUE_DAEMON_DRY_RUN")
    assert main(["admin", "sweep-homes"]) == 0
    out = capsys.readouterr()
    assert out.out == f"removed\t{home} ({tmp_path / 'data'})\t{tmp_path / 'data'} is gone\n"
    assert not home.exists()
    assert main(["admin", "sweep-homes", "--unmarked-older-than", "x"]) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon sweeps only as root")
def test_serve_sweeps_in_the_background(server_home: Path, tmp_path: Path) -> None:
    from queue_daemon.placement import sweep_homes_in_background

    home = make_home(server_home, tmp_path / "data")
    shutil.rmtree(tmp_path / "data")
    thread = sweep_homes_in_background()
    assert thread is not None
    thread.join()
    assert not home.exists()


def test_serve_starts_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve`` starts the sweep before the daemon (here: a daemon that fails)."""
    import queue_daemon.cli as cli
    from queue_daemon import app

    calls: list[str] = []
    monkeypatch.setattr(cli, "sweep_homes_in_background", lambda: calls.append("sweep"))

    async def serve(*args: object) -> int:
        calls.append("serve")
        return 3

    monkeypatch.setattr(app, "serve", serve)
    assert main(["serve", "--port", "0", "--event-loop", "asyncio"]) == 3
    assert calls == ["sweep", "serve"]
