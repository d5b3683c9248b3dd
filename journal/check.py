"""Offline verification of a journal directory (``queue-daemon journal check PATH``).

Read-only: it neither takes the lock nor repairs anything, so it is safe on a
journal a daemon is using (a batch being appended may then show as a torn tail).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from queue_daemon.journal.format import Damage, scan, segment_name
from queue_daemon.journal.readpoint import READ_POINT_FILE, ReadPoint, load_read_point
from queue_daemon.journal.segments import list_segments


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckProblem:
    segment: str  # file name, "" for directory-level problems
    offset: int
    kind: str  # "torn tail", "corrupt", "read point", "missing segment", "no journal"
    detail: str

    def __str__(self) -> str:
        where = f"{self.segment}:{self.offset}: " if self.segment else ""
        return f"{where}{self.kind}: {self.detail}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentSummary:
    name: str
    bytes: int
    batches: int
    lines: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    path: Path
    segments: list[SegmentSummary] = field(default_factory=list)
    batches: int = 0
    lines_total: int = 0
    lines_unread: int = 0  # in batches at or after the read point
    read_point: ReadPoint | None = None
    problems: list[CheckProblem] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)  # corrupt-*.bad saved by recovery

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        rp = (
            f"{segment_name(self.read_point.segment)}:{self.read_point.offset}"
            if self.read_point
            else "none"
        )
        out = [
            f"journal {self.path}: {'OK' if self.ok else 'PROBLEMS FOUND'}",
            f"  segments:    {len(self.segments)}",
            *(
                f"    {s.name}  {s.bytes} bytes, {s.batches} batches, {s.lines} lines"
                for s in self.segments
            ),
            f"  batches:     {self.batches}",
            f"  lines:       {self.lines_total} total, {self.lines_unread} unread",
            f"  read point:  {rp}",
        ]
        if self.bad_files:
            out.append(f"  saved corrupt batches: {', '.join(self.bad_files)}")
        if self.problems:
            out.append(f"  problems ({len(self.problems)}):")
            out.extend(f"    {p}" for p in self.problems)
        return "\n".join(out)


def check(path: Path) -> CheckReport:
    """Verify every segment of the journal at ``path``; never modifies anything."""
    if not path.is_dir():
        problem = CheckProblem(segment="", offset=0, kind="no journal", detail="not a directory")
        return CheckReport(path=path, problems=[problem])
    rp = load_read_point(path)
    problems: list[CheckProblem] = []
    if rp is None and (path / READ_POINT_FILE).exists():
        problems.append(
            CheckProblem(segment="", offset=0, kind="read point", detail="no valid record")
        )
    numbers = list_segments(path)
    summaries: list[SegmentSummary] = []
    batches = lines_total = lines_unread = 0
    rp_boundary_ok = rp is None
    for i, seg in enumerate(numbers):
        name = segment_name(seg)
        last = i == len(numbers) - 1
        if i > 0 and seg != numbers[i - 1] + 1:
            problems.append(
                CheckProblem(
                    segment=name,
                    offset=0,
                    kind="missing segment",
                    detail=f"segments {numbers[i - 1] + 1}..{seg - 1} are missing",
                )
            )
        data = (path / name).read_bytes()
        seg_batches = seg_lines = 0
        for item in scan(data):
            if isinstance(item, Damage):
                kind = "torn tail" if item.tail and last else "corrupt"
                detail = f"{item.reason}, {item.end - item.offset} bytes"
                problems.append(
                    CheckProblem(segment=name, offset=item.offset, kind=kind, detail=detail)
                )
                if rp is not None and (seg, item.offset) == rp.position:
                    rp_boundary_ok = True
                continue
            seg_batches += 1
            seg_lines += item.lines
            if rp is None or (seg, item.offset) >= rp.position:
                lines_unread += item.lines
            if rp is not None and (
                (seg, item.offset) == rp.position or (seg, item.end) == rp.position
            ):
                rp_boundary_ok = True
        if rp is not None and seg == rp.segment and rp.offset in (0, len(data)):
            rp_boundary_ok = True
        batches += seg_batches
        lines_total += seg_lines
        summaries.append(
            SegmentSummary(name=name, bytes=len(data), batches=seg_batches, lines=seg_lines)
        )
    if rp is not None and numbers and not rp_boundary_ok and rp.segment >= numbers[0]:
        problems.append(
            CheckProblem(
                segment=segment_name(rp.segment),
                offset=rp.offset,
                kind="read point",
                detail="does not fall on a batch boundary",
            )
        )
    bad = sorted(p.name for p in path.glob("corrupt-*.bad"))
    return CheckReport(
        path=path,
        segments=summaries,
        batches=batches,
        lines_total=lines_total,
        lines_unread=lines_unread,
        read_point=rp,
        problems=problems,
        bad_files=bad,
    )
