"""The daemons' sysid leases."""

from __future__ import annotations

# $1 holder, $2 host, $3 data_dir, $4 lease seconds. DO NOTHING: a number that
# someone inserted by hand is skipped, never reused; the caller tries the next.
RESERVE_NEW_SYSID = """
INSERT INTO sysids (sysid, holder, host, data_dir, expires)
VALUES (nextval('sysid_seq')::text, $1, $2, $3, now() + make_interval(secs => $4))
ON CONFLICT (sysid) DO NOTHING
RETURNING sysid
"""

# $1 sysid, $2 holder, $3 host, $4 data_dir, $5 lease seconds, $6 takeover
RESERVE_SYSID = """
INSERT INTO sysids AS s (sysid, holder, host, data_dir, expires)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
ON CONFLICT (sysid) DO UPDATE
    SET holder = EXCLUDED.holder,
        host = EXCLUDED.host,
        data_dir = EXCLUDED.data_dir,
        expires = EXCLUDED.expires,
        released_at = NULL
    WHERE s.released_at IS NOT NULL
       OR s.expires IS NULL
       OR s.expires <= now()
       OR s.holder = EXCLUDED.holder
       OR ($6::bool AND s.host = EXCLUDED.host AND s.data_dir = EXCLUDED.data_dir)
RETURNING sysid
"""

RENEW_SYSID = """
UPDATE sysids SET expires = now() + make_interval(secs => $3)
WHERE sysid = $1 AND holder = $2 AND released_at IS NULL
RETURNING sysid
"""

RELEASE_SYSID = """
UPDATE sysids SET released_at = now(), expires = now()
WHERE sysid = $1 AND holder = $2 AND released_at IS NULL
"""
