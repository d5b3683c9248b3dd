"""Python contexts through RunnerPool: real sandboxed subprocesses, PROTOCOL.md end to end."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.pool import RunnerPool, RunnerSettings

# RLIMIT_NPROC counts every process and thread of the shared run-as uid, including
# other contexts on this machine: the default 64 is too tight for tests that fork.
PROCESSES = 4096


@pytest.fixture
async def pool(work_root: Path) -> AsyncIterator[RunnerPool]:
    pool = RunnerPool(RunnerSettings(work_root=work_root, failure_backoff=0.5, processes=PROCESSES))
    yield pool
    await pool.close()


def spec(body: str, *, type: str = "t", version: str = "v1", **kw: object) -> HandlerSpec:
    return HandlerSpec(
        version=version,
        client="acme",
        type=type,
        lang="python",
        body=body,
        **kw,  # type: ignore[arg-type]
    )


def jobs(*payloads: str) -> list[JobInput]:
    return [JobInput(id=f"id-{i}", payload=p, attempt=1) for i, p in enumerate(payloads)]


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def until(check: object, within: float = 5.0) -> None:
    """Poll ``check()`` until true, failing after ``within`` seconds."""
    assert callable(check)
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# a context's own mark: handlers run in a PID namespace of their own, where
# os.getpid() is the same small number in every context
CONTEXT_MARK = "import os\nMARK = os.urandom(8).hex()\ndef handler(p, ctx):\n    return MARK\n"


def marked(mark: str) -> list[int]:
    """The live host pids whose command line holds ``mark`` (a handler's own
    children are found this way: their pids inside the namespace are not the host's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def only_context_pid(pool: RunnerPool) -> int:
    (context,) = pool.contexts()
    assert context.pid is not None
    return context.pid


SHAPES = """
import json
def handler(p, ctx):
    if p == "none": return None
    if p == "int": return 404
    if p == "str": return "hello"
    if p == "tuple": return (201, "made")
    if p == "list": return [102, "later"]
    if p == "dict": return {"a": [1, 2]}
    if p == "pair-obj": return (299, {"b": None})
    if p == "pair-none": return (202, None)
    if p == "bool": return True
    if p == "raise": raise ValueError("boom " + p)
    if p == "bad-code": return 42
    if p == "bad-json": return {1, 2}
    return "?"
"""


async def test_return_shapes(pool: RunnerPool) -> None:
    payloads = ["none", "int", "str", "tuple", "list", "dict", "pair-obj", "pair-none", "bool"]
    payloads += ["raise", "bad-code", "bad-json"]
    results = await pool.run_batch(spec(SHAPES), jobs(*payloads))
    got = {p: (r.exitcode, r.result) for p, r in zip(payloads, results, strict=True)}
    assert got["none"] == (200, None)
    assert got["int"] == (404, None)
    assert got["str"] == (200, "hello")
    assert got["tuple"] == (201, "made")
    assert got["list"] == (102, "later")
    assert got["dict"] == (200, '{"a":[1,2]}')
    assert got["pair-obj"] == (299, '{"b":null}')
    assert got["pair-none"] == (202, None)
    assert got["bool"] == (200, "true")
    assert got["raise"] == (500, "ValueError: boom raise")
    assert got["bad-code"] == (500, "invalid exit code 42")
    assert got["bad-json"][0] == 500 and "TypeError" in str(got["bad-json"][1])
    assert [r.id for r in results] == [j.id for j in jobs(*payloads)]
    assert all(r.ran for r in results)
    # the traceback is in the failing job's log, pointing at the tenant's line
    raised = results[payloads.index("raise")]
    assert any('File "<handler>", line 13, in handler' in line for line in raised.log)


async def test_async_handler(pool: RunnerPool) -> None:
    body = (
        "import asyncio\n"
        "async def handler(p, ctx):\n"
        "    await asyncio.sleep(0)\n"
        "    loop = asyncio.get_running_loop()\n"
        "    return p.upper() + ' ' + str(id(loop))\n"
    )
    first, second = await pool.run_batch(spec(body), jobs("a", "b"))
    (third,) = await pool.run_batch(spec(body), jobs("c"))
    assert (first.exitcode, second.exitcode, third.exitcode) == (200, 200, 200)
    assert first.result and second.result and third.result
    assert first.result.startswith("A ") and third.result.startswith("C ")
    # one persistent event loop for the life of the context
    assert len({r.result.split()[1] for r in (first, second, third) if r.result}) == 1


async def test_output_and_emits_attributed_to_their_job(pool: RunnerPool) -> None:
    body = (
        "import sys\n"
        "def handler(p, ctx):\n"
        "    print('log of', p, ctx.id, ctx.attempt, ctx.type)\n"
        "    print('J: next|' + p)\n"
        "    sys.stdout.write('S: 203 set by ' + p + '\\n')\n"
        "    ctx.emit('other', {'k': p})\n"
        "    ctx.emit('plain', 'text ' + p)\n"
        "    return 'ignored'\n"
    )
    results = await pool.run_batch(spec(body, type="mytype"), jobs("a", "b", "c"))
    for i, (payload, result) in enumerate(zip("abc", results, strict=True)):
        assert result.log == [f"log of {payload} id-{i} 1 mytype"]
        assert result.emits == [
            ("other", f'{{"k":"{payload}"}}'),
            ("plain", f"text {payload}"),
            ("next", payload),
        ]
        assert (result.exitcode, result.result) == (203, f"set by {payload}")


async def test_before_runs_once_per_context(pool: RunnerPool) -> None:
    handler = spec(
        "import os\nMARK = os.urandom(8).hex()\n"
        "def handler(p, ctx):\n    return f'{MARK} {runs}'\n",
        before="runs = globals().get('runs', 0) + 1",
    )
    first = await pool.run_batch(handler, jobs("a", "b"))
    second = await pool.run_batch(handler, jobs("c"))
    (answer,) = {r.result for r in first + second}  # one context
    assert answer is not None and answer.endswith(" 1")


async def test_before_each_and_after_each_order(pool: RunnerPool) -> None:
    handler = spec(
        "def handler(p, ctx):\n    events.append('job ' + p)\n    return ','.join(events)\n",
        before="events = []",
        before_each="events.append('beforeEach')",
        after_each="import asyncio\nawait asyncio.sleep(0)\nevents.append('afterEach')",
    )
    a, b = await pool.run_batch(handler, jobs("a", "b"))
    (c,) = await pool.run_batch(handler, jobs("c"))
    assert a.result == "beforeEach,job a"
    assert b.result == "beforeEach,job a,job b"
    assert c.result == "beforeEach,job a,job b,afterEach,beforeEach,job c"


async def test_before_each_failure_fails_the_batch(pool: RunnerPool) -> None:
    handler = spec("def handler(p, ctx):\n    return p\n", before_each="raise KeyError('nope')")
    results = await pool.run_batch(handler, jobs("a", "b"))
    assert [(r.exitcode, r.ran) for r in results] == [(500, True), (500, True)]
    assert results[0].result == "beforeEach failed: KeyError: 'nope'"


PAYLOADS = [
    "plain",
    "with\rcarriage\rreturns\r",
    "ünïcødé ✓ 𝄞 \u2028 \u2029 \ufeff",
    '{"json": [1, 2, {"x": "y"}], "esc": "\\n\\u0000"}',
    "tab\there | pipe , comma / slash \\ backslash",
    "\x01\x02\x1b[31mred\x7f",
    "x" * (1 << 20),
]


async def test_payloads_pass_through_unchanged(pool: RunnerPool) -> None:
    results = await pool.run_batch(spec("def handler(p, ctx):\n    return p\n"), jobs(*PAYLOADS))
    assert [r.result for r in results] == PAYLOADS


async def test_binary_garbage_on_stdout_does_not_break_framing(pool: RunnerPool) -> None:
    body = (
        "import sys\n"
        "def handler(p, ctx):\n"
        "    if p == 'garbage':\n"
        "        sys.stdout.buffer.write(bytes(range(256)) * 4)\n"
        "        print('\\x00\\x00\\x00\\x04\\xff NUL and length-like bytes \\ud800')\n"
        "        sys.stdout.flush()\n"
        "        return '\\x00 result with NUL'\n"
        "    print('clean', p)\n"
        "    return p\n"
    )
    results = await pool.run_batch(spec(body), jobs("before", "garbage", "after"))
    assert [r.exitcode for r in results] == [200, 200, 200]
    assert results[1].result == "\x00 result with NUL"
    assert results[0].log == ["clean before"] and results[2].log == ["clean after"]
    assert any("NUL and length-like bytes" in line for line in results[1].log)


async def test_new_version_retires_old_contexts(pool: RunnerPool) -> None:
    old = spec("def handler(p, ctx):\n    return 'old'\n", version="v1")
    new = spec("def handler(p, ctx):\n    return 'new'\n", version="v2")
    assert (await pool.run_batch(old, jobs("a")))[0].result == "old"
    old_pid = only_context_pid(pool)
    assert pool.warm() == {"acme-t"}
    pool.retire("acme", "t")
    assert pool.warm() == set()
    await until(lambda: pid_gone(old_pid))
    assert (await pool.run_batch(new, jobs("a")))[0].result == "new"
    assert only_context_pid(pool) != old_pid


async def test_busy_context_retires_after_its_batch(pool: RunnerPool) -> None:
    slow = spec("import time\ndef handler(p, ctx):\n    time.sleep(0.3)\n    return p\n")
    task = asyncio.create_task(pool.run_batch(slow, jobs("a")))
    await until(lambda: bool(pool.contexts()) and pool.contexts()[0].pid is not None)
    pid = only_context_pid(pool)
    pool.retire("acme", "t")
    (result,) = await task
    assert result.exitcode == 200
    assert pool.warm() == set()
    await until(lambda: pid_gone(pid))


async def test_crash_mid_batch(pool: RunnerPool) -> None:
    body = (
        "import os, sys\n"
        "def handler(p, ctx):\n"
        "    if p == 'crash':\n"
        "        sys.stderr.write('about to die\\n')\n"
        "        os._exit(3)\n"
        "    return MARK\n"
    )
    body = "MARK = __import__('os').urandom(8).hex()\n" + body
    await pool.run_batch(spec(body), jobs("ok"))
    pid = only_context_pid(pool)
    results = await pool.run_batch(spec(body), jobs("ok", "crash", "later", "later2"))
    assert [(r.exitcode, r.ran) for r in results] == [
        (200, True),
        (500, True),
        (100, False),
        (100, False),
    ]
    assert results[1].result == "context died (exit status 3): about to die"
    assert pool.contexts() == []
    (again,) = await pool.run_batch(spec(body), jobs("ok"))
    assert again.exitcode == 200 and again.result != results[0].result
    assert pid_gone(pid)


async def test_timeout_kills_the_process_group(pool: RunnerPool) -> None:
    body = (
        "import os, subprocess\n"
        "def handler(p, ctx):\n"
        "    if p == 'spin':\n"
        "        child = subprocess.Popen(['sleep', '60.0417'])\n"
        "        print('J: child|' + str(child.pid))\n"  # never delivered: the job times out
        "        while True: pass\n"
        "    return 'ran'\n"
    )
    handler = spec(body, timeout=1.0)
    await pool.run_batch(handler, jobs("ok"))
    pid = only_context_pid(pool)
    started = time.monotonic()
    results = await pool.run_batch(handler, jobs("ok", "spin", "never"))
    assert time.monotonic() - started < 5
    assert [(r.exitcode, r.ran) for r in results] == [(200, True), (504, True), (100, False)]
    assert results[1].result == "timed out after 1s"
    assert pid_gone(pid)
    await until(lambda: marked("60.0417") == [])
    assert pool.contexts() == []
    (again,) = await pool.run_batch(handler, jobs("ok"))
    assert again.exitcode == 200


async def test_fatal_handler_fails_jobs_and_is_not_respawned(pool: RunnerPool) -> None:
    broken = spec("def handler(p, ctx):\n    return (\n")
    results = await pool.run_batch(broken, jobs("a", "b"))
    assert [(r.exitcode, r.result) for r in results] == [(500, "line 2: '(' was never closed")] * 2
    started = time.monotonic()
    again = await pool.run_batch(broken, jobs("c"))
    assert time.monotonic() - started < 0.02  # cached: no new process
    assert again[0].result == "line 2: '(' was never closed"
    missing = await pool.run_batch(spec("x = 1", type="u"), jobs("a"))
    assert missing[0].result == "the body does not define handler(payload, ctx)"
    failing = await pool.run_batch(
        spec("def handler(p, c): pass", type="w", before="1/0"), jobs("a")
    )
    assert failing[0].result == "before failed: ZeroDivisionError: division by zero"
    assert pool.contexts() == []


async def test_contexts_are_recycled_after_max_jobs(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, max_jobs_per_context=150))
    try:
        handler = spec(CONTEXT_MARK)
        batch = [JobInput(id=str(i), payload=str(i), attempt=2) for i in range(100)]
        served: dict[str | None, int] = {}
        pids: set[int] = set()
        for _ in range(4):
            results = await pool.run_batch(handler, batch)
            (mark,) = {r.result for r in results}  # a batch runs in one context
            served[mark] = served.get(mark, 0) + len(results)
            pids |= {c.pid for c in pool.contexts() if c.pid is not None}
        assert len(served) >= 2
        assert max(served.values()) <= 200  # no batch starts in a context past 150 jobs
    finally:
        await pool.close()
    assert pids and all(pid_gone(pid) for pid in pids)


