"""The walls that need no trust in the daemon's host (docs/security.md): every
python, node and shell handler process under the seccomp filter with
no_new_privs, in bubblewrap's minimal view, attacked as a hostile tenant would."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.daemons import reachable_dir
from queue_daemon.runners.models import HandlerSpec, JobInput
from queue_daemon.runners.pool import RunnerPool, RunnerSettings
from queue_daemon.runners.sandbox.syscalls import NAMESPACE_FLAGS, refused_calls
from tests.integration.test_runner_python import jobs

# .ci/run installs bubblewrap; elsewhere these tests skip where it is missing
needs_walls = pytest.mark.skipif(
    shutil.which("bwrap") is None and os.environ.get("CI") != "true",
    reason="bubblewrap is missing (apt-get install bubblewrap)",
)
pytestmark = needs_walls
REPO = Path(__file__).resolve().parents[2]

# calls each call number with zero arguments (or the flags given) and says the errno
CALLER = """
import ctypes, json, os, threading, subprocess
libc = ctypes.CDLL(None, use_errno=True)

def call(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else ctypes.get_errno()

def handler(payload, ctx):
    ask = json.loads(payload)
    if ask["what"] == "calls":
        args = ask.get("args", [])
        return json.dumps({name: call(number, *args) for name, number in ask["calls"].items()})
    if ask["what"] == "status":
        lines = open("/proc/self/status").read().splitlines()
        fields = dict(line.split(":\\t", 1) for line in lines)
        keys = ("NoNewPrivs", "Seccomp", "CapEff", "CapBnd")
        return json.dumps({k: fields[k].strip() for k in keys})
    if ask["what"] == "usual":  # what ordinary handlers do still works
        child = subprocess.run(["sh", "-c", "echo sub"], capture_output=True, text=True).stdout
        box = []
        worker = threading.Thread(target=lambda: box.append("thread"))
        worker.start(); worker.join()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, status = os.waitpid(pid, 0)
        return json.dumps([child.strip(), box[0], os.waitstatus_to_exitcode(status)])
    if ask["what"] == "list":
        try:
            return json.dumps(sorted(os.listdir(ask["path"])))
        except OSError as exc:
            return json.dumps(type(exc).__name__)
    if ask["what"] == "read":
        try:
            return json.dumps(open(ask["path"]).read())
        except OSError as exc:
            return json.dumps(type(exc).__name__)
    if ask["what"] == "fds":
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return json.dumps(fds)
    if ask["what"] == "write":
        try:
            open(ask["path"], "w").write("x")
            return json.dumps("written")
        except OSError as exc:
            return json.dumps(errno.errorcode[exc.errno])
    raise ValueError(ask)
import errno
"""


def numbers(names: list[str]) -> dict[str, int]:
    """The call numbers of this machine's architecture (names it has)."""
    import pyseccomp

    found = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in names}
    return {name: number for name, number in found.items() if number >= 0}


@pytest.fixture
async def pool(work_root: Path) -> AsyncIterator[RunnerPool]:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=4096))
    await pool.sandbox.prepare()
    assert pool.sandbox.walled and pool.sandbox.filtered, "bubblewrap or libseccomp failed"
    yield pool
    await pool.close()


def _top(path: object) -> str:
    """The first part of ``path``'s real path."""
    return os.path.realpath(str(path)).split("/")[1]


async def ask(pool: RunnerPool, lang: str = "python", **question: object) -> object:
    spec = HandlerSpec(version="v1", client="acme", type="walls", lang=lang, body=CALLER)
    (result,) = await pool.run_batch(spec, jobs(json.dumps(question)))
    assert result.exitcode == 200, result
    assert result.result is not None
    return json.loads(result.result)


async def test_every_refused_call_gets_eperm(pool: RunnerPool) -> None:
    calls = numbers(refused_calls())
    assert len(calls) > 30, calls
    said = await ask(pool, what="calls", calls=calls)
    assert said == {name: errno.EPERM for name in calls}, said


