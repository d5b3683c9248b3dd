"""One HTTP load run against a server the bench started: wrk if installed, else Python.

Both generators run as processes of their own (never inside the server or the
bench), keep every connection alive with one request in flight, count 200s
apart from every other status and from socket errors, and check that each
200 carries one id per line sent. While the measured window runs, the
server's CPU use is sampled from /proc and, if asked, py-spy records it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import BenchError, Child, machine_busy, python
from bench.profile import Profiler

WRK_SCRIPT = """\
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
{headers}
local lines = {lines}
local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0; statuses = {{}} end
function response(status, headers, body)
  if status == 200 then
    local _, commas = string.gsub(body, ",", "")
    if commas + 1 == lines then ok = ok + 1 else bad = bad + 1 end
  else
    local key = tostring(status)
    statuses[key] = (statuses[key] or 0) + 1
  end
end
function done(summary, latency, requests)
  local okt, badt, agg, parts = 0, 0, {{}}, {{}}
  for _, t in ipairs(threads) do
    okt = okt + t:get("ok"); badt = badt + t:get("bad")
    for k, v in pairs(t:get("statuses")) do agg[k] = (agg[k] or 0) + v end
  end
  for k, v in pairs(agg) do table.insert(parts, string.format('"%s": %d', k, v)) end
  local e = summary.errors
  io.write(string.format(
    'RESULT {{"ok": %d, "bad": %d, "statuses": {{%s}}, "duration_us": %d, ' ..
    '"socket_errors": %d, "p50_us": %.1f, "p99_us": %.1f}}\\n',
    okt, badt, table.concat(parts, ", "), summary.duration,
    e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(slots=True)
class Load:
    """What to send, how hard, for how long."""

    url: str
    body: bytes
    headers: dict[str, str]
    conns: int
    warmup: float
    duration: float
    procs: int = 1  # Python generator processes, or wrk threads

    @property
    def lines(self) -> int:
        return self.body.rstrip(b"\n").count(b"\n") + 1


@dataclass(slots=True)
class LoadResult:
    generator: str
    ok: int  # 200 responses with the right number of ids, in the window
    seconds: float
    lines: int
    errors: int  # socket errors and malformed 200s
    statuses: dict[str, int] = field(default_factory=dict)  # every non-200 status
    p50_ms: float | None = None
    p99_ms: float | None = None
    server_cpu: float = 0.0  # fraction of one core the server used in the window
    generator_cpu: float | None = None  # fraction of one core, Python generator only
    machine_cpu: float = 0.0  # cores busy on the whole machine in the window (anyone's)

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.seconds

    @property
    def jobs_per_s(self) -> float:
        return self.ok * self.lines / self.seconds

    @property
    def failures(self) -> int:
        return self.errors + sum(self.statuses.values())

    def describe(self) -> str:
        parts = [f"{self.generator}"]
        if self.p50_ms is not None and self.p99_ms is not None:
            parts.append(f"p50 {self.p50_ms:.1f} ms p99 {self.p99_ms:.1f} ms")
        parts.append(f"server CPU {self.server_cpu:.0%}")
        parts.append(f"machine {self.machine_cpu:.1f}/{os.cpu_count()} cores busy")
        if self.generator_cpu is not None:
            parts.append(f"generator CPU {self.generator_cpu:.0%}")
        if self.failures:
            bad = ", ".join(f"{n}x{s}" for s, n in sorted(self.statuses.items()))
            parts.append(f"NON-200: {bad or '-'}; errors {self.errors}")
        return "; ".join(parts)


def generator_name(choice: str) -> str:
    """``wrk`` when asked or (``auto``) when installed, else ``python``."""
    if choice == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    if choice == "wrk" and not shutil.which("wrk"):
        raise BenchError("--generator wrk: wrk is not installed (apt-get install wrk)")
    return choice


def run_load(
    generator: str,
    load: Load,
    server: Child,
    work: Path,
    *,
    profiler: Profiler | None = None,
) -> LoadResult:
    body_file = work / f"body-{load.lines}.txt"
    body_file.write_bytes(load.body)
    if generator == "wrk":
        return _run_wrk(load, server, work, body_file, profiler)
    return _run_python(load, server, work, body_file, profiler)


def _run_python(
    load: Load, server: Child, work: Path, body_file: Path, profiler: Profiler | None
) -> LoadResult:
    argv = python(
        "-m",
        "bench.loadgen",
        load.url,
        f"--body-file={body_file}",
        f"--procs={load.procs}",
        f"--conns={load.conns}",
        f"--warmup={load.warmup}",
        f"--duration={load.duration}",
    )
    argv += [f"--header={name}: {value}" for name, value in load.headers.items()]
    gen = Child("loadgen", argv, log_dir=work)
    try:
        gen.wait_line("WINDOW start", timeout=load.warmup + 30)
        cpu0, busy0, t0 = server.cpu_seconds(), machine_busy()[0], time.monotonic()
        if profiler is not None:
            profiler.start(server.pid, load.duration)
        gen.wait_line("WINDOW end", timeout=load.duration + 30)
        elapsed = time.monotonic() - t0
        cpu = (server.cpu_seconds() - cpu0) / elapsed
        machine = (machine_busy()[0] - busy0) / elapsed
        data = json.loads(gen.wait_line("RESULT ", timeout=60)[len("RESULT ") :])
    finally:
        gen.stop(grace=5, group=True)
        if profiler is not None:
            profiler.finish()
    return LoadResult(
        generator=f"python x{data['procs']}",
        ok=data["ok"],
        seconds=data["duration"],
        lines=load.lines,
        errors=data["errors"],
        statuses=data["statuses"],
        p50_ms=data.get("p50_ms"),
        p99_ms=data.get("p99_ms"),
        server_cpu=cpu,
        generator_cpu=data["cpu"] / data["duration"],
        machine_cpu=machine,
    )


def _wrk(load: Load, script: Path, seconds: int, work: Path) -> subprocess.Popen[bytes]:
    argv = [
        "wrk",
        f"-t{load.procs}",
        f"-c{max(load.conns, load.procs)}",
        f"-d{seconds}s",
        "--timeout=10s",
        f"-s{script}",
        load.url,
    ]
    out = (work / "wrk.out").open("wb")
    try:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BenchError("wrk did not finish in time") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _run_wrk(
    load: Load, server: Child, work: Path, body_file: Path, profiler: Profiler | None
) -> LoadResult:
    headers = "\n".join(
        f"wrk.headers[{json.dumps(name)}] = {json.dumps(value)}"
        for name, value in load.headers.items()
    )
    script = work / "wrk.lua"
    script.write_text(WRK_SCRIPT.format(body=body_file, headers=headers, lines=load.lines))
    if load.warmup > 0:
        _wait(_wrk(load, script, max(1, math.ceil(load.warmup)), work), load.warmup + 30)
    seconds = max(1, round(load.duration))
    cpu0, busy0, t0 = server.cpu_seconds(), machine_busy()[0], time.monotonic()
    proc = _wrk(load, script, seconds, work)
    try:
        if profiler is not None:
            profiler.start(server.pid, seconds)
        _wait(proc, seconds + 30)
    finally:
        if profiler is not None:
            profiler.finish()
    elapsed = time.monotonic() - t0
    cpu = (server.cpu_seconds() - cpu0) / elapsed
    machine = (machine_busy()[0] - busy0) / elapsed
    text = (work / "wrk.out").read_text(errors="replace")
    result = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if not result:
        raise BenchError(f"wrk printed no result:\n{text}")
    data = json.loads(result[-1][len("RESULT ") :])
    return LoadResult(
        generator=f"wrk -t{load.procs}",
        ok=data["ok"],
        seconds=data["duration_us"] / 1e6,
        lines=load.lines,
        errors=data["bad"] + data["socket_errors"],
        statuses=data["statuses"],
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        server_cpu=cpu,
        machine_cpu=machine,
    )
