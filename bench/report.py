"""The table ``python -m bench`` prints: each figure beside the ceiling it is measured against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Row:
    label: str
    value: float | None  # None: the section failed; see notes
    unit: str
    against: str = ""  # what the ratio is of: "ceiling", "(3) bare aiohttp", ...
    ratio: float | None = None
    notes: str = ""


def _number(value: float | None) -> str:
    if value is None:
        return "FAILED"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def render(rows: list[Row]) -> str:
    head = ("figure", "value", "unit", "ratio", "of", "notes")
    cells = [
        (
            row.label,
            _number(row.value),
            row.unit,
            "" if row.ratio is None else f"{row.ratio:.2f}",
            row.against,
            row.notes,
        )
        for row in rows
    ]
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(5)] if cells else []
    if not widths:
        return "(nothing measured)"

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(
            [
                c[0].ljust(widths[0]),
                c[1].rjust(widths[1]),
                c[2].ljust(widths[2]),
                c[3].rjust(widths[3]),
                c[4].ljust(widths[4]),
                c[5],
            ]
        ).rstrip()

    rule = "-" * (sum(widths) + 2 * 5 + len(head[5]))
    return "\n".join([line(head), rule, *(line(c) for c in cells)])
