"""The sandbox (docs/architecture.md invariant 5): scrubbed environment, private directory, limits,
process groups, an unprivileged user when the daemon is root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from queue_daemon.runners.errors import SandboxError
from queue_daemon.runners.models import HandlerSpec
from queue_daemon.runners.pool import RunnerPool, RunnerSettings
from queue_daemon.runners.sandbox import SAFE_PATH, ProcessLimits, Sandbox, tenant_ids
from queue_daemon.runners.sandbox.cpuplace import (
    BUSY,
    DAEMON,
    DAEMON_SHARES,
    HANDLER_SHARES,
    PREFIX,
    DaemonPlace,
    remove,
    v1_cpu_mount,
)
from queue_daemon.runners.sandbox.cpushare import CpuGroup
from tests.integration.test_runner_python import (
    jobs,
    marked,
    only_context_pid,
    pid_gone,
    spec,
    until,
)

ROOT = os.geteuid() == 0
ALLOWED = {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}


# RLIMIT_NPROC counts every process and thread of the shared run-as uid, including
# other contexts on this machine: the default 64 is too tight for tests that fork.
PROCESSES = 4096


@pytest.fixture
async def pool(work_root: Path) -> AsyncIterator[RunnerPool]:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    yield pool
    await pool.close()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the handler's user may write to, for facts the test reads afterwards."""
    path = Path(tempfile.mkdtemp(prefix="qd-shared-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def runner_uid(client: str = "acme") -> int | None:
    """The uid of ``client``'s handlers when the tests run as root."""
    return tenant_ids(client).uid if ROOT else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group: killed orphans wait for init."""
    return _live_processes(2, pgid)


def _children(pid: int) -> list[int]:
    """The live children of process ``pid``."""
    return _live_processes(1, pid)


def _live_processes(field: int, value: int) -> list[int]:
    """Live (not zombie) processes whose ``/proc/<pid>/stat`` field ``field`` (counted
    from the state, 0) is ``value``: 1 the parent, 2 the process group."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[field]) == value and fields[0] != "Z":
                pids.append(int(entry))
    return pids


async def test_environment_is_scrubbed(pool: RunnerPool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_DAEMON_SECRET", "s3cret")
    monkeypatch.setenv("QUEUE_DAEMON_STORE", "postgresql://u:pass-9f3e1c@db/x")
    monkeypatch.setenv("PGPASSWORD", "pgpass-7d2a4b")
    body = "import os, json\ndef handler(p, ctx):\n    return json.dumps(dict(os.environ))\n"
    (result,) = await pool.run_batch(spec(body), jobs("a"))
    assert result.result is not None
    env = json.loads(result.result)
    assert set(env) == ALLOWED
    assert env["PATH"] == SAFE_PATH and env["LANG"] == "C.UTF-8"
    assert env["HOME"] == env["TMPDIR"]
    # (secrets a random temporary path cannot contain by chance)
    for secret in ("s3cret", "pass-9f3e1c", "pgpass-7d2a4b"):
        assert secret not in result.result
    shell = HandlerSpec(version="v", client="acme", type="s", lang="shell", body="env")
    (listed,) = await pool.run_batch(shell, jobs("a"))
    names = {line.split("=", 1)[0] for line in listed.log}
    assert names <= ALLOWED | {"PWD"}, names  # sh itself adds PWD


async def test_private_directory_and_user(pool: RunnerPool, work_root: Path) -> None:
    body = (
        "import os, json\n"
        "def handler(p, ctx):\n"
        "    open('scratch', 'w').write('x')\n"
        "    return json.dumps([os.getcwd(), os.getuid(), os.getgid(), os.getgroups()])\n"
    )
    (result,) = await pool.run_batch(spec(body), jobs("a"))
    assert result.result is not None
    cwd, uid, gid, groups = json.loads(result.result)
    home = Path(cwd)
    assert home.parent.parent == work_root and home.parent.name.startswith("d-")
    assert stat.S_IMODE(os.stat(home.parent).st_mode) == 0o711  # this pool's part
    info = os.stat(home)
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert "scratch" in os.listdir(home)
    if ROOT:
        assert uid == runner_uid() != 0
        assert info.st_uid == uid
        assert gid != 0 and 0 not in groups
    (again,) = await pool.run_batch(spec(body), jobs("b"))
    assert again.result == result.result  # same context, same directory
    other = HandlerSpec(version="v1", client="globex", type="t", lang="python", body=body)
    (theirs,) = await pool.run_batch(other, jobs("c"))
    assert theirs.result is not None
    their_cwd, their_uid, _, _ = json.loads(theirs.result)
    assert their_cwd != cwd
    if ROOT:  # each tenant's handlers run under a uid of their own
        assert their_uid == runner_uid("globex") != uid
        assert not os.access(Path(their_cwd), os.F_OK) or os.stat(their_cwd).st_uid == their_uid
    await pool.close()
    assert not os.access(home, os.F_OK)


async def test_limits_are_applied(work_root: Path) -> None:
    pool = RunnerPool(
        RunnerSettings(work_root=work_root, open_files=100, processes=50, file_bytes=1 << 20)
    )
    try:
        body = (
            "import resource as r, json\n"
            "def handler(p, ctx):\n"
            "    names = ['RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_NPROC',\n"
            "             'RLIMIT_FSIZE', 'RLIMIT_CORE']\n"
            "    return json.dumps([r.getrlimit(getattr(r, n)) for n in names])\n"
        )
        (result,) = await pool.run_batch(spec(body), jobs("a"))
        assert result.result is not None
        assert json.loads(result.result) == [
            [1 << 30, 1 << 30],
            [3600, 3600],
            [100, 100],
            [50, 50],
            [1 << 20, 1 << 20],
            [0, 0],
        ]
        big = "def handler(p, ctx):\n    open('big', 'wb').write(b'x' * (2 << 20))\n"
        (too_big,) = await pool.run_batch(spec(big, type="big"), jobs("a"))
        assert too_big.exitcode == 500 and "File too large" in str(too_big.result)
    finally:
        await pool.close()


@pytest.mark.parametrize("lang", ["python", "shell"])
async def test_handlers_are_the_first_the_kernel_kills_when_memory_runs_out(
    pool: RunnerPool, lang: str
) -> None:
    """Set as root before the user switch: a handler cannot lower it again, so
    the kernel's out-of-memory killer picks a handler before the daemon or
    PostgreSQL."""
    shell = (
        "cat /proc/self/oom_score_adj; echo 0 >/proc/self/oom_score_adj 2>/dev/null"
        " && echo lowered; true"
    )
    body = (
        "import subprocess\n"
        "def handler(p, ctx):\n"
        f"    return subprocess.run(['/bin/sh', '-c', {shell!r}], capture_output=True,"
        " text=True).stdout\n"
    )
    shell_spec = HandlerSpec(version="v", client="acme", type="s", lang="shell", body=shell)
    the_spec = spec(body) if lang == "python" else shell_spec
    (result,) = await pool.run_batch(the_spec, jobs("a"))
    said = (result.result or "") + " ".join(result.log)
    assert said.split()[0] == "1000", result
    if ROOT and _capable(SYS_RESOURCE):  # else the kernel keeps no floor for it
        assert "lowered" not in said, result


SYS_RESOURCE = 24  # CAP_SYS_RESOURCE


def _capable(cap: int) -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap & 1)
    return False


async def test_python_fallback_wrapper_sets_the_same_limits(work_root: Path) -> None:
    sandbox = Sandbox(work_root=work_root, limits=ProcessLimits(open_files=77), prlimit=None)
    await sandbox.prepare()
    home = sandbox.make_dir("t-", "acme")
    try:
        proc = await sandbox.spawn(
            ["/bin/sh", "-c", "ulimit -n; ulimit -c; id -u"], client="acme", home=home
        )
        out, _ = await proc.communicate()
        lines = out.decode().split()
        assert lines[:2] == ["77", "0"]
        if ROOT:
            assert int(lines[2]) == runner_uid()
    finally:
        Sandbox.remove_dir(home)
        await sandbox.close()


async def test_memory_hog_fails_and_the_context_restarts(pool: RunnerPool) -> None:
    body = (
        "import os\n"
        "MARK = os.urandom(8).hex()\n"
        "def handler(p, ctx):\n"
        "    if p == 'hog':\n"
        "        data = bytearray(4 << 30)\n"
        "        return len(data)\n"
        "    return MARK\n"
    )
    await pool.run_batch(spec(body), jobs("mark"))
    pid = only_context_pid(pool)
    first, hog, after = await pool.run_batch(spec(body), jobs("mark", "hog", "mark"))
    assert (hog.exitcode, hog.result) == (500, "MemoryError")
    assert first.result == after.result  # the batch went on
    (again,) = await pool.run_batch(spec(body), jobs("mark"))
    assert again.exitcode == 200 and again.result != first.result  # recycled
    await until(lambda: pid_gone(pid))


async def test_fork_bomb_is_contained(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=32))
    body = (
        "import os, time\n"
        "def handler(p, ctx):\n"
        "    made = failed = 0\n"
        "    for _ in range(10_000):\n"
        "        try:\n"
        "            pid = os.fork()\n"
        "        except OSError:\n"
        "            failed += 1\n"
        "            if failed > 200: break\n"
        "            continue\n"
        "        if pid == 0:\n"
        "            try:\n"
        "                time.sleep(60)\n"
        "            finally:\n"
        "                os._exit(0)\n"
        "        made += 1\n"
        "    return f'{made} {failed}'\n"
    )
    other = spec("def handler(p, ctx):\n    return 'still here ' + p\n", type="other")
    try:
        (bomb,) = await pool.run_batch(spec(body, type="bomb"), jobs("boom"))
        assert bomb.exitcode == 200 and bomb.result is not None
        made, failed = map(int, bomb.result.split())
        assert made < 32 and failed > 0
        pgid = only_context_pid(pool)  # its group: the context, its children, bubblewrap's two
        assert len(group_members(pgid)) == made + 1 + (2 if pool.sandbox.walled else 0)
        (fine,) = await pool.run_batch(other, jobs("x"))
        assert fine.result == "still here x"
    finally:
        await pool.close()
    await until(lambda: group_members(pgid) == [])  # the whole group was killed


async def test_timeout_kills_grandchildren(pool: RunnerPool) -> None:
    body = (
        "import subprocess\n"
        "def handler(p, ctx):\n"
        "    child = subprocess.Popen(['sleep', '60.0418'])\n"
        "    while True: pass\n"
    )
    (result,) = await pool.run_batch(spec(body, timeout=0.5), jobs("a"))
    assert (result.exitcode, result.result) == (504, "timed out after 0.5s")
    await until(lambda: marked("60.0418") == [])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not ROOT, reason="dropping privileges needs root")