async def test_successor_is_started_before_the_limit(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, max_jobs_per_context=400))
    try:
        handler = spec(CONTEXT_MARK)
        batch = [JobInput(id=str(i), payload=str(i), attempt=1) for i in range(100)]
        (old_mark,) = {r.result for r in await pool.run_batch(handler, batch)}
        old = only_context_pid(pool)
        await pool.run_batch(handler, batch)  # 200 of 400 jobs: the successor starts now
        await until(lambda: [c.pid for c in pool.contexts()] not in ([old], []))
        new = only_context_pid(pool)  # it took over at once; the idle old one is closing
        assert new != old
        await until(lambda: pid_gone(old))
        results = await pool.run_batch(handler, batch)
        (mark,) = {r.result for r in results}
        assert mark != old_mark and only_context_pid(pool) == new
    finally:
        await pool.close()


async def test_throughput_smoke(pool: RunnerPool) -> None:
    handler = spec("def handler(p, ctx):\n    pass\n")
    batch = [JobInput(id=str(i), payload="p", attempt=1) for i in range(100)]
    await pool.run_batch(handler, batch)
    started = time.perf_counter()
    for _ in range(20):
        results = await pool.run_batch(handler, batch)
    rate = 2000 / (time.perf_counter() - started)
    assert all(r.exitcode == 200 for r in results)
    assert rate > 5000, rate  # measured ~50k/s; a loose floor for slow CI machines


