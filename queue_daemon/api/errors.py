"""API errors: one exception type, mapped to the JSON error shape in one place (http.py)."""

from __future__ import annotations

import math


class ApiError(Exception):
    """An error reply: ``status`` with ``{"error": kind, "message": message}``."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        close: bool = False,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}
        self.close = close  # close the connection after the reply (the body was not read)
        self.reason = reason  # a finer cause, in the body as "reason" (a cancelled job)


def bad_name(message: str) -> ApiError:
    return ApiError(400, "bad_name", message)


def bad_payload(message: str) -> ApiError:
    return ApiError(400, "bad_payload", message)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "bad_request", message)


def too_large(message: str) -> ApiError:
    return ApiError(413, "too_large", message)


def timeout(message: str) -> ApiError:
    return ApiError(408, "timeout", message, close=True)


def not_found(message: str = "not found") -> ApiError:
    return ApiError(404, "not_found", message)


def unavailable(message: str) -> ApiError:
    return ApiError(503, "unavailable", message, headers={"Retry-After": "1"})


def rate_limited(message: str, retry_after: float) -> ApiError:
    return ApiError(
        429, "rate_limited", message, headers={"Retry-After": str(max(1, math.ceil(retry_after)))}
    )


def conflict(message: str) -> ApiError:
    return ApiError(409, "conflict", message)