async def test_explicit_run_as_user(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, run_as="nobody"))
    try:
        body = "import os\ndef handler(p, ctx):\n    return str(os.getuid())\n"
        (result,) = await pool.run_batch(spec(body), jobs("a"))
        assert result.result == str(pwd.getpwnam("nobody").pw_uid)
    finally:
        await pool.close()
    bad = RunnerPool(RunnerSettings(work_root=work_root, run_as="no-such-user-here"))
    try:
        (result,) = await bad.run_batch(spec("def handler(p, c): pass"), jobs("a"))
        assert result.exitcode == 500 and "does not exist" in str(result.result)
    finally:
        await bad.close()


async def test_escaped_process_does_not_hang_close(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    body = (
        "import os, time\n"
        "def handler(p, ctx):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"  # leaves the process group, keeps the pipes
        "        os.execvp('sleep', ['sleep', '30.0419'])\n"
        "    return 'forked'\n"
    )
    try:
        (result,) = await pool.run_batch(spec(body), jobs("a"))
        assert result.result == "forked"
        await until(lambda: marked("30.0419") != [])
    finally:
        started = time.monotonic()
        await pool.close()
        assert time.monotonic() - started < 5
        if pool.sandbox.contains_processes or pool.sandbox.walled:
            await until(lambda: marked("30.0419") == [])
        else:  # not root or no cgroup v2, and no bubblewrap: the documented limit
            for escaped in marked("30.0419"):
                os.kill(escaped, signal.SIGKILL)


# a handler that leaves a sleeper in a session of its own (out of the process group),
# marked by its payload ("300.<n>"), then spins if told to
SETSID_SLEEPER = (
    "import os, subprocess\n"
    "def handler(p, ctx):\n"
    "    mark, what = p.split(' ')\n"
    "    child = subprocess.Popen(['sleep', mark], start_new_session=True)\n"
    "    while what == 'spin': pass\n"
    "    return 'left ' + str(child.pid)\n"
)


def sleeper(mark: str) -> int | None:
    """The live host pid of the sleeper marked ``mark``, or None."""
    pids = marked(mark)
    return pids[0] if pids else None


async def contained_pool(work_root: Path) -> RunnerPool:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    await pool.sandbox.prepare()
    if not pool.sandbox.contains_processes:
        await pool.close()
        pytest.skip("needs root and a cgroup v2 hierarchy with cgroup.kill")
    return pool


def gone(pid: int) -> bool:
    return pid_gone(pid) or _zombie(pid)


async def test_setsid_child_dies_with_its_timed_out_job(work_root: Path) -> None:
    pool = await contained_pool(work_root)
    try:
        (result,) = await pool.run_batch(spec(SETSID_SLEEPER, timeout=1.0), jobs("300.0421 spin"))
        assert (result.exitcode, result.result) == (504, "timed out after 1s")
        await until(lambda: sleeper("300.0421") is None)
    finally:
        await pool.close()


async def test_setsid_child_lives_while_the_context_is_warm(work_root: Path) -> None:
    pool = await contained_pool(work_root)
    try:
        (result,) = await pool.run_batch(spec(SETSID_SLEEPER), jobs("300.0422 bg"))
        assert result.exitcode == 200, result
        # same tenant, same limits: it may run until the context stops
        await until(lambda: sleeper("300.0422") is not None)
        (context,) = pool.contexts()
        pool.retire("acme", "t")  # the context stops
        await until(lambda: context.closed)
        await until(lambda: sleeper("300.0422") is None)
    finally:
        await pool.close()


async def test_setsid_child_dies_with_the_pool(work_root: Path) -> None:
    pool = await contained_pool(work_root)
    try:
        (result,) = await pool.run_batch(spec(SETSID_SLEEPER), jobs("300.0423 bg"))
        assert result.exitcode == 200
        await until(lambda: sleeper("300.0423") is not None)
    finally:
        await pool.close()
    await until(lambda: sleeper("300.0423") is None)


async def test_shell_background_session_dies_with_its_job(work_root: Path) -> None:
    pool = await contained_pool(work_root)
    body = "setsid sleep 300.0424 </dev/null >/dev/null 2>&1 & echo started"
    try:
        shell = HandlerSpec(version="v", client="acme", type="s", lang="shell", body=body)
        (result,) = await pool.run_batch(shell, jobs("a"))
        assert result.exitcode == 200, result
        await until(lambda: sleeper("300.0424") is None)
    finally:
        await pool.close()


def test_cgroups_of_a_dead_daemon_are_swept() -> None:
    if not ROOT:
        pytest.skip("cgroups need root")
    from queue_daemon.runners.sandbox import cgroups

    mount, own = cgroups._mount_point(), cgroups._own_path()
    if mount is None or own is None:
        pytest.skip("no cgroup v2 hierarchy")
    parent = mount / own.lstrip("/")
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer exists (as after a daemon was SIGKILLed)
    leftover = parent / f"{cgroups.PREFIX}{dead.pid}.1"
    run = leftover / "run-1"
    run.mkdir(parents=True)
    if not (run / "cgroup.kill").exists():
        cgroups.remove_tree(leftover)
        pytest.skip("the kernel has no cgroup.kill")
    script = 'echo $$ > "$1"; exec setsid sleep 300'
    wrapper = subprocess.Popen(["/bin/sh", "-c", script, "sh", str(run / "cgroup.procs")])
    try:
        deadline = time.monotonic() + 10
        while (run / "cgroup.procs").read_text().split() != [str(wrapper.pid)]:
            assert time.monotonic() < deadline, "the sleeper never entered its cgroup"
            time.sleep(0.01)
        tree = cgroups.CgroupTree.find()
        assert tree is not None
        try:
            assert not leftover.exists()
            assert wrapper.wait(timeout=10) == -signal.SIGKILL
        finally:
            tree.close()
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        if leftover.exists():
            cgroups.remove_tree(leftover)


async def test_a_pool_sweeps_a_dead_daemons_cgroups_when_it_starts(work_root: Path) -> None:
    """Not at its first batch: a daemon that runs no handler (its jobs ran on other
    daemons) still removes what a daemon killed before it left."""
    if not ROOT:
        pytest.skip("cgroups need root")
    from queue_daemon.runners.sandbox import cgroups

    mount, own = cgroups._mount_point(), cgroups._own_path()
    if mount is None or own is None:
        pytest.skip("no cgroup v2 hierarchy")
    # a pid that no longer exists (as after a daemon was SIGKILLed)
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    leftover = mount / own.lstrip("/") / f"{cgroups.PREFIX}{dead.pid}.1"
    (leftover / "run-1").mkdir(parents=True)
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    reaper = asyncio.create_task(pool.run())
    try:
        await until(lambda: not leftover.exists() and pool.sandbox.contains_processes)
    finally:
        reaper.cancel()
        await asyncio.gather(reaper, return_exceptions=True)
        await pool.close()
        if leftover.exists():
            cgroups.remove_tree(leftover)


async def test_private_dirs_of_a_dead_daemon_are_swept(work_root: Path, shared_dir: Path) -> None:
    """A real process claims a part of the work root and is SIGKILLed with a context dir in it;
    the next pool removes that part, and leaves a live owner's part alone."""
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from runners.sandbox.workdirs import OwnPart\n"
        "part = OwnPart.claim(Path(sys.argv[1]))\n"
        "(part.path / 'ctx-acme-x').mkdir()\n"
        "(part.path / 'ctx-acme-x' / 'secret').write_text('left behind')\n"
        "print(part.path, flush=True)\n"
        "time.sleep(300)\n"
    )

    def claimer() -> tuple[subprocess.Popen[str], Path]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(work_root)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert proc.stdout is not None
        return proc, Path(proc.stdout.readline().strip())

    dead, dead_part = await asyncio.to_thread(claimer)
    live, live_part = await asyncio.to_thread(claimer)
    try:
        dead.kill()
        await asyncio.to_thread(dead.wait)
        assert (dead_part / "ctx-acme-x" / "secret").exists()
        pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
        try:
            await pool.sandbox.prepare()
            assert not dead_part.exists()
            assert not dead_part.with_name(dead_part.name + ".lock").exists()
            assert (live_part / "ctx-acme-x" / "secret").exists()  # its owner lives
        finally:
            await pool.close()
        assert sorted(os.listdir(work_root)) == sorted(
            ["bootstrap", live_part.name, live_part.name + ".lock"]
        )
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                proc.kill()
            await asyncio.to_thread(proc.wait)
            assert proc.stdout is not None
            proc.stdout.close()