async def test_result_and_log_are_bounded(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, result_limit=1000, max_log_lines=5))
    try:
        body = "def handler(p, ctx):\n    for i in range(50): print(i)\n    return 'r' * 5000\n"
        (result,) = await pool.run_batch(spec(body), jobs("a"))
        assert result.result == "r" * 1000
        assert result.log == ["0", "1", "2", "3", "4", "… 45 more lines dropped"]
    finally:
        await pool.close()


async def test_what_jobs_print_is_read_within_the_tenants_output_budget(work_root: Path) -> None:
    """A job's printed output comes back in its result frame: it counts against the
    tenant's --output-rate like a pipe's, and the wait is not the next job's time."""
    mib = 1 << 20
    settings = RunnerSettings(work_root=work_root, output_rate=2 * mib, output_burst=mib)
    pool = RunnerPool(settings)
    try:
        body = "def handler(p, ctx):\n    print('\\n' * (1 << 20), end='')\n    return p\n"
        started = time.monotonic()
        results = await pool.run_batch(spec(body, timeout=0.5), jobs("a", "b", "c", "d"))
        took = time.monotonic() - started
        assert [r.result for r in results] == ["a", "b", "c", "d"], results
        # 4 MiB printed, 1 MiB of burst: 3 MiB at 2 MiB/s
        assert pool.output_budget.throttled["acme"] >= 1.4
        assert took >= 1.4
    finally:
        await pool.close()


async def test_close_leaves_nothing_behind(work_root: Path) -> None:
    pool = RunnerPool(RunnerSettings(work_root=work_root, processes=PROCESSES))
    await pool.run_batch(spec(CONTEXT_MARK), jobs("a"))
    pid = only_context_pid(pool)
    await pool.close()
    assert pid_gone(pid)
    assert os.listdir(work_root) == ["bootstrap"]
    assert await pool.run_batch(spec("def handler(p, c): pass"), jobs("a")) == [
        JobResult(
            id="id-0", exitcode=100, result="not started: the runner pool is closed", ran=False
        )
    ]
