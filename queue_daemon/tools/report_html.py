"""``queue-daemon stats --html FILE``: one self-contained HTML page with inline
SVG charts drawn here (no scripts, no fonts or styles fetched from anywhere):
throughput over time, latency percentiles per type, outcomes per type.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from html import escape
from typing import Any

WIDTH = 900
MAX_POINTS = 300  # the timeline is coarsened to at most this many points
COLORS = {
    "added": "#4878d0",
    "done": "#6acc64",
    "ok": "#6acc64",
    "failed": "#ee854a",
    "error": "#d65f5f",
    "retry": "#956cb4",
    "cancelled": "#8c8c8c",
    "p50": "#82c6e2",
    "p95": "#4878d0",
    "p99": "#1f3f80",
}


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def _fmt(value: float) -> str:
    if value >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">'
        f"{escape(text)}</text>"
    )


def _legend(x: float, y: float, names: list[str]) -> str:
    parts = []
    for name in names:
        parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" '
                     f'fill="{COLORS[name]}"/>')  # fmt: skip
        parts.append(_text(x + 14, y, name))
        x += 20 + 7 * len(name) + 10
    return "".join(parts)


def _coarsen(points: list[dict[str, int]], bucket_ms: int) -> tuple[list[dict[str, int]], int]:
    """Merge neighbouring minutes so that at most ``MAX_POINTS`` remain (counts per
    the new bucket), filling minutes without events with zeros."""
    if not points:
        return [], bucket_ms
    first, last = points[0]["t"], points[-1]["t"]
    buckets = (last - first) // bucket_ms + 1
    factor = max(1, math.ceil(buckets / MAX_POINTS))
    size = bucket_ms * factor
    merged: dict[int, dict[str, int]] = {}
    for p in points:
        key = first + (p["t"] - first) // size * size
        slot = merged.setdefault(key, {"t": key, "added": 0, "done": 0})
        slot["added"] += p["added"]
        slot["done"] += p["done"]
    out = [merged.get(t, {"t": t, "added": 0, "done": 0}) for t in range(first, last + 1, size)]
    return out, size


def throughput_chart(report: dict[str, Any]) -> str:
    """Jobs added and done per minute over time (lines)."""
    timeline = report["timeline"]
    points, size = _coarsen(timeline["points"], timeline["bucket_ms"])
    height, left, right, top, bottom = 260, 60, 20, 30, 40
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    parts = [f'<svg class="chart" id="throughput" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">']  # fmt: skip
    parts.append(_text(left, 18, "Throughput over time (jobs per minute)", size=13))
    if not points:
        parts.append(_text(WIDTH / 2, height / 2, "no events", "middle"))
        return "".join(parts) + "</svg>"
    per_minute = size / 60_000
    peak = max(max(p["added"], p["done"]) for p in points) / per_minute or 1.0
    span = max(points[-1]["t"] - points[0]["t"], 1)

    def xy(p: dict[str, int], key: str) -> str:
        x = left + (p["t"] - points[0]["t"]) / span * plot_w if len(points) > 1 else left
        y = top + plot_h - (p[key] / per_minute) / peak * plot_h
        return f"{x:.1f},{y:.1f}"

    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
                 f'y2="{top + plot_h}" stroke="#444"/>')  # fmt: skip
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>')
    parts.append(_text(left - 6, top + 4, _fmt(peak), "end"))
    parts.append(_text(left - 6, top + plot_h, "0", "end"))
    parts.append(_text(left, height - 18, _iso(points[0]["t"])))
    parts.append(_text(left + plot_w, height - 18, _iso(points[-1]["t"]), "end"))
    for key in ("added", "done"):
        path = " ".join(xy(p, key) for p in points)
        dash = ' stroke-dasharray="6 3"' if key == "done" else ""
        parts.append(f'<polyline class="{key}" fill="none" stroke="{COLORS[key]}"{dash} '
                     f'stroke-width="1.5" points="{path}"/>')  # fmt: skip
    parts.append(_legend(WIDTH - 200, 18, ["added", "done"]))
    return "".join(parts) + "</svg>"


def latency_chart(report: dict[str, Any], metric: str, title: str) -> str:
    """p50/p95/p99 of ``metric`` (wait_ms or run_ms) per tenant and type, as bars
    on a log scale (percentiles of one type often differ by orders of magnitude)."""
    groups = [g for g in report["groups"] if g[metric]["n"]]
    row_h, left, right, top = 3 * 12 + 10, 220, 80, 40
    height = top + max(1, len(groups)) * row_h + 30
    parts = [f'<svg class="chart" id="{metric}" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">']  # fmt: skip
    parts.append(_text(10, 18, title, size=13))
    parts.append(_legend(WIDTH - 220, 18, ["p50", "p95", "p99"]))
    if not groups:
        parts.append(_text(WIDTH / 2, top + 20, "no values", "middle"))
        return "".join(parts) + "</svg>"
    values = [g[metric][p] for g in groups for p in ("p50", "p95", "p99")]
    positive = [v for v in values if v and v > 0]
    low = math.floor(math.log10(min(positive))) if positive else 0
    high = math.ceil(math.log10(max(positive))) if positive else 1
    high = max(high, low + 1)
    plot_w = WIDTH - left - right

    def width_of(v: float) -> float:
        if not v or v <= 0:
            return 0.0
        return max(1.0, (math.log10(v) - low) / (high - low) * plot_w)

    for i, g in enumerate(groups):
        y = top + i * row_h
        parts.append(_text(left - 8, y + 22, f"{g['tenant']} / {g['type']}", "end"))
        for j, p in enumerate(("p50", "p95", "p99")):
            v = g[metric][p] or 0.0
            w = width_of(v)
            parts.append(f'<rect x="{left}" y="{y + j * 12}" width="{w:.1f}" height="10" '
                         f'fill="{COLORS[p]}"><title>{p} {_fmt(v)} ms</title></rect>')  # fmt: skip
            parts.append(_text(left + w + 4, y + j * 12 + 9, f"{_fmt(v)} ms", size=10))
    axis_y = top + len(groups) * row_h + 4
    for decade in range(low, high + 1):
        x = left + (decade - low) / (high - low) * plot_w
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}" '
                     f'stroke="#ddd"/>')  # fmt: skip
        parts.append(_text(x, axis_y + 14, f"{_fmt(10.0**decade)} ms", "middle", 10))
    return "".join(parts) + "</svg>"


def outcomes_chart(report: dict[str, Any]) -> str:
    """Done jobs per tenant and type by outcome code (stacked bars)."""
    groups = report["groups"]
    keys = ["ok", "failed", "error", "retry", "cancelled"]
    row_h, left, right, top = 22, 220, 80, 40
    height = top + max(1, len(groups)) * row_h + 20
    parts = [f'<svg class="chart" id="outcomes" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" xmlns="http://www.w3.org/2000/svg">']  # fmt: skip
    parts.append(_text(10, 18, "Outcomes per type (done jobs by code)", size=13))
    parts.append(_legend(WIDTH - 420, 18, keys))

    def counts(g: dict[str, Any]) -> list[int]:
        return [*(int(g["done"].get(k, 0)) for k in keys[:-1]), int(g["cancelled"])]

    most = max([sum(counts(g)) for g in groups] + [1])
    plot_w = WIDTH - left - right
    for i, g in enumerate(groups):
        y = top + i * row_h
        parts.append(_text(left - 8, y + 13, f"{g['tenant']} / {g['type']}", "end"))
        x = float(left)
        for key, n in zip(keys, counts(g), strict=True):
            if not n:
                continue
            w = n / most * plot_w
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" '
                         f'fill="{COLORS[key]}"><title>{key} {n}</title></rect>')  # fmt: skip
            x += w
        parts.append(_text(x + 4, y + 13, str(sum(counts(g))), size=10))
    return "".join(parts) + "</svg>"


def _table(report: dict[str, Any]) -> str:
    head = ("tenant", "type", "added", "ok", "failed", "error", "retry", "cancelled",
            "retries", "wait p50", "wait p95", "wait p99", "run p50", "run p95", "run p99",
            "done/min")  # fmt: skip
    rows = ["<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for g in report["groups"]:
        cells = [g["tenant"], g["type"], g["added"],
                 *(g["done"].get(k, 0) for k in ("ok", "failed", "error", "retry")),
                 g["cancelled"], g["retries"],
                 *(g["wait_ms"][p] for p in ("p50", "p95", "p99")),
                 *(g["run_ms"][p] for p in ("p50", "p95", "p99")),
                 g["throughput_per_min"]]  # fmt: skip
        rows.append(
            "<tr>"
            + "".join(f"<td>{escape('-' if c is None else str(c))}</td>" for c in cells)
            + "</tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def render(report: dict[str, Any]) -> str:
    """The whole page."""
    span = "no events"
    if report["first_ms"] is not None:
        span = f"{_iso(report['first_ms'])} to {_iso(report['last_ms'])} UTC"
    files = ", ".join(report["files"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>queue-daemon stats</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
th:nth-child(-n+2), td:nth-child(-n+2) {{ text-align: left; }}
svg.chart {{ display: block; margin: 1.5em 0; font-family: sans-serif; }}
</style></head><body>
<h1>Queue analytics</h1>
<p>{escape(span)}; {report["matched"]} of {report["lines"]} lines,
{report["bad_lines"]} bad lines. Files: {escape(files)}.</p>
<p>Times in milliseconds; percentiles {escape(report["percentiles"])}.</p>
{_table(report)}
{throughput_chart(report)}
{latency_chart(report, "wait_ms", "Queue wait per type (ms, log scale)")}
{latency_chart(report, "run_ms", "Run time per type (ms, log scale)")}
{outcomes_chart(report)}
</body></html>
"""