def _cpu_group_root() -> Path | None:
    from queue_daemon.runners.sandbox.cpuplace import _v1_cpu_dir

    parent = _v1_cpu_dir()
    return parent if os.geteuid() == 0 and parent and (parent / "cpu.shares").exists() else None


needs_cpu_group = pytest.mark.skipif(
    _cpu_group_root() is None, reason="needs root and the cgroup v1 cpu controller"
)

CPU_LINE = (
    "def handler(p, ctx):\n"
    "    lines = open('/proc/self/cgroup').read().splitlines()\n"
    "    return [l for l in lines if 'cpu' in l.split(':')[1].split(',')][0]\n"
)


def _host_cpu_line(pid: int) -> str:
    """Process ``pid``'s line of the v1 cpu controller in /proc/<pid>/cgroup."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line for line in lines if "cpu" in line.split(":")[1].split(","))


def _own_cpu_group() -> Path:
    """This process's cgroup on the v1 cpu controller."""
    from queue_daemon.runners.sandbox.cpuplace import _v1_cpu_dir

    path = _v1_cpu_dir()
    assert path is not None
    return path


@needs_cpu_group
async def test_the_daemon_and_its_handlers_weigh_alike_with_a_cpu_group_per_tenant(
    work_root: Path,
) -> None:
    """The daemon keeps the CPU it needs under a flood of busy handlers (the flood
    bench measures it): it moves into a group of two processes' weight, its
    handlers run beside it in a group of the daemon's weight, one subgroup per
    tenant uid that they cannot leave; all of it goes,
    and the daemon returns to its own cgroup, when the pool closes."""
    origin = _own_cpu_group()
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    try:
        (acme,) = await pool.run_batch(spec(CPU_LINE), jobs("a"))
        other = HandlerSpec(version="v1", client="globex", type="t", lang="python", body=CPU_LINE)
        (globex,) = await pool.run_batch(other, jobs("b"))
        assert acme.exitcode == 200 and globex.exitcode == 200, (acme, globex)
        # read from the host: a handler's own view of its cgroups starts at "/"
        # (a cgroup namespace of its own)
        lines = {c.spec.client: _host_cpu_line(c.pid) for c in pool.contexts() if c.pid}
        acme_path = lines["acme"].split(":", 2)[2]
        globex_path = lines["globex"].split(":", 2)[2]
        acme_uid, globex_uid = runner_uid("acme"), runner_uid("globex")
        assert acme_path.endswith(f"/u-{acme_uid}"), acme_path
        assert globex_path.endswith(f"/u-{globex_uid}"), globex_path
        group = Path(acme_path).parent
        assert group.name.startswith("handlers-"), group
        assert Path(globex_path).parent == group
        home = origin / f"{PREFIX}{os.getpid()}"
        assert group.parent.name == home.name, group  # beside the daemon, in its group
        assert _own_cpu_group() == home / DAEMON  # the daemon itself, every thread
        assert (home / "cpu.shares").read_text().strip() == str(DAEMON_SHARES)
        handlers = home / group.name
        # the daemon's weight, not idle-class: on a core where only a handler of
        # the daemon's group waits, an idle-class group got almost none of its share
        assert (handlers / "cpu.shares").read_text().strip() == str(HANDLER_SHARES)
        if (handlers / "cpu.idle").exists():
            assert (handlers / "cpu.idle").read_text().strip() == "0"
        assert (handlers / f"u-{acme_uid}").is_dir() and (handlers / f"u-{globex_uid}").is_dir()
    finally:
        await pool.close()
    assert not home.exists(), "the CPU group outlived its pool"
    assert _own_cpu_group() == origin, "the daemon did not go back to its own cgroup"


