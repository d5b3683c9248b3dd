"""An OTLP/HTTP traces receiver in the test process: what a collector would get
from a daemon started with ``--otlp-endpoint``, decoded span by span."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True, slots=True)
class Span:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # 16 hex digits, "" for a root span
    kind: int  # the OTLP enum: 1 internal, 2 server
    attributes: dict[str, object]
    start_ns: int
    end_ns: int
    service: str


class Receiver:
    """Spans received at ``url`` (``…/v1/traces``), in arrival order."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._take(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for resource in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource.resource.attributes
                 if a.key == "service.name"),
                "",
            )  # fmt: skip
            for scope in resource.scope_spans:
                for s in scope.spans:
                    got.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            service=service,
                        )
                    )
        with self._lock:
            self.spans += got

    def of_trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], within: float = 20.0) -> list[Span]:
        """The spans of ``trace_id`` once one of each of ``names`` arrived."""
        deadline = time.monotonic() + within
        while True:
            spans = self.of_trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"spans of trace {trace_id}: {sorted(s.name for s in spans)}, "
                    f"wanted {sorted(names)} within {within:g} s"
                )
            time.sleep(0.05)


def _value(value: object) -> object:
    kind = value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(value, kind) if kind else None


@contextmanager
def receiver() -> Iterator[Receiver]:
    """A receiver serving on a free port until the block ends."""
    made = Receiver()
    made._thread.start()
    try:
        yield made
    finally:
        made._server.shutdown()
        made._server.server_close()
        made._thread.join(timeout=10)
