"""OpenTelemetry traces (docs/operations.md, "Traces").

Off unless the daemon is given an OTLP endpoint (``--otlp-endpoint``, or the
SDK's own ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``):
then an add is a span (``queue.add``, a child of the caller's W3C
``traceparent`` when it sent one), its jobs keep that span's context, and each
job's ingest, claim, run and release are spans of that trace. The handler gets
the run's context (``ctx.traceparent``, ``TRACEPARENT``; a pulled job's
``traceparent``). Spans go out in batches from the SDK's own thread (HTTP and
protobuf), never from the event loop.

Off, ``Tracing.off()`` does nothing, and the daemon asks it nothing per job:
the callers test ``on`` first, and jobs added while it is off carry no trace.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

logger = logging.getLogger(__name__)

# a W3C traceparent of version 00, trace and span ids not all zero
TRACEPARENT_RE = re.compile(r"00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE = "queue-daemon"
EXPORT_TIMEOUT_S = 5.0
Attributes = Mapping[str, str | int | float | bool]


_warned: list[bool] = [False]


def _failed(what: str) -> None:
    """A span that could not be made or ended: logged once, never raised (the run
    loop's bookkeeping around these calls must go on whatever the SDK does)."""
    if not _warned[0]:
        _warned[0] = True
        logger.warning(
            "tracing: %s failed; spans may be missing",
            what,
            exc_info=True,
            extra={"action": "tracing_failed"},
        )


def valid_traceparent(text: str | None) -> str | None:
    """``text`` when it is a W3C traceparent this daemon keeps, else None."""
    if text is None:
        return None
    text = text.strip().lower()
    return text if TRACEPARENT_RE.fullmatch(text) else None


class Tracing:
    """The daemon's spans. Every method but ``start`` is a no-op when off."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self._provider = provider
        self._tracer: Tracer | None = None if provider is None else provider.get_tracer(SERVICE)
        self.on = provider is not None

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    @classmethod
    def start(cls, endpoint: str | None, *, service: str = SERVICE) -> Tracing:
        """Export to ``endpoint`` (the OTLP/HTTP traces URL, ``…/v1/traces``), or
        where the SDK's variables say; off when neither is set."""
        if endpoint is None and not any(os.environ.get(v) for v in ENDPOINT_VARIABLES):
            return cls.off()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        # a collector that does not answer delays no more than this (a stop's flush)
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        logger.info(
            "traces exported to %s",
            endpoint or "the endpoint of OTEL_EXPORTER_OTLP_*",
            extra={"action": "tracing_on"},
        )
        return cls(provider)

    def shutdown(self) -> None:
        """Send what is left and stop (blocks: call it off the event loop)."""
        if self._provider is not None:
            self._provider.shutdown()

    def span(
        self,
        name: str,
        parent: str | None,
        *,
        start_ns: int | None = None,
        attributes: Attributes | None = None,
        server: bool = False,
    ) -> Span | None:
        """A span begun (at ``start_ns``, epoch ns) as a child of the traceparent
        ``parent`` (a new trace when None); end it with ``end``. None when off."""
        if self._tracer is None:
            return None
        from opentelemetry.trace import SpanKind

        try:
            return self._tracer.start_span(
                name,
                context=_context(parent),
                kind=SpanKind.SERVER if server else SpanKind.INTERNAL,
                attributes=attributes,
                start_time=start_ns,
            )
        except Exception:
            _failed(f"a {name} span")
            return None

    # --- a traced job's claim, run and release (the run loop and the pulls) ----

    def step(
        self,
        name: str,
        jobs: Sequence[Traced],
        began_ns: int,
        attributes: Attributes | None = None,
    ) -> None:
        """A span ``name`` (a claim, an ingest) for each traced job of ``jobs``,
        from ``began_ns`` to now."""
        if self._tracer is None:
            return
        now = time.time_ns()
        for job in jobs:
            if job.trace is not None:
                span = self.span(
                    name,
                    job.trace,
                    start_ns=began_ns,
                    attributes={**(attributes or {}), "queue.job": job.id},
                )
                end(span, end_ns=now)

    def begin(
        self,
        name: str,
        jobs: Sequence[Carrier],
        attributes: Attributes,
        *,
        start_ns: int | None = None,
    ) -> dict[str, Span]:
        """A span ``name`` begun (now, or at ``start_ns``) for each traced job of
        ``jobs`` (its run, a worker's claim); each such job's ``trace`` becomes
        that span's (what its handler or worker gets). End them with ``end``."""
        begun: dict[str, Span] = {}
        if self._tracer is None:
            return begun
        for job in jobs:
            if job.trace is not None:
                span = self.span(
                    name,
                    job.trace,
                    start_ns=start_ns,
                    attributes={**attributes, "queue.job": job.id},
                )
                if span is not None:
                    begun[job.id] = span
                    job.trace = traceparent_of(span)
        return begun

    def released(
        self, runs: Mapping[str, Span], outcomes: Mapping[str, str | None], began_ns: int
    ) -> None:
        """The runs of ``runs`` ended at ``began_ns``, when their release began; a
        span for each release, from then to now. ``outcomes``: each job's code
        (None: put back, not decided here)."""
        now = time.time_ns()
        for job_id, run in runs.items():
            code = outcomes.get(job_id)
            try:
                run.set_attribute("queue.code", code or "put-back")
            except Exception:
                _failed("a run span's outcome")
            end(run, end_ns=began_ns, error=code if code in ("error", "failed") else None)
            release = self.span(
                "queue.release",
                traceparent_of(run),
                start_ns=began_ns,
                attributes={"queue.job": job_id},
            )
            end(release, end_ns=now)


class Carrier(Protocol):
    """A job whose trace becomes its run's (``ClaimedJob``, ``PulledJob``)."""

    id: str
    trace: str | None


class Traced(Protocol):
    """A job (or an add) as a span needs it: its id and trace."""

    @property
    def id(self) -> str: ...

    @property
    def trace(self) -> str | None: ...


def traceparent_of(span: Span | None) -> str | None:
    """The W3C traceparent of ``span``'s context (what its children name)."""
    if span is None:
        return None
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def end(span: Span | None, *, end_ns: int | None = None, error: str | None = None) -> None:
    if span is None:
        return
    try:
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)
    except Exception:
        _failed("ending a span")


def _context(parent: str | None) -> Context:
    from opentelemetry import trace
    from opentelemetry.context import Context

    match = None if parent is None else TRACEPARENT_RE.fullmatch(parent)
    if match is None:
        return Context()  # a new trace
    trace_id, span_id, flags = match.groups()
    remote = trace.SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(flags, 16)),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(remote))
