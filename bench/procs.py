"""Child processes the bench starts, and stops again whatever happens.

Each child runs in a session of its own, so a Ctrl-C in the terminal reaches
only the bench, whose ``finally`` blocks then stop the children in order
(daemons get SIGTERM and drain; anything still alive after the grace period
is killed by pid, or by its own process group for the load generator's
workers).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the project: `python -m bench…` runs from here
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    """A section could not run; the message says why."""


class Child:
    """A subprocess whose stdout lines are read by a thread; stderr goes to a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.stderr.log"
        self._log = self.log_path.open("wb")
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.output.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The next stdout line starting with ``prefix``; BenchError if none comes."""
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise BenchError(
                    f"{self.name}: no {prefix!r} line within {timeout:.0f} s\n{self.log_tail()}"
                ) from None
            if line is None:
                self.proc.wait()
                raise BenchError(
                    f"{self.name} exited with status {self.proc.returncode} "
                    f"before printing {prefix!r}\n{self.log_tail()}"
                )
            if line.startswith(prefix):
                return line

    def log_tail(self, lines: int = 15) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n".join(f"    {self.name}: {line}" for line in text)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far (Linux /proc)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def stop(self, *, grace: float = 15.0, group: bool = False) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; ``group`` also kills its workers."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    print(f"  {self.name} did not stop in {grace:.0f} s: killed", file=sys.stderr)
                    self.proc.kill()
                    self.proc.wait()
            if group:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)  # the session this child leads
        finally:
            self._reader.join(timeout=2)
            self._log.close()


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    idle = fields[3] + fields[4]
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def python(*args: str) -> list[str]:
    """argv running this interpreter (the project's venv) on ``args``."""
    return [sys.executable, *args]


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/<pid>/stat after the command: state, ppid, ...) of
    every process still there when read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry.name), fields


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """pid → (parent pid, own CPU seconds, CPU seconds of reaped children), every process."""
    table: dict[int, tuple[int, float, float]] = {}
    for pid, fields in proc_stats():
        own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        reaped = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        table[pid] = (int(fields[1]), own, reaped)
    return table


def tree_cpu(roots: Sequence[int]) -> tuple[float, float]:
    """(CPU seconds of the ``roots``, of all their live descendants plus the children
    they reaped) so far. Deltas of both over a window split a server's own CPU from
    its subprocesses' (runner contexts; PostgreSQL backends)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    own = sum(table[pid][1] for pid in roots if pid in table)
    below = sum(table[pid][2] for pid in roots if pid in table)
    stack = [c for pid in roots for c in children.get(pid, [])]
    while stack:
        pid = stack.pop()
        below += table[pid][1] + table[pid][2]
        stack.extend(children.get(pid, []))
    return own, below
