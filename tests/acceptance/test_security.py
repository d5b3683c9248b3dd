"""The security model (docs/security.md), attacked end to end.

A daemon as a user runs it (the embedded PostgreSQL, no --store) with two
tenants; ``mallory``'s handlers try what the security model says they cannot
do, and each attempt must fail. The probes run as real handlers through the
HTTP API; paths and pids come in the payload, as an attacker could guess them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.api import Api, Handlers, until, wait_done
from harness.daemons import (
    DaemonFactory,
    DaemonProcess,
    add_tenant,
    reachable_dir,
)
from queue_daemon.store.embedded import stop_server

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant users need root")

PROBE = """
import json, os, socket

def handler(payload, ctx):
    ask = json.loads(payload)
    what, target = ask["what"], ask.get("target")
    try:
        if what == "read":
            with open(target, "rb") as f:
                value = f.read(64).decode("latin-1")
        elif what == "list":
            value = sorted(os.listdir(target))
        elif what == "write-temp":
            import tempfile
            fd, value = tempfile.mkstemp(prefix="secret-")
            os.write(fd, b"mallory-cannot-see-this")
            os.close(fd)
        elif what == "unix":
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            s.connect(target)
            value = "connected"
        elif what == "uid":
            value = os.getuid()
        elif what == "kill":
            import signal
            os.kill(int(target), signal.SIGKILL)
            value = "killed"
        elif what == "cmdlines":
            value = {}
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            value[pid] = f.read().replace(b"\\0", b" ").decode("latin-1")
                    except OSError:
                        pass
        elif what == "tcp":
            s = socket.create_connection(tuple(target), timeout=2)
            value = "connected"
        else:
            value = None
        return json.dumps({"ok": True, "value": value})
    except Exception as exc:
        return json.dumps({"ok": False, "error": type(exc).__name__ + ": " + str(exc)})
