"""The peers table's arithmetic (bench/peers/report.py): which peer is best, and the
ratio turned so that above 1 this project is ahead, for rates and for latencies;
the peers' settings and how their drivers are started, without running them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import parse_args
from bench.peers import node_env, ours, rows
from bench.peers.ours import percentiles
from bench.peers.report import Row, render
from bench.peers.run import NODE_PEER, PEERS, REMAINING_SQL
from bench.procs import BenchError


def test_a_rate_is_compared_with_the_fastest_peer() -> None:
    row = Row(
        "e2e", "jobs/s", True, ours=30_000.0, peers={"pgqueuer": 10_000.0, "procrastinate": 500.0}
    )
    assert row.best_peer == ("pgqueuer", 10_000.0)
    assert row.ratio == pytest.approx(3.0)


def test_a_latency_is_compared_with_the_quickest_peer_and_turned() -> None:
    row = Row("p50", "ms", False, ours=4.0, peers={"pgqueuer": 8.0, "procrastinate": 3000.0})
    assert row.best_peer == ("pgqueuer", 8.0)
    assert row.ratio == pytest.approx(2.0)  # above 1: this project starts jobs sooner
    slower = Row("p50", "ms", False, ours=16.0, peers={"pgqueuer": 8.0})
    assert slower.ratio == pytest.approx(0.5)


def test_a_failed_figure_has_no_ratio_and_a_failed_peer_is_not_the_best() -> None:
    row = Row("e2e", "jobs/s", True, ours=None, peers={"pgqueuer": 10.0})
    assert row.ratio is None
    row = Row("e2e", "jobs/s", True, ours=20.0, peers={"pgqueuer": None, "procrastinate": 5.0})
    assert row.best_peer == ("procrastinate", 5.0)
    assert row.ratio == pytest.approx(4.0)
    assert Row("e2e", "jobs/s", True, ours=20.0, peers={"pgqueuer": None}).ratio is None


def test_the_table_shows_every_figure_and_failures() -> None:
    rows = [
        Row(
            "enqueue",
            "jobs/s",
            True,
            ours=2_520.4,
            peers={"pgqueuer": 2_086.0, "procrastinate": None},
        ),
        Row("p50", "ms", False, ours=3.5, peers={"pgqueuer": 7.97, "procrastinate": 3_175.0}),
    ]
    text = render(rows).splitlines()
    assert text[0].split()[:3] == ["workload", "unit", "this"]
    assert "2,520" in text[2] and "2,086" in text[2] and "FAILED" in text[2] and "1.21" in text[2]
    assert "3.50" in text[3] and "7.97" in text[3] and "3,175" in text[3] and "2.28" in text[3]


def test_percentiles() -> None:
    assert percentiles([float(i) for i in range(1, 101)]) == (50.5, 99.0)
    with pytest.raises(BenchError):
        percentiles([])


def test_the_table_has_a_column_for_each_peer_that_ran() -> None:
    rows = [
        Row(
            "e2e",
            "jobs/s",
            True,
            ours=20_000.0,
            peers={"pgqueuer": 19_000.0, "procrastinate": 700.0, NODE_PEER: 40_000.0},
        )
    ]
    head, _, line = render(rows).splitlines()
    assert head.split()[-4:] == ["procrastinate", NODE_PEER, "ratio", "of"]
    assert "40,000" in line and line.split()[-2:] == ["0.50", NODE_PEER]
    only = render([Row("e2e", "jobs/s", True, ours=1.0, peers={NODE_PEER: 2.0})])
    assert "pgqueuer" not in only and NODE_PEER in only


def test_every_peer_has_its_remaining_count_and_graphile_worker_its_shapes() -> None:
    assert set(REMAINING_SQL) == set(PEERS)
    settings = PEERS[NODE_PEER]
    assert (2, 24, 500) in settings.work  # its performance page's shape
    assert any(batch == 0 for _, _, batch in settings.work)  # and one without a local queue
    text = settings.describe()
    assert "2 x 24 x 500" in text and "localQueue.size" in text and "runOnce" in text


def test_peer_picks_peers_and_goes_with_peers_only() -> None:
    opts = parse_args(["--peers", "--peer", NODE_PEER, "--peer", NODE_PEER])
    assert opts.peers and opts.peer_names == [NODE_PEER]
    assert parse_args(["--peers"]).peer_names == []
    with pytest.raises(SystemExit):
        parse_args(["--peers", "--peer", "sidekiq"])
    with pytest.raises(SystemExit):
        parse_args(["--peer", NODE_PEER])


def test_the_node_driver_is_started_by_node_with_its_packages(tmp_path: Path) -> None:
    env = node_env.NodeEnv(node=("/opt/node/bin/node",), root=tmp_path)
    argv = env.driver()
    assert argv[0] == "/opt/node/bin/node"
    assert argv[1].endswith("graphile_driver.mjs") and Path(argv[1]).is_file()
    assert argv[2:] == ["--modules", str(tmp_path)]
    assert node_env.location().name.startswith("bench-peers-node-")


def test_npm_is_the_one_beside_node(tmp_path: Path) -> None:
    cli = tmp_path / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    cli.parent.mkdir(parents=True)
    cli.write_text("")
    node = tmp_path / "bin" / "node"
    node.parent.mkdir()
    node.write_text("")
    assert node_env.npm_command(str(node)) == [str(node), str(cli)]


def test_the_latency_rows_are_medians_of_runs_in_turns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    order: list[str] = []
    ours_runs = iter([(1.0, 3.0), (1.4, 2.0), (1.2, 9.0)])

    def our_latency(run: object, *args: float) -> tuple[float, float]:
        order.append("ours")
        return next(ours_runs)

    class Peer:
        def __init__(self, name: str, figures: list[tuple[float, float]]) -> None:
            self.name, self._figures = name, iter(figures)

        def latency(self, *args: float) -> tuple[float, float]:
            order.append(self.name)
            return next(self._figures)

    class FakeRun:
        opts = parse_args(["--peers", "--repeat", "3"])

        def settle(self) -> None:
            pass

    monkeypatch.setattr(ours, "latency", our_latency)
    close = Peer("close", [(1.5, 4.0), (1.1, 3.0), (1.3, 5.0)])
    far = Peer("far", [(2.5, 6.0)])  # above twice this project's first p50: once
    p50, p99 = rows._latency_rows(FakeRun(), [close, far], rows.Sizes.of(False))  # type: ignore[arg-type,list-item]
    assert order == ["ours", "close", "far", "ours", "close", "ours", "close"]
    assert (p50.ours, p99.ours) == (1.2, 3.0)
    assert (p50.peers, p99.peers) == ({"close": 1.3, "far": 2.5}, {"close": 4.0, "far": 6.0})
    assert "close: median of 3 (1.50, 1.10, 1.30)" in p50.notes
