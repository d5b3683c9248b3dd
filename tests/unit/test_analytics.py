"""``queue-daemon stats``: counts and percentiles from a crafted queue log,
over rotated and gzipped files, with filters, as JSON and as an HTML report."""

from __future__ import annotations

import gzip
import io
import math
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from queue_daemon.cli import main
from queue_daemon.tools import quantiles
from queue_daemon.tools.analytics import Analysis, Progress, analyze
from queue_daemon.tools.quantiles import Quantiles
from queue_daemon.tools.readlog import in_time_order

T0 = 1_700_000_040_000  # on a minute boundary
MIN = 60_000


def line(ev: str, t: int, tenant: str, name: str, **fields: Any) -> bytes:
    return orjson.dumps({"ev": ev, "t": t, "tenant": tenant, "type": name, **fields}) + b"\n"


def crafted() -> list[bytes]:
    """acme/resize: 10 jobs in the first minute; 7 ok, 1 failed, 1 error, and
    j10 fails once (retry) and then succeeds. beta/x: 2 jobs in minutes 1-2,
    one cancelled. Waits 10..100 ms and 1000 ms; runs 1..10 ms and 100 ms."""
    out = []
    for i in range(1, 11):
        out.append(line("added", T0, "acme", "resize", id=f"j{i}", size=10, sysid="1", dt=T0))
    for i in range(1, 11):
        t = T0 + i * 1000
        out.append(
            line("started", t, "acme", "resize", id=f"j{i}", attempt=1, sysid="1", wait_ms=i * 10)
        )
        code, exitcode, how = (
            ("ok", 200, "archive")
            if i <= 7
            else ("failed", 404, "archive")
            if i == 8
            else ("error", 500, "archive")
            if i == 9
            else ("error", 500, "retry")
        )
        fin = dict(attempt=1, sysid="1", code=code, exitcode=exitcode, run_ms=float(i), how=how)
        out.append(line("finished", t + 500, "acme", "resize", id=f"j{i}", **fin))
    out.append(
        line(
            "retry",
            T0 + 10_500,
            "acme",
            "resize",
            id="j10",
            attempt=1,
            sysid="1",
            code="error",
            exitcode=500,
            delay_ms=1000,
            dt=T0 + 11_500,
        )
    )
    out.append(
        line("started", T0 + 12_500, "acme", "resize", id="j10", attempt=2, sysid="1", wait_ms=1000)
    )
    out.append(
        line(
            "finished",
            T0 + 12_600,
            "acme",
            "resize",
            id="j10",
            attempt=2,
            sysid="1",
            code="ok",
            exitcode=200,
            run_ms=100.0,
            how="archive",
        )
    )
    out.append(line("expired", T0 + 20_000, "acme", "resize", id="j11", attempt=1, sysid="2"))
    out.append(line("purged", T0 + 30_000, "acme", "resize", n=4, sysid="1"))
    out.append(line("added", T0 + MIN, "beta", "x", id="b1", size=1, sysid="1", dt=T0 + MIN))
    out.append(line("added", T0 + MIN, "beta", "x", id="b2", size=1, sysid="1", dt=T0 + MIN))
    out.append(line("cancelled", T0 + 90_000, "beta", "x", id="b1", sysid="1"))
    out.append(
        line(
            "started",
            T0 + 2 * MIN - 100,
            "beta",
            "x",
            id="b2",
            attempt=1,
            sysid="1",
            wait_ms=59_900,
        )
    )
    out.append(
        line(
            "finished",
            T0 + 2 * MIN,
            "beta",
            "x",
            id="b2",
            attempt=1,
            sysid="1",
            code="ok",
            exitcode=200,
            run_ms=0.25,
            how="archive",
        )
    )
    return out


GARBAGE = [
    b"not json at all\n",
    b"\xff\xfe\x00\n",
    b"[1, 2]\n",
    b'{"ev": "added"}\n',
    b'{"ev":"started","t":1,"tenant":"acme","type":"resize","wait_ms":"slow"}\n',
    b'{"ev":"added","t":"now","tenant":"acme","type":"resize"}\n',
]
TORN = b'{"ev":"added","t":17000000'


def write_log(path: Path, lines: list[bytes], *, gz: bool = False) -> Path:
    data = b"".join(lines)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def expect_acme(group: dict[str, Any]) -> None:
    assert group["tenant"] == "acme" and group["type"] == "resize"
    assert group["added"] == 10
    assert group["started"] == 11
    assert group["done"] == {"ok": 8, "failed": 1, "error": 1, "retry": 0}
    assert group["retries"] == 1
    assert group["cancelled"] == 0
    assert group["expired"] == 1
    assert group["purged"] == 4
    # nearest rank over 11 values
    assert group["wait_ms"] == {"n": 11, "p50": 60.0, "p95": 1000.0, "p99": 1000.0}
    assert group["run_ms"] == {"n": 11, "p50": 6.0, "p95": 100.0, "p99": 100.0}
    assert group["throughput_per_min"] == 5.0  # 10 done over the log's 2 minutes


def expect_beta(group: dict[str, Any]) -> None:
    assert (group["tenant"], group["type"], group["added"], group["cancelled"]) == (
        "beta",
        "x",
        2,
        1,
    )
    assert group["done"]["ok"] == 1
    assert group["wait_ms"] == {"n": 1, "p50": 59_900.0, "p95": 59_900.0, "p99": 59_900.0}
    assert group["throughput_per_min"] == 1.0  # one done and one cancelled over 2 minutes


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["stats", "--json", *args]) == 0
    out = capsys.readouterr().out
    result: dict[str, Any] = orjson.loads(out)
    return result