"""


class Site:
    def __init__(
        self,
        daemon: DaemonProcess,
        data_dir: Path,
        tokens: dict[str, str],
        factory: DaemonFactory,
    ) -> None:
        self.daemon = daemon
        self.data_dir = data_dir
        self.tokens = tokens
        self.share = factory.shared_dir  # writable by any handler (--handler-share)


@pytest.fixture(scope="module")
def site(module_daemons: DaemonFactory) -> Iterator[Site]:
    root = reachable_dir("qd-security-")
    data_dir = root / "data"
    try:
        tokens = {
            client: add_tenant(client, store=None, data_dir=data_dir, cwd=root)
            for client in ("alice", "mallory")
        }
        daemon = module_daemons.start(data_dir, None, "--context-idle", "120")
        yield Site(daemon, data_dir, tokens, module_daemons)
        daemon.close()
    finally:
        stop_server(data_dir / "pg")
        shutil.rmtree(root, ignore_errors=True)


async def probe(site: Site, session: aiohttp.ClientSession, client: str, **ask: Any) -> Any:
    api = Api(session, site.daemon.url, client, site.tokens[client])
    handlers = Handlers(api)
    if (await handlers.get("probe")).status != 200:
        await handlers.add("probe", "python", PROBE, timeout=10)
    [job_id] = await api.add("probe", [json.dumps(ask)])
    job = await wait_done(api, job_id, within=30)
    assert job["code"] == "ok", job
    return json.loads(job["result"])


def exists(path: str) -> bool:
    return Path(path).exists()


def refused(outcome: Any) -> None:
    assert outcome["ok"] is False, f"the handler got through: {outcome}"


def unreachable(outcome: Any) -> None:
    """Not there at all (bubblewrap's minimal view), or refused by permissions
    where handlers see the whole file system."""
    refused(outcome)
    expected = "FileNotFoundError" if WALLED else "PermissionError"
    assert outcome["error"].startswith(expected), outcome


# handlers see the minimal view (docs/security.md) where bubblewrap is installed,
# as .ci/run makes sure
WALLED = shutil.which("bwrap") is not None


@needs_root
async def test_another_tenants_temp_files_are_unreadable(
    site: Site, session: aiohttp.ClientSession
) -> None:
    written = await probe(site, session, "alice", what="write-temp")
    assert written["ok"] is True, written
    secret = written["value"]
    assert exists(secret)  # alice's context stays warm, its temp dir with it
    outcome = await probe(site, session, "mallory", what="read", target=secret)
    unreachable(outcome)
    unreachable(await probe(site, session, "mallory", what="list", target=str(Path(secret).parent)))


@needs_root
async def test_the_journal_queue_log_and_data_dir_are_unreadable(
    site: Site, session: aiohttp.ClientSession
) -> None:
    [journal] = sorted(site.data_dir.glob("journal-*"))
    segment = next(p for p in journal.iterdir() if p.is_file())
    [log] = sorted(site.data_dir.glob("queue-*.log"))
    for what, target in (
        ("list", site.data_dir),
        ("list", journal),
        ("read", segment),
        ("read", log),
        ("read", site.data_dir / "pg.secret"),
        ("list", site.data_dir / "pg"),
    ):
        outcome = await probe(site, session, "mallory", what=what, target=str(target))
        if WALLED and target == site.data_dir:  # only the way down to its own directory
            assert outcome == {"ok": True, "value": ["run"]}, outcome
        else:
            refused(outcome)


@needs_root
async def test_the_daemons_environment_is_unreadable(
    site: Site, session: aiohttp.ClientSession
) -> None:
    target = f"/proc/{site.daemon.pid}/environ"
    outcome = await probe(site, session, "mallory", what="read", target=target)
    unreachable(outcome)


@needs_root
async def test_postgresql_cannot_be_reached(site: Site, session: aiohttp.ClientSession) -> None:
    # postmaster.pid: line 4 the port, line 5 the socket directory
    lines = (site.data_dir / "pg" / "postmaster.pid").read_text().splitlines()
    port, socket_dir = int(lines[3]), lines[4] or str(site.data_dir / "pg")
    socket_path = Path(socket_dir) / f".s.PGSQL.{port}"
    assert socket_path.exists(), socket_path
    refused(await probe(site, session, "mallory", what="unix", target=str(socket_path)))
    refused(await probe(site, session, "mallory", what="tcp", target=["127.0.0.1", port]))
    refused(await probe(site, session, "mallory", what="read", target=str(socket_path)))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    ("lang", "body"),
    [
        (
            "python",
            "def handler(payload, ctx):\n    while True:\n        print('x' * 65536)\n",
        ),
        ("shell", "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        (
            "node",
            "module.exports = () => { for (;;) console.log('x'.repeat(65536)); };\n",
        ),
    ],
)
async def test_printing_without_end_is_cut_off_and_memory_stays_flat(
    site: Site, session: aiohttp.ClientSession, lang: str, body: str
) -> None:
    api = Api(session, site.daemon.url, "mallory", site.tokens["mallory"])
    await Handlers(api).add(f"printer-{lang}", lang, body, timeout=3, maxAttempts=1)
    before = rss_kib(site.daemon.pid)
    [job_id] = await api.add(f"printer-{lang}", ["go"])
    job = await wait_done(api, job_id, within=60)
    assert job["code"] == "error", job
    assert "time" in (job["result"] or "").lower(), job  # cut off by its timeout, said so
    grown_mib = (rss_kib(site.daemon.pid) - before) / 1024
    assert grown_mib < 100, f"the daemon grew by {grown_mib:.0f} MiB"


async def test_other_processes_command_lines_show_no_code_names_or_tokens(
    site: Site, session: aiohttp.ClientSession
) -> None:
    """In a PID namespace of its own (the minimal view) a handler sees only its
    own processes. Where it sees every process's argv, a shell handler's command
    travels in its environment, and the daemon's argv holds neither tokens nor
    tenant names."""
    alice = Api(session, site.daemon.url, "alice", site.tokens["alice"])
    marker = "alice-private-command-5c1d"
    await Handlers(alice).add("slow", "shell", f"sleep 30 # {marker}", timeout=60)
    [job_id] = await alice.add("slow", ["x"])

    async def running() -> bool | None:
        reply = await alice.get_job(job_id)
        return True if reply.status == 200 and reply.json["state"] == "running" else None

    await until(running, 30, "alice's shell job to run")
    outcome = await probe(site, session, "mallory", what="cmdlines")
    assert outcome["ok"] is True, outcome
    cmdlines: dict[str, str] = outcome["value"]
    seen = "\n".join(cmdlines.values())
    if WALLED:
        assert "serve" not in seen and "sleep" not in seen, cmdlines  # its own only
    else:
        daemon = cmdlines.get(str(site.daemon.pid))
        assert daemon is not None and "serve" in daemon, "the probe did not see the daemon"
        assert "alice" not in daemon and "mallory" not in daemon, daemon
    assert marker not in seen, "another tenant's shell command is visible"
    for token in site.tokens.values():
        assert token not in seen, "a token is visible"
    assert (await alice.cancel(job_id)).status in (200, 409)


@needs_root
async def test_another_tenants_processes_cannot_be_signalled_or_read(
    site: Site, session: aiohttp.ClientSession
) -> None:
    mine = await probe(site, session, "alice", what="uid")
    assert mine["ok"] is True, mine
    pid = _context_of(mine["value"])  # alice's context stays warm: the process lives on
    outcome = await probe(site, session, "mallory", what="kill", target=pid)
    refused(outcome)
    # not there at all (a PID namespace of its own), or not permitted
    expected = "ProcessLookupError" if WALLED else "PermissionError"
    assert outcome["error"].startswith(expected), outcome
    for part in ("environ", "mem", "cwd/."):
        unreachable(
            await probe(site, session, "mallory", what="read", target=f"/proc/{pid}/{part}")
        )
    await probe(site, session, "alice", what="uid")
    assert _context_of(mine["value"]) == pid, "alice's context was killed"


def _context_of(uid: int) -> int:
    """The host pid of the python context running as ``uid`` (its pid inside a
    PID namespace of its own is not the host's)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()
        program = os.path.basename(cmdline.split(b"\0")[0])
        if int(uids[1]) == uid and program.startswith(b"python") and b"python_boot.py" in cmdline:
            return int(entry)  # the interpreter itself, not bubblewrap's processes
    raise AssertionError(f"no python context of uid {uid}")


def _plant(places: list[Path], marker: Path) -> None:
    for place in places:
        place.mkdir(parents=True)
        place.joinpath("index.js").write_text(
            f"require('fs').writeFileSync({json.dumps(str(marker))}, 'ran');\n"
            "module.exports = () => 'planted';\n"
        )


def _unplant(places: list[Path]) -> None:
    for place in places:
        shutil.rmtree(place, ignore_errors=True)
        with contextlib.suppress(OSError):
            place.parent.rmdir()  # only when it holds nothing else


async def test_a_module_planted_for_another_tenant_is_never_loaded(
    site: Site, session: aiohttp.ClientSession
) -> None:
    """mallory leaves ``node_modules`` where node's resolution would look from
    alice's directory (/tmp, above the data directory); alice's handler asks
    for a module it does not have. Nothing planted may run under alice's uid:
    her require fails as for any missing module, and builtins still work."""
    name = f"qd-planted-{os.getpid()}"
    marker = site.share(name) / "ran"  # writable by any handler
    planted = [Path("/tmp/node_modules", name), site.data_dir.parent / "node_modules" / name]
    try:
        _plant(planted, marker)
        api = Api(session, site.daemon.url, "alice", site.tokens["alice"])
        body = (
            "module.exports = (p) => {\n"
            "  require('node:crypto'); require('fs');\n"
            "  return require(p)();\n"
            "};\n"
        )
        await Handlers(api).add("requirer", "node", body, maxAttempts=1)
        for module in (name, str(planted[0] / "index.js")):
            [job_id] = await api.add("requirer", [module])
            job = await wait_done(api, job_id, within=30)
            assert job["code"] == "error", job
            assert "Cannot find module" in job["result"], job
        assert not exists(str(marker)), "a planted module ran in another tenant's handler"
    finally:
        _unplant(planted)


IMPORTER = """
const fs = require('node:fs');
module.exports = (name) => {
  fs.writeFileSync(name + '.mjs', `export { default } from '${name}';\\n`);
  return require(`./${name}.mjs`).default;
};
"""


async def test_a_module_planted_for_another_tenant_is_never_imported(
    site: Site, session: aiohttp.ClientSession
) -> None:
    """As above, for an ES module: alice's own module imports it by name, and
    node's ESM resolver walks up from it as its CommonJS loader does."""
    names = [f"qd-esm-tmp-{os.getpid()}", f"qd-esm-up-{os.getpid()}"]
    marker = site.share(names[0]) / "ran"
    above = site.data_dir.parent / "node_modules"
    planted = [Path("/tmp/node_modules", names[0]), above / names[1]]
    try:
        for place in planted:
            place.mkdir(parents=True)
            place.joinpath("package.json").write_text('{"type": "module", "main": "index.js"}')
            place.joinpath("index.js").write_text(
                f"import fs from 'node:fs';\nfs.writeFileSync({json.dumps(str(marker))}, 'ran');\n"
                "export default 'planted';\n"
            )
        api = Api(session, site.daemon.url, "alice", site.tokens["alice"])
        await Handlers(api).add("importer", "node", IMPORTER, maxAttempts=1)
        for name, job_id in zip(names, await api.add("importer", names), strict=True):
            job = await wait_done(api, job_id, within=30)
            assert job["code"] == "error", (name, job)
            # not found: not there (the minimal view), or not resolved (node_confine.js)
            assert f"Cannot find module '{name}'" in job["result"] or (
                f"Cannot find package '{name}'" in job["result"]
            ), (name, job)
        assert not exists(str(marker)), "a planted module ran in another tenant's handler"
    finally:
        _unplant(planted)
