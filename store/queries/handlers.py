"""Handlers: put, get, delete, count."""

from __future__ import annotations

_HANDLER_COLUMNS = "id, type, dt, data::text AS data"

# $1 id, $2 type, $3 data (JSON text). The notification goes out at commit.
PUT_HANDLER = f"""
INSERT INTO handlers (id, type, data) VALUES ($1, $2, $3::jsonb)
RETURNING {_HANDLER_COLUMNS}, pg_notify('qd_handlers', type)
"""

GET_HANDLER = f"""
SELECT {_HANDLER_COLUMNS}
FROM handlers
WHERE type = $1 AND deleted_at IS NULL
ORDER BY dt DESC, id DESC
LIMIT 1
"""

# PostgreSQL sends identical notifications of one transaction once.
DELETE_HANDLER = """
UPDATE handlers SET deleted_at = now()
WHERE type = $1 AND deleted_at IS NULL
RETURNING pg_notify('qd_handlers', type)
"""

# $1 client: serialises handler adds of one tenant, so the handler limit holds.
LOCK_CLIENT_HANDLERS = "SELECT pg_advisory_xact_lock(hashtext('qd_handlers:' || $1))"

# $1 stored jobtype: whether it has a live handler.
HANDLER_LIVE = "SELECT EXISTS (SELECT 1 FROM handlers WHERE type = $1 AND deleted_at IS NULL)"

COUNT_HANDLERS = """
SELECT count(DISTINCT type) FROM handlers
WHERE split_part(type, '-', 1) = $1 AND deleted_at IS NULL
"""