async def test_namespaces_cannot_be_made_by_clone_or_unshare(pool: RunnerPool) -> None:
    # unshare(CLONE_NEWUSER) succeeds for any user where the kernel allows user
    # namespaces, as here: only the filter refuses it
    for flag in NAMESPACE_FLAGS.values():
        said = await ask(pool, what="calls", calls=numbers(["unshare", "clone"]), args=[flag])
        assert said == {"unshare": errno.EPERM, "clone": errno.EPERM}, (hex(flag), said)
    said = await ask(pool, what="calls", calls=numbers(["clone3"]))
    assert said == {"clone3": errno.ENOSYS}  # C libraries fall back to clone


async def test_personality_flags_are_refused_and_the_default_kept(pool: RunnerPool) -> None:
    no_aslr, read_implies_exec = 0x0040000, 0x0400000
    for flag in (no_aslr, read_implies_exec, 0xFFFFFFFF):
        said = await ask(pool, what="calls", calls=numbers(["personality"]), args=[flag])
        assert said == {"personality": errno.EPERM}, (hex(flag), said)
    said = await ask(pool, what="calls", calls=numbers(["personality"]), args=[0])
    assert said == {"personality": 0}


async def test_ordinary_handlers_still_fork_thread_and_run_commands(pool: RunnerPool) -> None:
    assert await ask(pool, what="usual") == ["sub", "thread", 7]


@pytest.mark.parametrize("lang", ["python", "node", "shell"])
async def test_every_language_runs_filtered_without_new_privileges(
    pool: RunnerPool, lang: str
) -> None:
    if lang == "python":
        status = await ask(pool, what="status")
    else:
        node = "module.exports = () => require('fs').readFileSync('/proc/self/status', 'utf8')"
        body = {
            "node": node,
            "shell": "cat /proc/self/status",
        }[lang]
        spec = HandlerSpec(version="v1", client="acme", type=lang, lang=lang, body=body)
        (result,) = await pool.run_batch(spec, [JobInput(id="j", payload="", attempt=1)])
        assert result.exitcode == 200, result
        text = "\n".join(result.log) if lang == "shell" else str(result.result)
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        status = {k: fields[k].strip() for k in ("NoNewPrivs", "Seccomp", "CapEff", "CapBnd")}
    assert status == {
        "NoNewPrivs": "1",
        "Seccomp": "2",  # a filter
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
    }, (lang, status)


async def test_the_view_holds_only_what_handlers_need(pool: RunnerPool, work_root: Path) -> None:
    top = await ask(pool, what="list", path="/")
    assert isinstance(top, list)
    # the system's own, and the first parts of the paths bound for it (the work
    # root, the interpreter's virtualenv) as empty directories on the way down
    bound = {_top(p) for p in (work_root, sys.prefix, sys.base_prefix)}
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}
    assert set(top) <= system | bound, top
    for gone in ("/home", "/root", "/var", "/srv", "/opt", "/mnt", "/media"):
        if Path(gone).name not in bound:
            assert await ask(pool, what="list", path=gone) == "FileNotFoundError", gone
    for gone in ("/etc/shadow", "/etc/hostname", "/etc/resolv.conf", "/etc/hosts"):
        assert await ask(pool, what="read", path=gone) == "FileNotFoundError", gone
    etc = await ask(pool, what="list", path="/etc")
    assert isinstance(etc, list)
    assert set(etc) <= {
        "passwd",
        "group",
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "localtime",
        "alternatives",
    }, etc
    passwd = await ask(pool, what="read", path="/etc/passwd")
    assert isinstance(passwd, str) and len(passwd.splitlines()) == 1, passwd
    owner = pool.sandbox.owner("acme")  # None: not root, the daemon's own uid
    assert passwd.split(":")[2] == str(os.getuid() if owner is None else owner.uid), passwd
    # its own processes only: bubblewrap's first, then the context
    procs = await ask(pool, what="list", path="/proc")
    assert isinstance(procs, list)
    # bubblewrap's first process (1) and the context (2): nothing of the host's
    assert sorted(int(p) for p in procs if p.isdigit()) == [1, 2], procs
    # the work root holds only the bootstraps and the way down to its own directory
    parts = await ask(pool, what="list", path=str(work_root))
    assert isinstance(parts, list) and parts[0] == "bootstrap", parts
    assert len(parts) == 2 and parts[1].startswith("d-"), parts
    inside = await ask(pool, what="list", path=str(work_root / parts[1]))
    assert isinstance(inside, list) and len(inside) == 1, inside
    assert inside[0].startswith("ctx-acme-"), inside
    fds = await ask(pool, what="fds")
    assert isinstance(fds, dict)
    held = [t for t in fds.values() if t.endswith("/.qd-held")]  # runners/PROTOCOL.md
    assert not [
        t for t in fds.values() if "seccomp" in t or (str(work_root) in t and t not in held)
    ], fds
    assert await ask(pool, what="write", path="/usr/planted") == "EROFS"
    assert await ask(pool, what="write", path="/tmp/own") == "written"


