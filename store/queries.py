"""Every SQL statement the store runs, with ``$n`` parameters.

Tenant scoping is always done here, in SQL: ``split_part(type, '-', 1) = $client``
matches the expression index ``jobs_client_created_idx`` (a client name never
contains ``-``, so ``a`` never sees ``ab``'s jobs).
"""

from __future__ import annotations

# --- migrations -------------------------------------------------------------

MIGRATION_LOCK = "SELECT pg_advisory_lock($1)"
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock($1)"
MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    int PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
MIGRATIONS_APPLIED = "SELECT version FROM schema_migrations ORDER BY version"
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
MIGRATION_RECORD = "INSERT INTO schema_migrations (version) VALUES ($1)"

# --- connection setup ---------------------------------------------------------

# One per session; rows vanish at each commit, so it is always empty between calls.
CREATE_JOBS_IN = """
CREATE TEMP TABLE IF NOT EXISTS jobs_in (
    id        text,
    type      text,
    dt        timestamptz,
    data      text,
    create_dt timestamptz
) ON COMMIT DELETE ROWS
"""
JOBS_IN_TABLE = "jobs_in"
JOB_COPY_COLUMNS = ("id", "type", "dt", "data", "create_dt")

PING = "SELECT 1"

# --- jobs: ingestion ----------------------------------------------------------

JOBS_TABLE = "jobs"
INSERT_FROM_JOBS_IN = """
INSERT INTO jobs (id, type, dt, data, create_dt)
SELECT id, type, dt, data, create_dt FROM jobs_in
ON CONFLICT (id) DO NOTHING
"""

COPY_CEILING_CREATE = """
CREATE TEMP TABLE IF NOT EXISTS jobs_copy_ceiling
    (LIKE jobs INCLUDING DEFAULTS) ON COMMIT DELETE ROWS
"""
COPY_CEILING_TABLE = "jobs_copy_ceiling"
COPY_CEILING_DROP = "DROP TABLE IF EXISTS jobs_copy_ceiling"

# The claim path's first step (a later capability adds FOR UPDATE SKIP LOCKED);
# kept here so a test can check its plan uses jobs_waiting_idx.
ELIGIBLE_IDS = """
SELECT id FROM jobs WHERE type = $1 AND lock = '' AND dt <= now() ORDER BY dt LIMIT 100
"""

# --- jobs: a tenant's view ----------------------------------------------------

_JOB_COLUMNS = """
    id,
    substr(type, strpos(type, '-') + 1) AS type,
    lock, dt, create_dt, done_dt, attempts, code, exitcode, result, data
"""

GET_JOB = f"""
SELECT {_JOB_COLUMNS}
FROM jobs
WHERE id = $1 AND split_part(type, '-', 1) = $2
"""

# $1 client, $2 type without prefix or NULL, $3 state or NULL, $4 limit
_LIST_FILTERS = """
WHERE split_part(type, '-', 1) = $1
  AND ($2::text IS NULL OR type = $1 || '-' || $2::text)
  AND ($3::text IS NULL OR $3::text = CASE lock
        WHEN '' THEN 'waiting' WHEN '__done' THEN 'done' ELSE 'running' END)
"""

LIST_JOBS_FIRST = f"""
SELECT {_JOB_COLUMNS}
FROM jobs
{_LIST_FILTERS}
ORDER BY split_part(type, '-', 1), create_dt DESC, id DESC
LIMIT $4
"""

# $5 create_dt, $6 id of the last row of the previous page. The row comparison
# with the index's own order (both DESC) makes it an index condition.
LIST_JOBS_AFTER = f"""
SELECT {_JOB_COLUMNS}
FROM jobs
{_LIST_FILTERS}
  AND (create_dt, id) < ($5::timestamptz, $6::text)
ORDER BY split_part(type, '-', 1), create_dt DESC, id DESC
LIMIT $4
"""

STATS = """
SELECT substr(type, strpos(type, '-') + 1) AS type,
       count(*) FILTER (WHERE lock = '' AND dt <= now()) AS waiting,
       count(*) FILTER (WHERE lock = '' AND dt > now()) AS scheduled,
       count(*) FILTER (WHERE lock <> '' AND lock <> '__done') AS running,
       count(*) FILTER (WHERE lock = '__done' AND code = 'ok') AS done_ok,
       count(*) FILTER (WHERE lock = '__done' AND code = 'failed') AS done_failed,
       count(*) FILTER (WHERE lock = '__done' AND code = 'error') AS done_error
FROM jobs
WHERE split_part(type, '-', 1) = $1
GROUP BY type
ORDER BY type
"""

# Only a waiting job; a concurrent claim that wins the row lock makes this
# update find lock <> '' on re-check, so the caller sees Conflict, not a race.
CANCEL_JOB = f"""
UPDATE jobs
SET lock = '__done',
    done_dt = now(),
    dt = now() + interval '1000 years',
    code = 'failed',
    exitcode = 499,
    result = 'cancelled'
WHERE id = $1 AND split_part(type, '-', 1) = $2 AND lock = ''
RETURNING {_JOB_COLUMNS}
"""

# --- tenants ------------------------------------------------------------------

ADD_TENANT = """
INSERT INTO tenants AS t (client, token_hash) VALUES ($1, $2)
ON CONFLICT (client) DO UPDATE
    SET token_hash = EXCLUDED.token_hash, created_at = now(), revoked_at = NULL
    WHERE t.revoked_at IS NOT NULL
RETURNING client
"""

LIST_TENANTS = """
SELECT client, token_hash, created_at, revoked_at FROM tenants ORDER BY client
"""

REVOKE_TENANT = """
UPDATE tenants SET revoked_at = now()
WHERE client = $1 AND revoked_at IS NULL
RETURNING client
"""

TENANT_TOKENS = "SELECT token_hash, client FROM tenants WHERE revoked_at IS NULL"

# --- sysids -------------------------------------------------------------------

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
