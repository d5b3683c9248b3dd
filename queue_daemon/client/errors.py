"""What the client raises: the daemon's JSON error shape as exceptions."""

from __future__ import annotations


class QueueError(Exception):
    """An error reply (``status``, ``kind`` as in ``{"error": kind, "message": …}``),
    or a daemon that could not be reached (status 0, kind ``unreachable``)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"{status} {kind}: {message}" if status else message)
        self.status = status
        self.kind = kind
        self.message = message


class BadRequest(QueueError):
    """400: a bad name, payload, parameter or body."""


class Unauthorized(QueueError):
    """401: no token, or a token the daemon does not know."""


class Forbidden(QueueError):
    """403: the token does not own this client's path."""


class NotFound(QueueError):
    """404: no such job or handler (or another tenant's)."""


class Conflict(QueueError):
    """409: the job is not in a state for this (e.g. a claim that no longer holds it)."""


class TooLarge(QueueError):
    """413: a payload, body or request over a limit."""


class RateLimited(QueueError):
    """429: over the tenant's add rate or waiting limit; ``retry_after`` seconds."""

    def __init__(self, status: int, kind: str, message: str, retry_after: float) -> None:
        super().__init__(status, kind, message)
        self.retry_after = retry_after


class Unavailable(QueueError):
    """503, or the daemon could not be reached: nothing was done; try again."""


_BY_STATUS: dict[int, type[QueueError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    503: Unavailable,
}


def error_of(status: int, body: object, retry_after: str | None = None) -> QueueError:
    """The exception for an error reply with JSON ``body`` (or anything else)."""
    kind, message = "error", f"HTTP {status}"
    if isinstance(body, dict):
        kind = str(body.get("error", kind))
        message = str(body.get("message", message))
    if status == 429:
        try:
            wait = float(retry_after) if retry_after is not None else 1.0
        except ValueError:
            wait = 1.0
        return RateLimited(status, kind, message, wait)
    return _BY_STATUS.get(status, QueueError)(status, kind, message)