# two tenants of a daemon that is not root: the walls stand through a user namespace
ROOTLESS = """
import asyncio, json, socket, sys
from pathlib import Path
from harness.daemons import reachable_dir
from queue_daemon.runners.models import HandlerSpec, JobInput
from queue_daemon.runners.pool import RunnerPool, RunnerSettings

BODY = '''
import json, os, socket
def handler(payload, ctx):
    ask = json.loads(payload)
    try:
        if ask["what"] == "write":
            open("secret", "w").write("mine")
            return json.dumps(os.getcwd())
        if ask["what"] == "list":
            return json.dumps(sorted(os.listdir(ask["path"])))
        if ask["what"] == "tcp":
            socket.create_connection(("127.0.0.1", ask["port"]), timeout=2).close()
            return json.dumps("connected")
        if ask["what"] == "status":
            text = open("/proc/self/status").read()
            return json.dumps([line for line in text.splitlines() if line.startswith("Seccomp:")])
    except OSError as exc:
        return json.dumps(type(exc).__name__)
'''


async def main(root, port, mode):
    # mode "walls": as it comes; "none": no bubblewrap, "trust": no bubblewrap, trusted
    settings = RunnerSettings(
        work_root=Path(root) / "run",
        bwrap="auto" if mode == "walls" else None,
        trust_tenants=mode == "trust",
    )
    pool = RunnerPool(settings)
    said = {}
    try:
        async def ask(client, **question):
            spec = HandlerSpec(version="v", client=client, type="t", lang="python", body=BODY)
            job = JobInput(id="j", payload=json.dumps(question), attempt=1)
            (result,) = await pool.run_batch(spec, [job])
            return json.loads(result.result) if result.exitcode == 200 else result.result
        home = await ask("a", what="write")
        said["other_home"] = await ask("b", what="list", path=home)
        said["data_dir"] = await ask("b", what="list", path=root)
        said["tcp"] = await ask("b", what="tcp", port=port)
        said["procs"] = await ask("b", what="list", path="/proc")
        said["status"] = await ask("b", what="status")
        said["walled"] = [pool.sandbox.walled, pool.sandbox.filtered]
    finally:
        await pool.close()
    print(json.dumps(said))


asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


def _unprivileged_python() -> str | None:
    """A python of this version that an unprivileged user can run, or None."""
    import subprocess

    for python in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin")):
        if python is None:
            continue
        try:
            done = subprocess.run(
                [python, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                user=65534,
                group=65534,
                extra_groups=[],
                cwd="/",
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == str(sys.version_info[:2]):
            return python
    return None


async def as_nobody(mode: str) -> dict[str, object]:
    """What ``ROOTLESS`` says, run by user nobody in ``mode``."""
    import asyncio
    import socket
    import tempfile

    python = await asyncio.to_thread(_unprivileged_python)
    if python is None:
        pytest.skip("no python of this version that user nobody can run")
    root = Path(tempfile.mkdtemp(prefix="qd-rootless-"))
    os.chown(root, 65534, 65534)
    packages = [p for p in sys.path if p.endswith("site-packages")]
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        process = await asyncio.create_subprocess_exec(
            python,
            "-c",
            ROOTLESS,
            str(root),
            str(listener.getsockname()[1]),
            mode,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join([str(REPO), *packages])},
            cwd=root,
            user=65534,
            group=65534,
            extra_groups=[],
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
    finally:
        listener.close()
        shutil.rmtree(root, ignore_errors=True)
    assert process.returncode == 0, err.decode()[-3000:]
    said: dict[str, object] = json.loads(out.decode().splitlines()[-1])
    return said


needs_root_to_be_nobody = pytest.mark.skipif(
    os.geteuid() != 0, reason="the pool fixture's tests above run rootless here"
)


@needs_root_to_be_nobody
async def test_walls_stand_for_a_daemon_that_is_not_root() -> None:
    said = await as_nobody("walls")
    assert said["walled"] == [True, True], said
    assert said["other_home"] == "FileNotFoundError", said  # another tenant's directory
    assert said["data_dir"] == ["run"], said  # only the way down to its own
    assert said["tcp"] == "ConnectionRefusedError", said  # its own loopback, not the host's
    procs = said["procs"]
    assert isinstance(procs, list)
    assert sorted(int(p) for p in procs if p.isdigit()) == [1, 2], said
    assert said["status"] == ["Seccomp:\t2"], said


@needs_root_to_be_nobody
async def test_without_walls_only_the_first_tenant_runs_unless_trusted() -> None:
    said = await as_nobody("none")
    assert said["walled"] == [False, False], said
    refusal = str(said["other_home"])  # tenant b's first job
    assert refusal.startswith("not run: this daemon runs another tenant's handlers"), said
    assert "--trust-tenants" in refusal, said
    trusted = await as_nobody("trust")
    assert trusted["walled"] == [False, False], trusted
    # trusted, and nothing between them: b reads a's directory, reaches the host
    assert isinstance(trusted["other_home"], list), trusted
    assert trusted["tcp"] == "connected", trusted


def test_handler_share_flag_takes_absolute_directories_only(tmp_path: Path) -> None:
    from queue_daemon.cli import CliError, build_parser, settings_from

    def serve(*argv: str) -> object:
        return settings_from(build_parser().parse_args(["serve", *argv]))

    assert serve().handler_share == ()  # type: ignore[attr-defined]
    shared = serve("--handler-share", f"{tmp_path}, /tmp")
    assert shared.handler_share == (tmp_path, Path("/tmp"))  # type: ignore[attr-defined]
    for bad in ("relative/dir", str(tmp_path / "missing"), "/etc/passwd"):
        with pytest.raises(CliError, match=r"--handler-share: .* is not the absolute path of a"):
            serve("--handler-share", bad)


async def test_a_shared_directory_is_in_every_tenants_view(work_root: Path) -> None:
    shared = reachable_dir("qd-share-")  # where tenants' uids can reach it
    shared.chmod(0o777)
    pool = RunnerPool(RunnerSettings(work_root=work_root, share=(shared,)))
    try:
        for client in ("acme", "globex"):
            spec = HandlerSpec(
                version="v",
                client=client,
                type="w",
                lang="shell",
                body=f"echo x > {shared}/{client}",
            )
            (result,) = await pool.run_batch(spec, [JobInput(id="j", payload="", attempt=1)])
            assert result.exitcode == 200, result
        assert sorted(p.name for p in shared.iterdir()) == ["acme", "globex"]
    finally:
        await pool.close()
        shutil.rmtree(shared, ignore_errors=True)


def test_nothing_bound_for_the_interpreter_holds_the_daemons_data(tmp_path: Path) -> None:
    """A virtualenv that holds the data directory (``python -m venv .`` where the
    daemon runs) is bound by its library only, never whole; nor is ``/``."""
    from queue_daemon.runners.sandbox.view import narrowed

    venv = tmp_path / "venv"
    library = venv / "lib" / "python3" / "site-packages"
    library.mkdir(parents=True)
    work_root = venv / "queue-data" / "run"
    work_root.mkdir(parents=True)
    paths = [venv, library, Path("/"), Path("/usr/lib"), venv / "bin"]
    assert narrowed(paths, [work_root, work_root.parent]) == (library,)
