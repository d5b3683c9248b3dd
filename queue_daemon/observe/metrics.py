"""Operator metrics in the Prometheus text format, on a registry of this daemon's own.

Two kinds of values:

- Events are counted where they happen, once per request or batch (a count
  of n, one histogram observation), never once per job: an add of 1000 lines
  costs the same as an add of one. A count is a dict update on the event
  loop; a collector turns the counts into Prometheus counters and histograms
  when scraped.
- State the daemon keeps anyway (journal lag, contexts, the sysid lease, the
  store's queue depth) is read when ``/metrics`` is scraped, by a collector.
  The queue depth needs a store query: ``refresh()`` runs it at most once per
  ``DEPTH_TTL_S`` seconds, before the text is rendered.

Cardinality is bounded: the first ``metrics_tenants`` distinct tenants get a
``tenant`` label value of their own, later ones share ``_other``; likewise the
first ``metrics_types`` distinct (tenant, type) pairs keep their ``type``, later ones
(and every type of an ``_other`` tenant) are ``_other``; ``metrics_types = 0`` turns
type labels off. Values once given are kept for the daemon's life, so a
counter's series never changes meaning.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from operator import attrgetter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from queue_daemon.domain.jobs import Release
from queue_daemon.domain.views import QueueDepth
from queue_daemon.observe.collectors import EventCollector, Sources, StateCollector
from queue_daemon.observe.histogram import Histogram
from queue_daemon.observe.labels import METRICS_TENANTS, METRICS_TYPES, LabelCap
from queue_daemon.store.errors import StoreError
from queue_daemon.store.ports import Dashboard

logger = logging.getLogger(__name__)

DEPTH_TTL_S = 5.0  # the queue depth is read from the store at most this often
DEPTH_TIMEOUT_S = 5.0  # longer, and the scrape reports the last counts with queue_store_up 0
DEPTH_CAP = 1_000_000  # waiting (and scheduled) jobs counted per type; the gauge saturates there
DEPTH_TYPES = 100_000  # stored types read for the gauge (label values are capped further down)
NO_CODE = "requeued"  # the code label of a run that ended without an outcome (put back)

# seconds: an add is an fsync (sub-millisecond to tens of ms); a claim a store round trip
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_code = attrgetter("code")


class Metrics:
    """Every metric of one daemon, on its own ``CollectorRegistry``.

    The event counts are plain dicts of ints bumped on the event loop: a
    prometheus-client ``Counter.inc`` or ``Histogram.observe`` takes a lock per
    call (several for a histogram), which measured 5-10 times the cost of the
    dict update on the add path. They are exposed by a collector at scrape time.
    """

    def __init__(
        self, *, metrics_tenants: int = METRICS_TENANTS, metrics_types: int = METRICS_TYPES
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = LabelCap(metrics_tenants, metrics_types)
        self._added: dict[tuple[str, str], int] = {}
        self._started: dict[tuple[str, str], int] = {}
        self._finished: dict[tuple[str, str, str], int] = {}
        self._lost_lease: dict[tuple[str, str], int] = {}
        self._rerun: dict[tuple[str, str], int] = {}
        self._follow_ons_dropped: dict[tuple[str, str], int] = {}
        self._pulled: dict[tuple[str, str], int] = {}
        self._graph: dict[tuple[str, str], int] = {}
        self._live_workers: dict[str, int] = {}
        self._paused: dict[str, tuple[bool, int]] = {}
        self._ticks: dict[tuple[str, str], int] = {}
        self._ticks_deferred: dict[tuple[str, str], int] = {}
        self._add_seconds = Histogram(FAST_BUCKETS)
        self._claim_seconds = Histogram(FAST_BUCKETS)
        self._run_seconds: dict[str, Histogram] = {}
        self._depth: dict[str, QueueDepth] = {}
        self._depth_at = -1e9
        self._depth_ok: bool | None = None  # None until the first read
        self._depth_task: asyncio.Future[None] | None = None
        self._store: Dashboard | None = None
        self.registry.register(EventCollector(self.event_families))

    # --- events: once per request or batch ------------------------------------

    def added(self, client: str, jobtype: str, count: int) -> None:
        labels = self.labels.pair(client, jobtype)
        added = self._added
        added[labels] = added.get(labels, 0) + count

    def add_took(self, seconds: float) -> None:
        self._add_seconds.observe(seconds)

    def claimed(self, stored_type: str, count: int, seconds: float) -> None:
        self._claim_seconds.observe(seconds)
        if count:
            labels = self.labels.stored(stored_type)
            self._started[labels] = self._started.get(labels, 0) + count

    def dispatched(self, stored_type: str, count: int) -> None:
        """Jobs stored claimed at ingest: started, with no claim to time."""
        labels = self.labels.stored(stored_type)
        self._started[labels] = self._started.get(labels, 0) + count

    def ran(self, lang: str, seconds: float) -> None:
        histogram = self._run_seconds.get(lang)
        if histogram is None:
            histogram = self._run_seconds[lang] = Histogram(RUN_BUCKETS)
        histogram.observe(seconds)

    def finished(self, stored_type: str, releases: Sequence[Release]) -> None:
        if not releases:
            return
        tenant, jobtype = self.labels.stored(stored_type)
        finished = self._finished
        # Counter(map(attrgetter)) counts in C: no Python loop per job
        for code, count in Tally(map(_code, releases)).items():
            key = (tenant, jobtype, code or NO_CODE)
            finished[key] = finished.get(key, 0) + count

    def lost_lease(self, stored_type: str, count: int) -> None:
        """Runs whose outcome the store refused: the daemon no longer held them."""
        labels = self.labels.stored(stored_type)
        self._lost_lease[labels] = self._lost_lease.get(labels, 0) + count

    def rerun(self, stored_type: str, count: int) -> None:
        """Done jobs put back to wait by a rerun through this daemon."""
        labels = self.labels.stored(stored_type)
        self._rerun[labels] = self._rerun.get(labels, 0) + count

    def follow_ons_dropped(self, client: str, reason: str, count: int) -> None:
        """Follow-on jobs not added: invalid, over a per-run limit (count, bytes),
        over the add rate or the waiting limit (rate, waiting)."""
        labels = (self.labels.tenant(client), reason)
        dropped = self._follow_ons_dropped
        dropped[labels] = dropped.get(labels, 0) + count

    def pulled(self, client: str, event: str, count: int) -> None:
        """Jobs of pulled types through this daemon: claimed, completed, stale (a
        complete or renew whose claim no longer held the job), handed_back."""
        if count:
            labels = (self.labels.tenant(client), event)
            self._pulled[labels] = self._pulled.get(labels, 0) + count

    def ticks(self, client: str, count: int, *, catchup: bool) -> None:
        """Schedule ticks added as jobs; ``catchup`` when they stand for missed ones."""
        labels = (self.labels.tenant(client), "true" if catchup else "false")
        self._ticks[labels] = self._ticks.get(labels, 0) + count

    def ticks_deferred(self, client: str, reason: str, count: int) -> None:
        """Schedule ticks not added yet (rate, waiting, journal): tried again shortly."""
        labels = (self.labels.tenant(client), reason)
        self._ticks_deferred[labels] = self._ticks_deferred.get(labels, 0) + count

    def graph(self, client: str, event: str, count: int) -> None:
        """Jobs of graphs and deadlines: blocked (added to wait), unblocked,
        dependency_failed (424), deadline (408)."""
        if count:
            labels = (self.labels.tenant(client), event)
            self._graph[labels] = self._graph.get(labels, 0) + count

    def event_families(self) -> Iterable[Metric]:
        for name, documentation, labels, values in (
            (
                "queue_jobs_added",
                "Jobs accepted (adds and follow-on jobs), by tenant and type",
                ["tenant", "type"],
                self._added,
            ),
            (
                "queue_jobs_started",
                "Jobs claimed by this daemon to run, by tenant and type",
                ["tenant", "type"],
                self._started,
            ),
            (
                "queue_jobs_finished",
                "Runs ended in this daemon, by tenant, type and outcome code"
                " (ok, failed, retry, error; requeued: put back without a run)",
                ["tenant", "type", "code"],
                self._finished,
            ),
            (
                "queue_jobs_lost_lease",
                "Runs ended after this daemon lost their lease (stalled, or the store down"
                " past it): their outcome was refused and is not counted as finished",
                ["tenant", "type"],
                self._lost_lease,
            ),
            (
                "queue_jobs_rerun",
                "Done jobs put back to wait by a rerun through this daemon, by tenant and type",
                ["tenant", "type"],
                self._rerun,
            ),
            (
                "queue_follow_ons_dropped",
                "Follow-on jobs not added, by tenant and reason: invalid, count or bytes (over"
                " a run's limits), rate or waiting (over the tenant's; the run is retried)",
                ["tenant", "reason"],
                self._follow_ons_dropped,
            ),
            (
                "queue_pulled_jobs",
                "Jobs of pulled types through this daemon, by tenant and event: claimed,"
                " completed, stale (the claim no longer held the job), handed_back",
                ["tenant", "event"],
                self._pulled,
            ),
            (
                "queue_graph_jobs",
                "Jobs of job graphs and deadlines, by tenant and event: blocked (added to"
                " wait for others, through this daemon), unblocked, dependency_failed (424),"
                " deadline (408); the last three as this daemon resolved or ended them",
                ["tenant", "event"],
                self._graph,
            ),
            (
                "queue_schedule_ticks",
                "Schedule ticks added as jobs by this daemon, by tenant; catchup=true for one"
                " that stands for ticks missed while no daemon ran (or the store was down)",
                ["tenant", "catchup"],
                self._ticks,
            ),
            (
                "queue_schedule_ticks_deferred",
                "Schedule ticks put off for a moment, by tenant and reason: rate or waiting"
                " (over the tenant's limits), journal (it could not be written)",
                ["tenant", "reason"],
                self._ticks_deferred,
            ),
        ):
            family = CounterMetricFamily(name, documentation, labels=labels)
            for key, count in sorted(values.items()):
                family.add_metric(list(key), count)
            yield family
        add = HistogramMetricFamily(
            "queue_add_seconds", "Accepted add requests: from the request to the durable answer"
        )
        self._add_seconds.add_to(add, [])
        yield add
        claim = HistogramMetricFamily(
            "queue_claim_seconds", "Claims of a batch of waiting jobs in the store"
        )
        self._claim_seconds.add_to(claim, [])
        yield claim
        run = HistogramMetricFamily(
            "queue_batch_run_seconds", "Batches run by a handler, by language", labels=["lang"]
        )
        for lang, histogram in sorted(self._run_seconds.items()):
            histogram.add_to(run, [lang])
        yield run

    # --- state: read at scrape time -------------------------------------------

    def watch(self, store: Dashboard, sources: Sources) -> None:
        """Report ``sources`` and the store's queue depth from now on."""
        self._store = store
        self.registry.register(StateCollector(sources, self.labels, self.depth_families))

    async def refresh(self) -> None:
        """Read the queue depth from the store unless read within ``DEPTH_TTL_S``;
        concurrent scrapes share one query. A failure keeps the last counts and
        reports the store as down."""
        if self._store is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._depth_at < DEPTH_TTL_S:
            return
        if self._depth_task is None:
            self._depth_task = asyncio.ensure_future(self._read_depth(self._store))
        task = self._depth_task
        try:
            await asyncio.shield(task)
        finally:
            if self._depth_task is task and task.done():
                self._depth_task = None

    async def _read_depth(self, store: Dashboard) -> None:
        loop = asyncio.get_running_loop()
        try:
            # bounded: a scrape must not hang on a store that does not answer
            depths = await asyncio.wait_for(
                store.queue_depths(None, DEPTH_TYPES, DEPTH_CAP), DEPTH_TIMEOUT_S
            )
            self._depth = {depth.type: depth for depth in depths}
            self._live_workers = await asyncio.wait_for(store.live_workers(), DEPTH_TIMEOUT_S)
            self._paused = await asyncio.wait_for(store.paused_counts(), DEPTH_TIMEOUT_S)
            self._depth_ok = True
        except (StoreError, TimeoutError) as exc:
            if self._depth_ok is not False:
                logger.warning(
                    "queue depth not read: %s", exc, extra={"action": "metrics_depth_failed"}
                )
            self._depth_ok = False
        self._depth_at = loop.time()

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)

    def _paused_families(self) -> Iterable[Metric]:
        types = GaugeMetricFamily(
            "queue_paused_types",
            "Types paused by their tenant (every daemon's store), by tenant",
            labels=["tenant"],
        )
        tenants = GaugeMetricFamily(
            "queue_paused_tenants",
            "Tenants paused whole by the operator (1 each), by tenant",
            labels=["tenant"],
        )
        paused_types: Tally[str] = Tally()
        paused_tenants: Tally[str] = Tally()
        for client, (whole, count) in self._paused.items():
            label = self.labels.tenant(client)
            paused_types[label] += count
            paused_tenants[label] += whole
        for label, count in sorted(paused_types.items()):
            if count:
                types.add_metric([label], count)
        for label, count in sorted(paused_tenants.items()):
            if count:
                tenants.add_metric([label], count)
        yield types
        yield tenants

    def depth_families(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily(
            "queue_depth",
            "Jobs not done in the store (every daemon's), by tenant, type and state;"
            f" waiting and scheduled counts stop at {DEPTH_CAP} per type;"
            f" read at most every {DEPTH_TTL_S:g} s",
            labels=["tenant", "type", "state"],
        )
        sums: Tally[tuple[str, str, str]] = Tally()
        for stored_type, counts in sorted(self._depth.items()):
            tenant, jobtype = self.labels.stored(stored_type)
            sums[(tenant, jobtype, "waiting")] += counts.waiting
            sums[(tenant, jobtype, "scheduled")] += counts.scheduled
            sums[(tenant, jobtype, "running")] += counts.running
        for labels, value in sums.items():
            depth.add_metric(list(labels), value)
        yield depth
        live = GaugeMetricFamily(
            "queue_live_workers",
            "Pull workers seen within their lease (every daemon's), by tenant",
            labels=["tenant"],
        )
        workers: Tally[str] = Tally()
        for client, count in self._live_workers.items():
            workers[self.labels.tenant(client)] += count
        for label, count in sorted(workers.items()):
            live.add_metric([label], count)
        yield live
        yield from self._paused_families()
        if self._depth_ok is not None:
            up = GaugeMetricFamily(
                "queue_store_up", "1 if the store answered the last queue depth query, else 0"
            )
            up.add_metric([], 1 if self._depth_ok else 0)
            yield up