def test_counts_and_percentiles_of_a_crafted_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_log(tmp_path / "queue-1.log", [*crafted(), *GARBAGE, TORN])
    report = run_json(capsys, str(path))
    assert report["lines"] == len(crafted()) + len(GARBAGE) + 1
    assert report["bad_lines"] == len(GARBAGE) + 1
    assert report["matched"] == len(crafted())
    assert report["first_ms"] == T0 and report["last_ms"] == T0 + 2 * MIN
    assert report["span_minutes"] == 2.0
    acme, beta = report["groups"]
    expect_acme(acme)
    expect_beta(beta)
    assert report["timeline"] == {
        "bucket_ms": MIN,
        "points": [
            {"t": T0, "added": 10, "done": 10},
            {"t": T0 + MIN, "added": 2, "done": 1},
            {"t": T0 + 2 * MIN, "added": 0, "done": 1},
        ],
    }
    assert "exact" in report["percentiles"]


def test_rotated_and_gzipped_files_in_any_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = crafted()
    oldest = write_log(tmp_path / "queue-1.log.20231114T221500Z.gz", lines[:12], gz=True)
    middle = write_log(tmp_path / "queue-1.log.20231114T221600Z", lines[12:30])
    live = write_log(tmp_path / "queue-1.log", [*lines[30:], TORN])
    assert in_time_order([live, oldest, middle]) == [oldest, middle, live]
    report = run_json(capsys, str(live), str(oldest), str(middle))
    assert report["bad_lines"] == 1  # the torn last line of the live file
    acme, beta = report["groups"]
    expect_acme(acme)
    expect_beta(beta)


def test_since_until_and_tenant_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_log(tmp_path / "q.log", crafted())
    later = run_json(capsys, str(path), "--since", str(T0 + MIN))
    assert [(g["tenant"], g["added"]) for g in later["groups"]] == [("beta", 2)]
    earlier = run_json(capsys, str(path), "--until", "2023-11-14T22:15:00Z")  # T0 + 1 min
    assert [g["tenant"] for g in earlier["groups"]] == ["acme"]
    acme_only = run_json(capsys, str(path), "--tenant", "acme")
    assert [g["tenant"] for g in acme_only["groups"]] == ["acme"]
    expect_acme({**acme_only["groups"][0], "throughput_per_min": 5.0})
    both = run_json(capsys, str(path), "--tenant", "acme", "--tenant", "beta")
    assert len(both["groups"]) == 2
    assert run_json(capsys, str(path), "--tenant", "nobody")["groups"] == []


def test_table_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_log(tmp_path / "q.log", [*crafted(), TORN])
    assert main(["stats", str(path)]) == 0
    captured = capsys.readouterr()
    rows = captured.out.splitlines()
    assert rows[0].split()[:3] == ["tenant", "type", "added"]
    assert rows[1].split()[:11] == [
        "acme",
        "resize",
        "10",
        "8",
        "1",
        "1",
        "0",
        "0",
        "1",
        "60/1000/1000",
        "6/100/100",
    ]
    assert "1 bad lines" in rows[-1]
    assert "1 bad lines skipped" in captured.err and "Traceback" not in captured.err
    assert main(["stats", str(path), "--since", "yesterday"]) == 2
    assert "--since must be ISO-8601" in capsys.readouterr().err
    assert main(["stats", str(tmp_path / "missing.log")]) == 2


def test_html_report_is_self_contained_with_the_charts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_log(tmp_path / "q.log", crafted())
    html_path = tmp_path / "report.html"
    assert main(["stats", str(path), "--html", str(html_path)]) == 0
    capsys.readouterr()
    html = html_path.read_text()
    for chart in ("throughput", "wait_ms", "run_ms", "outcomes"):
        assert f'<svg class="chart" id="{chart}"' in html
    assert html.count("<polyline") == 2  # added and done over time
    assert "acme / resize" in html and "beta / x" in html
    assert "<script" not in html and "src=" not in html and "<link" not in html


def test_html_report_of_an_empty_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_log(tmp_path / "q.log", [])
    html_path = tmp_path / "report.html"
    assert main(["stats", str(path), "--html", str(html_path), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["groups"] == []
    assert "no events" in html_path.read_text()


def test_a_cut_gzip_file_is_reported_not_raised(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(crafted()))
    path = tmp_path / "q.log.gz"
    path.write_bytes(data[: len(data) // 2])
    errors: list[str] = []
    analysis = analyze([path], Analysis(), on_error=lambda p, exc: errors.append(p.name))
    assert errors == ["q.log.gz"] and analysis.bad >= 1


def test_sketch_percentiles_within_the_documented_error() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(3, 2) for _ in range(50_000)] + [0.0] * 100
    sketch = Quantiles()
    halves = Quantiles(), Quantiles()
    for i, v in enumerate(values):
        sketch.add(v)
        halves[i % 2].add(v)
    halves[0].merge(halves[1])
    ordered = sorted(values)
    assert sketch.values is None  # switched to buckets
    assert len(sketch.buckets) < 3000
    for q in (0.01, 0.5, 0.95, 0.99):
        exact = ordered[math.ceil(q * len(values)) - 1]
        for estimate in (sketch.quantile(q), halves[0].quantile(q)):
            assert estimate is not None
            assert abs(estimate - exact) <= quantiles.RELATIVE_ERROR * exact + 1e-9


def test_progress_bar_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet, loud = io.StringIO(), Tty()
    for stream in (quiet, loud):
        bar = Progress(1000, stream)
        bar.show(500, 10)
        bar.end()
    assert quiet.getvalue() == ""
    assert "50.0%" in loud.getvalue()
