"""Blobs: put, read, delete, a tenant's bytes."""

from __future__ import annotations

# $1 client: serialises blob puts and deletes of one tenant, so its bytes limit holds.
LOCK_CLIENT_BLOBS = "SELECT pg_advisory_xact_lock(hashtext('qd_blobs:' || $1))"

BLOB_SIZE = "SELECT size FROM blobs WHERE client = $1 AND addr = $2"

CLIENT_BYTES = "SELECT coalesce(sum(size), 0)::bigint FROM blobs WHERE client = $1"

# $1 client, $2 addr, $3 size, $4 data
PUT_BLOB = """
INSERT INTO blobs (client, addr, size, data) VALUES ($1, $2, $3, $4)
ON CONFLICT (client, addr) DO NOTHING
"""

READ_BLOB = "SELECT data FROM blobs WHERE client = $1 AND addr = $2"

# whether the current handler of one of $1's types runs the module $2
BLOB_IN_USE = """
SELECT h.type FROM (
    SELECT DISTINCT ON (type) type, data FROM handlers
    WHERE split_part(type, '-', 1) = $1 AND deleted_at IS NULL
    ORDER BY type, dt DESC, id DESC
) h
WHERE h.data->>'module' = $2
LIMIT 1
"""

DELETE_BLOB = "DELETE FROM blobs WHERE client = $1 AND addr = $2 RETURNING size"
