"""The peers table (``bench.peers.run``): a row per workload, this project's figure
beside each peer's, the ratio to the best peer; printed, and written as JSON with
its PNG chart."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.peers import venv as peer_venv
from bench.procs import BenchError


@dataclass(slots=True)
class Row:
    workload: str
    unit: str
    higher_is_better: bool
    ours: float | None = None
    peers: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def best_peer(self) -> tuple[str, float] | None:
        known = [(name, v) for name, v in self.peers.items() if v is not None and v > 0]
        if not known:
            return None
        pick = max if self.higher_is_better else min
        return pick(known, key=lambda item: item[1])

    @property
    def ratio(self) -> float | None:
        """This project / the best peer, turned so that above 1 is better."""
        best = self.best_peer
        if self.ours is None or best is None or self.ours <= 0:
            return None
        return self.ours / best[1] if self.higher_is_better else best[1] / self.ours


def number(value: float | None) -> str:
    if value is None:
        return "FAILED"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def render(rows: Sequence[Row]) -> str:
    """The table: a column for each peer that has a figure (or a failure) in a row."""
    names = list(dict.fromkeys(name for row in rows for name in row.peers))
    head = ["workload", "unit", "this project", *names, "ratio", "of"]
    cells = []
    for row in rows:
        best = row.best_peer
        cells.append(
            [
                row.workload,
                row.unit,
                number(row.ours),
                *(number(row.peers.get(n)) for n in names),
                "" if row.ratio is None else f"{row.ratio:.2f}",
                "" if best is None else best[0],
            ]
        )
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(len(head))]

    def line(c: Sequence[str]) -> str:
        parts = [c[0].ljust(widths[0]), c[1].ljust(widths[1])]
        parts += [c[i].rjust(widths[i]) for i in range(2, len(head) - 1)]
        parts.append(c[-1].ljust(widths[-1]))
        return "  ".join(parts).rstrip()

    return "\n".join([line(head), "-" * (sum(widths) + 2 * (len(head) - 1)), *map(line, cells)])


def machine() -> dict[str, Any]:
    model = ""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                model = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(mem_kib / 2**20, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def write(rows: Sequence[Row], document: dict[str, Any], python: Path, out: Path) -> Path:
    """The JSON of the run and its PNG chart, in ``out``; the JSON's path."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    path = out / f"peers-{stamp}.json"
    document["rows"] = [
        {**asdict(row), "ratio": row.ratio, "best_peer": (row.best_peer or (None,))[0]}
        for row in rows
    ]
    path.write_text(json.dumps(document, indent=2) + "\n")
    png = path.with_suffix(".png")
    done = subprocess.run(
        [str(python), str(peer_venv.CHART), str(path), str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise BenchError(f"the chart failed: {done.stderr.strip()[-1000:]}")
    return path