@needs_cpu_group
async def test_busy_tenants_handlers_yield_the_cpu_to_the_others(work_root: Path) -> None:
    """The groups of tenants the daemon finds busy (more contexts at once than their
    share of the cores) are marked idle-class among the tenants' groups, so another
    tenant's handler that wakes takes a core from theirs at once; the mark goes when
    the tenant is no longer busy, and a tenant's group made later gets its mark."""
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    try:
        (acme,) = await pool.run_batch(spec(CPU_LINE), jobs("a"))
        other = HandlerSpec(version="v1", client="globex", type="t", lang="python", body=CPU_LINE)
        (globex,) = await pool.run_batch(other, jobs("b"))
        mount = v1_cpu_mount()
        assert mount is not None and acme.exitcode == globex.exitcode == 200, (acme, globex)
        handlers = (mount / str(acme.result).split(":", 2)[2].lstrip("/")).parent
        if not (handlers / "cpu.idle").exists():
            pytest.skip("the kernel has no cpu.idle (Linux 5.15+)")

        def marks() -> dict[str, str]:
            return {
                client: (handlers / f"u-{runner_uid(client)}" / "cpu.idle").read_text().strip()
                for client in ("acme", "globex", "initech")
                if (handlers / f"u-{runner_uid(client)}").exists()
            }

        home = handlers.parent
        busy = home.parent / f"{home.name}{BUSY}" / handlers.name

        async def group_of(handler: HandlerSpec, job: str) -> Path:
            """The CPU group the tenant's (warm) context runs in, as it sees it."""
            (result,) = await pool.run_batch(handler, jobs(job))
            assert result.exitcode == 200, result
            return mount / str(result.result).split(":", 2)[2].lstrip("/")

        acme_spec = spec(CPU_LINE)
        assert marks() == {"acme": "0", "globex": "0"}
        await pool.mark_busy({"acme"})
        assert marks() == {"acme": "1", "globex": "0"}
        # the busy tenant's running context moved beside every other process, idle-class
        assert await group_of(acme_spec, "a2") == busy / f"u-{runner_uid('acme')}"
        assert (busy.parent / "cpu.idle").read_text().strip() == "1"
        assert await group_of(other, "b2") == handlers / f"u-{runner_uid('globex')}"
        await pool.mark_busy({"globex", "initech"})
        assert marks() == {"acme": "0", "globex": "1"}
        assert await group_of(acme_spec, "a3") == handlers / f"u-{runner_uid('acme')}"
        assert await group_of(other, "b3") == busy / f"u-{runner_uid('globex')}"
        late = HandlerSpec(version="v1", client="initech", type="t", lang="python", body=CPU_LINE)
        # a tenant marked before its first context: that context starts in the busy group
        assert await group_of(late, "c") == busy / f"u-{runner_uid('initech')}"
        assert marks() == {"acme": "0", "globex": "1", "initech": "1"}
        await pool.mark_busy(set())
        assert marks() == {"acme": "0", "globex": "0", "initech": "0"}
        assert await group_of(late, "c2") == handlers / f"u-{runner_uid('initech')}"
        assert busy.is_dir()  # empty now, until the pool closes
    finally:
        await pool.close()
    assert not busy.exists(), "the busy tenants' group outlived its pool"
    assert not busy.parent.exists(), "the busy tenants' group outlived its pool"


