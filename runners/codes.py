"""Exit codes of docs/api.md the runners report (their classes, 1xx retry, 2xx ok,
4xx failed, 5xx error, are ``queue_daemon.domain.outcomes.code_of``)."""

from __future__ import annotations

from typing import TypeGuard

OK = 200
FORBIDDEN = 403  # http: the URL's address is refused (runners.sandbox.addresses)
BAD_GATEWAY = 502  # http: the endpoint could not be reached
ERROR = 500  # exception, crash, protocol error
TIMEOUT = 504  # a job over its time
NOT_RUN = 100  # with ``ran=False``: the job never started, run it again


def valid_exitcode(value: object) -> TypeGuard[int]:
    """An int a handler may report, 100..599 (not a bool); 3xx counts as an error."""
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599
