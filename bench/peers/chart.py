"""Draws a ``python -m bench --peers`` result (its JSON) as a PNG: one panel a workload,
one bar a system, the figure written on each bar. Runs in the peers' environment,
where matplotlib is installed: ``python chart.py RESULT.json OUT.png``."""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OURS = "this project"
COLOURS = {
    OURS: "#2b7a3d",
    "pgqueuer": "#4c72b0",
    "procrastinate": "#c44e52",
    "graphile-worker": "#8172b2",
}


def main(source: str, target: str) -> int:
    with open(source) as f:
        document = json.load(f)
    rows = document["rows"]
    columns = 3
    lines = -(-len(rows) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5 * columns, 3.2 * lines), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=False):
        names = [OURS, *row["peers"]]
        values = [row["ours"], *row["peers"].values()]
        shown = [v or 0.0 for v in values]
        bars = ax.bar(names, shown, color=[COLOURS.get(n, "#888888") for n in names])
        for bar, value in zip(bars, values, strict=True):
            label = (
                "failed" if value is None else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
            )
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        better = "higher is better" if row["higher_is_better"] else "lower is better"
        ratio = "" if row["ratio"] is None else f"; ratio {row['ratio']:.2f}"
        ax.set_title(f"{row['workload']}\n{row['unit']}, {better}{ratio}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.margins(y=0.15)
    for ax in list(axes.flat)[len(rows) :]:
        ax.axis("off")
    machine = document["machine"]
    ran = {name for row in rows for name in row["peers"]}
    node = "graphile-worker" in ran
    versions = ", ".join(
        f"{k} {v}" for k, v in document["versions"].items() if k in ran or (node and k == "node")
    )
    fig.suptitle(
        f"{document['date']}: {machine['cores']} cores, {machine['cpu']}; {versions}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
