"""Exit codes of docs/api.md: 1xx retry, 2xx ok, 4xx failed, 5xx error."""

from __future__ import annotations

from typing import Literal, TypeGuard

Code = Literal["retry", "ok", "failed", "error"]

OK = 200
FORBIDDEN = 403  # http: the URL's address is refused (runners.sandbox.addresses)
BAD_GATEWAY = 502  # http: the endpoint could not be reached
ERROR = 500  # exception, crash, protocol error
TIMEOUT = 504  # a job over its time
NOT_RUN = 100  # with ``ran=False``: the job never started, run it again


def code_of(exitcode: int) -> Code:
    """retry (1xx), ok (2xx), failed (4xx), error (5xx and anything else)."""
    if 100 <= exitcode <= 199:
        return "retry"
    if 200 <= exitcode <= 299:
        return "ok"
    if 400 <= exitcode <= 499:
        return "failed"
    return "error"


def valid_exitcode(value: object) -> TypeGuard[int]:
    """An int a handler may report, 100..599 (not a bool); 3xx counts as an error."""
    return isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599
