"""``--profile``: py-spy samples the daemon over a measured window.

py-spy (``pip install py-spy``; not a project dependency) records collapsed
stacks (``--format raw``) without pausing the daemon (``--nonblocking``);
the summary gives, for the busiest functions, the share of samples in which
each is on the stack (inclusive) and on top of it (self). py-spy leaves out
idle threads, so the samples are CPU time (of the event loop and threads).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

# frames every stack shares (interpreter start-up, the event loop, thread bootstrap)
PLUMBING = {
    "<module> (__main__.py)",
    "_run_code (<frozen runpy>)",
    "_run_module_as_main (<frozen runpy>)",
    "main (cli.py)",
    "<module> (bare_server.py)",
    "main (bare_server.py)",
    "run (runners.py)",
    "Runner.run (runners.py)",
    "BaseEventLoop.run_until_complete (base_events.py)",
    "BaseEventLoop.run_forever (base_events.py)",
    "BaseEventLoop._run_once (base_events.py)",
    "Handle._run (events.py)",
    "Thread._bootstrap (threading.py)",
    "Thread._bootstrap_inner (threading.py)",
    "Thread.run (threading.py)",
}


def py_spy() -> str | None:
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    return found


class Profiler:
    """One py-spy recording at a time, into ``out_dir/<name>.txt`` (raw collapsed stacks)."""

    def __init__(
        self, out_dir: Path, name: str, rate: int = 200, *, subprocesses: bool = False
    ) -> None:
        self.path = out_dir / f"{name}.txt"
        self.summary = ""
        self._rate = rate
        self._subprocesses = subprocesses  # also sample its children (runner contexts)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = out_dir / f"{name}.py-spy.log"

    def start(self, pid: int, seconds: float) -> None:
        exe = py_spy()
        if exe is None:
            self.summary = "py-spy not installed (pip install py-spy)"
            return
        argv = [
            exe,
            "record",
            "--nonblocking",
            "--format=raw",
            f"--rate={self._rate}",
            f"--duration={max(1, round(seconds))}",
            f"--pid={pid}",
            f"--output={self.path}",
        ]
        if self._subprocesses:
            argv.append("--subprocesses")
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        """End the recording now (SIGINT: py-spy writes what it has), then ``finish``."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        self.finish()

    def finish(self) -> None:
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        if self.path.exists():
            self.summary = summarize_processes(self.path)
        else:
            self.summary = f"py-spy wrote nothing: {self._log.read_text(errors='replace')[-500:]}"


def _frame(text: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)"
    name, _, where = text.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    short = "/".join(parts[-2:]) if parts[-1] == "__init__.py" else parts[-1]
    return f"{name} ({short})"


def _process_group(stack: str) -> str:
    """ "" for the recorded process itself; for a descendant (``--subprocesses``), its
    command line's last word (e.g. ``python_boot.py``)."""
    procs = [f for f in stack.split(";") if f.startswith("process ") and ':"' in f]
    if len(procs) <= 1:
        return ""
    command = procs[-1].split(':"', 1)[1].rstrip('"').split()
    return "subprocesses: " + (command[-1].rsplit("/", 1)[-1] if command else "?")


def summarize_processes(path: Path, top: int = 30) -> str:
    """``summarize`` for the recorded process, then for each kind of its subprocesses."""
    groups: dict[str, list[str]] = {}
    for line in path.read_text(errors="replace").splitlines():
        groups.setdefault(_process_group(line), []).append(line)
    if set(groups) <= {""}:
        return summarize(path, top)
    total = sum(_samples(lines) for lines in groups.values())
    parts = []
    small = 0.0
    for name in sorted(groups):
        lines = groups[name]
        share = 100 * _samples(lines) / total if total else 0.0
        if name and share < 1.0:  # e.g. the exec wrappers a context starts through
            small += share
            continue
        parts.append(f"[{name or 'the process itself'}: {share:.0f}% of all samples]")
        parts.append(summarize_lines(lines, top if not name else top // 2))
    if small:
        parts.append(f"[other subprocesses: {small:.1f}% of all samples]")
    return "\n".join(parts)


def _samples(lines: list[str]) -> int:
    count = 0
    for line in lines:
        text = line.rpartition(" ")[2]
        if text.isdigit():
            count += int(text)
    return count


def summarize(path: Path, top: int = 30) -> str:
    """Busiest functions by samples on the stack (inclusive) and on top (self)."""
    return summarize_lines(path.read_text(errors="replace").splitlines(), top)


def summarize_lines(raw: list[str], top: int = 30) -> str:
    """``summarize`` of the lines of a raw (collapsed stacks) recording."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw:
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            _frame(f) for f in stack.split(";") if f and " (" in f and not f.startswith("process ")
        ]
        total += count
        loop = "BaseEventLoop.run_forever (base_events.py)" in frames
        threads["event loop" if loop else "other threads"] += count
        for frame in set(frames) - PLUMBING:
            inclusive[frame] += count
        if frames:
            own[frames[-1]] += count
    if total == 0:
        return "no samples"
    share = ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in threads.most_common())
    lines = [f"{total} non-idle samples ({share}); % of these samples:"]
    lines.append("  incl.   self  function")
    for frame, count in inclusive.most_common(top):
        lines.append(f"  {100 * count / total:5.1f}% {100 * own[frame] / total:5.1f}%  {frame}")
    lines.append("  top self time:")
    for frame, count in own.most_common(20):
        lines.append(f"  {100 * count / total:5.1f}%  {frame}")
    return "\n".join(lines)
