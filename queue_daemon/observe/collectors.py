"""The collectors a scrape of ``/metrics`` asks: the event counts, and the
state the daemon keeps anyway (``Sources``), read at scrape time."""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from queue_daemon.observe.labels import LabelCap


@dataclass(slots=True, kw_only=True)
class Sources:
    """Readers of the state the collector reports at scrape time (wired by ``app``)."""

    sysid: str
    journal_lag: Callable[[], tuple[int, int, int | None]]  # lines, bytes, oldest create ms
    journal_writable: Callable[[], bool]
    ingested: Callable[[], int]
    running: Callable[[], int]
    contexts: Callable[[], Tally[str]]  # live contexts per lang
    cold_starts: Callable[[], Tally[str]]
    output_throttled: Callable[[], Mapping[str, float]]  # tenant -> seconds its reads waited
    lease_age: Callable[[], float]  # seconds since the sysid lease was last taken or renewed
    lease_lost: Callable[[], bool]
    renew_failures: Callable[[], int]


Families = Callable[[], Iterable[Metric]]


class EventCollector(Collector):
    """The event counts and histograms of ``Metrics`` (its ``event_families``)."""

    def __init__(self, families: Families) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families()


class StateCollector(Collector):
    """The scrape-time values of ``Sources`` and the cached queue depth (``depth``)."""

    def __init__(self, sources: Sources, labels: LabelCap, depth: Families) -> None:
        self._sources = sources
        self._labels = labels
        self._depth = depth

    def collect(self) -> Iterable[Metric]:
        src = self._sources
        lines, unread_bytes, oldest_ms = src.journal_lag()
        lag_s = 0.0 if oldest_ms is None else max(0.0, time.time() - oldest_ms / 1000)
        yield gauge("queue_journal_unread_lines", "Journal lines not yet in the store", lines)
        yield gauge(
            "queue_journal_unread_bytes", "Journal bytes not yet in the store", unread_bytes
        )
        yield gauge(
            "queue_ingest_lag_seconds",
            "Age of the oldest journal line not yet in the store (0 when caught up)",
            lag_s,
        )
        yield gauge(
            "queue_journal_writable",
            "1 while the journal accepts writes",
            1 if src.journal_writable() else 0,
        )
        ingested = CounterMetricFamily(
            "queue_jobs_ingested", "Jobs this daemon moved from its journal into the store"
        )
        ingested.add_metric([], src.ingested())
        yield ingested
        yield gauge(
            "queue_worker_running_jobs", "Jobs running (or claimed to run) here", src.running()
        )
        contexts = GaugeMetricFamily(
            "queue_runner_contexts", "Live handler contexts, by language", labels=["lang"]
        )
        for lang, count in sorted(src.contexts().items()):
            contexts.add_metric([lang], count)
        yield contexts
        cold = CounterMetricFamily(
            "queue_runner_cold_starts",
            "Contexts started while a batch waited for them, by language",
            labels=["lang"],
        )
        for lang, count in sorted(src.cold_starts().items()):
            cold.add_metric([lang], count)
        yield cold
        throttled = CounterMetricFamily(
            "queue_handler_output_throttled_seconds",
            "Seconds the daemon stopped reading a tenant's handler output, over its output"
            " rate (the handlers' writes wait meanwhile), by tenant",
            labels=["tenant"],
        )
        waited: dict[str, float] = {}
        for client, seconds in list(src.output_throttled().items()):
            label = self._labels.tenant(client)
            waited[label] = waited.get(label, 0.0) + seconds
        for label, seconds in sorted(waited.items()):
            throttled.add_metric([label], seconds)
        yield throttled
        info = GaugeMetricFamily("queue_sysid_info", "This daemon's sysid", labels=["sysid"])
        info.add_metric([src.sysid], 1)
        yield info
        yield gauge(
            "queue_sysid_lease_age_seconds",
            "Seconds since the sysid lease was last taken or renewed",
            src.lease_age(),
        )
        yield gauge(
            "queue_sysid_lease_lost",
            "1 if another daemon took this daemon's sysid over",
            1 if src.lease_lost() else 0,
        )
        failures = CounterMetricFamily(
            "queue_sysid_renew_failures", "Sysid lease renewals that failed"
        )
        failures.add_metric([], src.renew_failures())
        yield failures
        yield from self._depth()


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
