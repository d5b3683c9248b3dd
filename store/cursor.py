"""Opaque paging cursors: the (create_dt, id) of the last job of a page."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from queue_daemon.store.errors import BadCursor

_SEP = "|"  # never in an ISO-8601 timestamp, so the id may contain it


def encode_cursor(create_dt: datetime, job_id: str) -> str:
    raw = f"{create_dt.isoformat()}{_SEP}{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Return (create_dt, id); BadCursor for anything ``encode_cursor`` did not make."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
        stamp, sep, job_id = raw.partition(_SEP)
        create_dt = datetime.fromisoformat(stamp)
    except (ValueError, UnicodeError, binascii.Error) as exc:
        raise BadCursor(f"bad cursor {cursor[:40]!r}") from exc
    if not sep or not job_id or create_dt.tzinfo is None:
        raise BadCursor(f"bad cursor {cursor[:40]!r}")
    return create_dt, job_id
