"""The metrics' label caps and counts, rendered and read back with prometheus-client's parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from queue_daemon.cli import CliError, build_parser, settings_from
from queue_daemon.domain.jobs import Release, ReleaseHow
from queue_daemon.observe.labels import OTHER, LabelCap
from queue_daemon.observe.metrics import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_label_cap_admits_the_first_tenants_and_pairs_only() -> None:
    cap = LabelCap(tenants=2, types=2)
    assert cap.pair("a", "x") == ("a", "x")
    assert cap.pair("a", "y") == ("a", "y")
    assert cap.pair("a", "z") == ("a", OTHER)  # third pair
    assert cap.pair("b", "x") == ("b", OTHER)  # pairs are full; the tenant is not
    assert cap.pair("c", "x") == (OTHER, OTHER)  # third tenant
    assert cap.pair("a", "x") == ("a", "x")  # admitted values stay
    assert cap.stored("a-y") == ("a", "y")
    assert LabelCap(tenants=5, types=0).pair("a", "x") == ("a", OTHER)


def test_counts_and_histograms_render_as_prometheus_text() -> None:
    metrics = Metrics(metrics_tenants=10, metrics_types=10)
    metrics.added("acme", "resize", 1000)
    metrics.added("acme", "resize", 1)
    metrics.add_took(0.0007)
    metrics.add_took(3.0)
    metrics.claimed("acme-resize", 3, 0.002)
    metrics.claimed("acme-resize", 0, 0.001)  # an empty claim is timed, starts nothing
    releases = [
        Release(id="1", how=ReleaseHow.ARCHIVE, code="ok"),
        Release(id="2", how=ReleaseHow.ARCHIVE, code="ok"),
        Release(id="3", how=ReleaseHow.UNGET, refund_attempt=True),
    ]
    metrics.finished("acme-resize", releases)
    metrics.ran("python", 0.2)
    got = samples(metrics)
    labels = (("tenant", "acme"), ("type", "resize"))
    assert got[("queue_jobs_added_total", labels)] == 1001
    assert got[("queue_jobs_started_total", labels)] == 3
    assert got[("queue_jobs_finished_total", (("code", "ok"), *labels))] == 2
    assert got[("queue_jobs_finished_total", (("code", "requeued"), *labels))] == 1
    assert got[("queue_add_seconds_count", ())] == 2
    assert got[("queue_add_seconds_sum", ())] == 3.0007
    assert got[("queue_add_seconds_bucket", (("le", "0.0005"),))] == 0
    assert got[("queue_add_seconds_bucket", (("le", "0.001"),))] == 1
    assert got[("queue_add_seconds_bucket", (("le", "2.5"),))] == 1
    assert got[("queue_add_seconds_bucket", (("le", "5.0"),))] == 2
    assert got[("queue_add_seconds_bucket", (("le", "+Inf"),))] == 2
    assert got[("queue_claim_seconds_count", ())] == 2
    assert got[("queue_batch_run_seconds_count", (("lang", "python"),))] == 1


def test_each_daemon_has_a_registry_of_its_own() -> None:
    one, two = Metrics(), Metrics()
    one.added("a", "x", 5)
    assert ("queue_jobs_added_total", (("tenant", "a"), ("type", "x"))) not in samples(two)


def test_flags_and_environment_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_DAEMON_METRICS_TENANTS", "7")
    args = build_parser().parse_args(["serve", "--metrics-types", "0", "--ready-lag", "5"])
    settings = settings_from(args)
    assert (settings.metrics_tenants, settings.metrics_types, settings.ready_lag) == (7, 0, 5.0)
    defaults = settings_from(build_parser().parse_args(["serve", "--metrics-tenants", "100"]))
    assert (defaults.metrics_types, defaults.ready_lag) == (200, 30.0)
    with pytest.raises(CliError, match="--ready-lag"):
        settings_from(build_parser().parse_args(["serve", "--ready-lag", "-1"]))