POLICY_LINE = "import os\ndef handler(p, ctx):\n    return f'policy {os.sched_getscheduler(0)}'\n"
NORMAL = f"policy {os.SCHED_OTHER}"


def _policy(tid: int) -> int:
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK


def _policies(pid: int) -> set[int]:
    """The scheduling policies of every thread of process ``pid``."""
    return {_policy(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@needs_cpu_group
async def test_the_daemon_runs_real_time_while_a_tenant_is_busy(
    work_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a tenant is busy, the daemon's threads and the processes of the server it
    started in its place run at the lowest real-time priority, so a wake-up takes a
    core at once instead of queueing behind whatever normal process last ran there;
    every handler context (one started meanwhile too) and any other process in the
    daemon's place stay normal; all are normal again once the mark's hold ends."""
    import queue_daemon.runners.sandbox.cpuplace as cpushare

    if int(cpushare.RT_THROTTLE.read_text()) <= 0:
        pytest.skip("real-time throttling is off: the daemon does not use real-time")
    monkeypatch.setattr(cpushare, "RT_HOLD_S", 0.0)
    place = DaemonPlace.take()
    assert place is not None
    home = _own_cpu_group().parent
    # stand-ins: a server (a "postmaster" and its child backend) and a process on its way
    # to a handler's group, all started in the daemon's place
    postmaster = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '300'])"
    )
    passing = await asyncio.create_subprocess_exec("sleep", "300")
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES, realtime=True))
    backend: list[int] = []
    try:
        await until(lambda: _children(postmaster.pid))
        backend = _children(postmaster.pid)
        (tmp_path / "postmaster.pid").write_text(f"{postmaster.pid}\n{tmp_path}\n")
        place.serve(tmp_path)
        (first,) = await pool.run_batch(spec(POLICY_LINE), jobs("a"))
        assert first.result == NORMAL, first
        server = {os.getpid(), postmaster.pid, backend[0]}
        assert {pid: _policies(pid) for pid in server} == {pid: {os.SCHED_OTHER} for pid in server}

        await pool.mark_busy({"acme"})
        await pool.mark_busy({"acme"})  # threads started by the first (the next check's)
        assert {pid: _policies(pid) for pid in server} == {pid: {os.SCHED_RR} for pid in server}
        assert os.sched_getparam(0).sched_priority == cpushare.RT_PRIORITY
        assert _policies(passing.pid) == {os.SCHED_OTHER}, "a process not of the server"
        budget = home / DAEMON / "cpu.rt_runtime_us"
        if budget.exists():
            assert int(budget.read_text()) > 0
        other = HandlerSpec(
            version="v1", client="globex", type="t", lang="python", body=POLICY_LINE
        )
        (started,) = await pool.run_batch(other, jobs("b"))  # a context started meanwhile
        (warm,) = await pool.run_batch(spec(POLICY_LINE), jobs("a2"))
        assert (started.result, warm.result) == (NORMAL, NORMAL), (started, warm)

        await pool.mark_busy(set())  # the hold (0 s here) has ended
        assert {pid: _policies(pid) for pid in server} == {pid: {os.SCHED_OTHER} for pid in server}
        if budget.exists():
            assert budget.read_text().strip() == "0"
    finally:
        await pool.close()
        for process in (postmaster, passing):
            process.kill()
            await process.wait()
        for pid in backend:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        place.release()
    assert _policies(os.getpid()) == {os.SCHED_OTHER}


@needs_cpu_group
async def test_no_real_time_where_the_kernel_does_not_throttle_it(
    work_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With real-time throttling off (``kernel.sched_rt_runtime_us`` = -1) a real-time
    daemon could starve the machine: it stays a normal process, busy tenants or not."""
    import queue_daemon.runners.sandbox.cpuplace as cpushare

    (tmp_path / "sched_rt_runtime_us").write_text("-1\n")
    monkeypatch.setattr(cpushare, "RT_THROTTLE", tmp_path / "sched_rt_runtime_us")
    await _normal_while_busy(
        RunnerSettings(work_root=work_root, processes=PROCESSES, realtime=True)
    )


@needs_cpu_group
async def test_no_real_time_when_the_operator_says_so(work_root: Path) -> None:
    """``serve --no-realtime`` (``RunnerSettings.realtime``): busy tenants or not, the
    daemon stays a normal process."""
    settings = RunnerSettings(work_root=work_root, processes=PROCESSES, realtime=False)
    await _normal_while_busy(settings)


@needs_cpu_group
async def test_no_real_time_unless_the_operator_asks(work_root: Path) -> None:
    """Real-time is opt-in (``serve --realtime``): by default the daemon stays a normal
    process while a tenant is busy (the busy tenant's handlers still get the idle mark,
    which needs no real-time class: see the test of busy tenants above)."""
    await _normal_while_busy(RunnerSettings(work_root=work_root, processes=PROCESSES))


async def _normal_while_busy(settings: RunnerSettings) -> None:
    """A pool of ``settings`` with a tenant marked busy leaves this process normal."""
    pool = RunnerPool(settings)
    try:
        (first,) = await pool.run_batch(spec(POLICY_LINE), jobs("a"))
        assert first.result == NORMAL, first
        await pool.mark_busy({"acme"})
        assert _policies(os.getpid()) == {os.SCHED_OTHER}
    finally:
        await pool.close()


def test_no_real_time_without_a_real_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the kernel budgets real-time time per cgroup and the daemon's parent group
    has none to give, the daemon stays a normal process and logs why."""
    import queue_daemon.runners.sandbox.cpuplace as cpushare

    (tmp_path / "sched_rt_runtime_us").write_text("950000\n")
    monkeypatch.setattr(cpushare, "RT_THROTTLE", tmp_path / "sched_rt_runtime_us")
    origin = tmp_path / "cpu"
    home = origin / f"{PREFIX}{os.getpid()}"
    (home / DAEMON).mkdir(parents=True)
    (origin / "cpu.rt_runtime_us").write_text("0\n")
    with caplog.at_level(logging.INFO, logger="queue_daemon.runners.sandbox.cpuplace"):
        cpushare.Home(home, origin).realtime(object(), True)
    assert _policies(os.getpid()) == {os.SCHED_OTHER}
    assert "no real-time budget" in caplog.text
    assert not (home / "cpu.rt_runtime_us").exists() or (
        (home / "cpu.rt_runtime_us").read_text() == "0"
    )


@needs_cpu_group
def test_cpu_groups_of_a_dead_daemon_are_swept() -> None:
    """A daemon killed in its CPU group leaves it behind; the next one removes it and
    moves what still runs there (an embedded PostgreSQL it started) up, as a normal
    process again if it ran real-time."""
    origin = _own_cpu_group()
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = origin / f"{PREFIX}{dead.pid}"
    (leftover / DAEMON).mkdir(parents=True)
    (leftover / "handlers-1" / "u-1").mkdir(parents=True)
    survivor = subprocess.Popen(["sleep", "300"])
    try:
        (leftover / DAEMON / "cgroup.procs").write_text(str(survivor.pid))
        # raised while a tenant was busy, when its daemon died
        for place in (leftover, leftover / DAEMON):
            if (place / "cpu.rt_runtime_us").exists():
                (place / "cpu.rt_runtime_us").write_text("10000")
        os.sched_setscheduler(survivor.pid, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(1))
        group = CpuGroup.find()
        assert group is not None
        try:
            assert not leftover.exists()
            assert str(survivor.pid) in (origin / "cgroup.procs").read_text().split()
            assert _policies(survivor.pid) == {os.SCHED_OTHER}, "left real-time"
        finally:
            group.close()
    finally:
        survivor.kill()
        survivor.wait()
        remove(leftover)


@needs_cpu_group
def test_a_daemon_takes_its_cpu_place_before_it_starts_its_postgresql() -> None:
    """A daemon that starts the embedded PostgreSQL takes its CPU place first, so the
    server starts there and shares the daemon's weight; the place stays while
    handlers' groups use it, and with the last user the daemon and what it started
    go back to where the daemon came from."""
    origin = _own_cpu_group()
    home = origin / f"{PREFIX}{os.getpid()}"
    place = DaemonPlace.take()
    assert place is not None
    server = subprocess.Popen(["sleep", "300"])  # stands for the server's processes
    try:
        assert _own_cpu_group() == home / DAEMON
        assert str(server.pid) in (home / DAEMON / "cgroup.procs").read_text().split()
        group = CpuGroup.find()
        assert group is not None and group.path.parent == home
        place.release()
        assert _own_cpu_group() == home / DAEMON, "left while handlers still use the place"
        group.close()
        assert not home.exists(), "the CPU place outlived its last user"
        assert _own_cpu_group() == origin
        assert str(server.pid) in (origin / "cgroup.procs").read_text().split()
    finally:
        server.kill()
        server.wait()
        remove(home)


def test_no_cpu_place_without_root_or_the_cpu_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    import queue_daemon.runners.sandbox.cpuplace as cpushare

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert DaemonPlace.take() is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(cpushare, "_v1_cpu_dir", lambda: None)
    assert DaemonPlace.take() is None


async def test_close_waits_for_a_making_whose_caller_was_cancelled(
    work_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The making runs in a thread that goes on when its caller is cancelled (a daemon
    stopped just after it started); ``close`` waits for it and removes what it made,
    rather than leaving it behind (cgroups, the daemon's CPU group)."""
    sandbox = Sandbox(work_root=work_root, limits=ProcessLimits(), prlimit=None)
    made: list[str] = []
    release = threading.Event()
    real = sandbox._prepare

    def slow_prepare() -> None:
        release.wait(10)
        real()
        made.append("made")

    monkeypatch.setattr(sandbox, "_prepare", slow_prepare)
    caller = asyncio.create_task(sandbox.prepare())
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    closing = asyncio.create_task(sandbox.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # waiting for the thread
    release.set()
    await asyncio.wait_for(closing, 10)
    assert made == ["made"]
    assert sandbox._cgroups is None and sandbox._cpu is None and sandbox._part is None
    with pytest.raises(SandboxError):
        await sandbox.prepare()
