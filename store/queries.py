"""Every SQL statement the store runs, with ``$n`` parameters.

Tenant scoping is always done here, in SQL: ``split_part(type, '-', 1) = $client``
matches the expression index ``jobs_client_created_idx`` (a client name never
contains ``-``, so ``a`` never sees ``ab``'s jobs). STATS scopes by the range
``type >= $client || '-' AND type < $client || '.'`` on the C-collated type
instead, the same set, so that it can read the partial indexes and type_counts.
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

# A small batch in one statement, one round trip: the insert, and the jobs
# notification sent at its commit ($6, or "" when some ids existed already:
# which of the jobs were new is not known then). $1..$5 the columns as arrays.
INSERT_FEW = """
WITH added AS (
    INSERT INTO jobs (id, type, dt, data, create_dt)
    SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[],
                         $5::timestamptz[])
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT n, CASE WHEN n > 0 THEN
    pg_notify('qd_jobs', CASE WHEN n = cardinality($1::text[]) THEN $6 ELSE '' END)
END, set_config('synchronous_commit', 'off', true)
FROM (SELECT count(*) AS n FROM added) c
"""
INSERT_FROM_JOBS_IN = """
INSERT INTO jobs (id, type, dt, data, create_dt)
SELECT id, type, dt, data, create_dt FROM jobs_in
ON CONFLICT (id) DO NOTHING
"""

# The eligible-jobs read without locking (CLAIM_IDS below is the claim's own);
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

# $1 client. Never reads a done job: done counts come from type_counts (kept
# by the triggers of migration 0003), waiting and scheduled from
# jobs_waiting_idx, running from jobs_running_idx. The range on the C-collated
# type is the client's prefix ('.' follows '-'). Every code is counted in
# type_counts, so a type shows as long as any of its jobs exists, whatever
# its code, as when this counted the jobs themselves.
STATS = """
WITH done AS (
    SELECT type,
           sum(n) FILTER (WHERE code = 'ok') AS done_ok,
           sum(n) FILTER (WHERE code = 'failed') AS done_failed,
           sum(n) FILTER (WHERE code = 'error') AS done_error
    FROM type_counts
    WHERE type >= $1 || '-' AND type < $1 || '.' AND n <> 0
    GROUP BY type
), waiting AS (
    SELECT type,
           count(*) FILTER (WHERE dt <= now()) AS waiting,
           count(*) FILTER (WHERE dt > now()) AS scheduled
    FROM jobs
    WHERE lock = '' AND type >= $1 || '-' AND type < $1 || '.'
    GROUP BY type
), running AS (
    SELECT type, count(*) AS running
    FROM jobs
    WHERE lock <> '' AND lock <> '__done' AND type >= $1 || '-' AND type < $1 || '.'
    GROUP BY type
)
SELECT substr(type, strpos(type, '-') + 1) AS type,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(w.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running,
       coalesce(d.done_ok, 0)::bigint AS done_ok,
       coalesce(d.done_failed, 0)::bigint AS done_failed,
       coalesce(d.done_error, 0)::bigint AS done_error
FROM waiting w
FULL JOIN running r USING (type)
FULL JOIN done d USING (type)
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

# A token is live while its tenant is active and expires_at is NULL or in the
# future, by the database clock (0004_tenant_tokens.sql).
_LIVE = "(tt.expires_at IS NULL OR tt.expires_at > now())"

# $1 client. Takes the tenant's row lock, so adds, rotations and revokes of one
# tenant run one after the other.
LOCK_TENANT = "SELECT client, revoked_at FROM tenants WHERE client = $1 FOR UPDATE"

# $1 client: creates the tenant or re-activates a revoked one; NULL if active.
ADD_TENANT = """
INSERT INTO tenants AS t (client) VALUES ($1)
ON CONFLICT (client) DO UPDATE
    SET created_at = now(), revoked_at = NULL
    WHERE t.revoked_at IS NOT NULL
RETURNING client
"""

# $1 client: a re-activated tenant starts without its revoked tokens.
DELETE_TENANT_TOKENS = "DELETE FROM tenant_tokens WHERE client = $1"

# $1 client, $2 token hash (HMAC); the current token has no expiry.
INSERT_TENANT_TOKEN = "INSERT INTO tenant_tokens (client, token_hash) VALUES ($1, $2)"

# $1 client, $2 grace seconds. Only the newest previous token stays live: older
# ones (expired, or still in a former grace) go; the current token (expires_at
# NULL) expires at now() + grace. Then INSERT_TENANT_TOKEN adds the new one.
ROTATE_DROP_OLD = """
DELETE FROM tenant_tokens WHERE client = $1 AND expires_at IS NOT NULL
"""
ROTATE_EXPIRE_CURRENT = """
UPDATE tenant_tokens SET expires_at = now() + make_interval(secs => $2)
WHERE client = $1 AND expires_at IS NULL
"""

LIST_TENANTS = f"""
SELECT t.client, t.created_at, t.revoked_at, t.limits::text AS limits,
       coalesce(newest.token_hash, ''::bytea) AS token_hash,
       coalesce(live.n, 0) AS live_tokens,
       live.grace_until
FROM tenants t
LEFT JOIN LATERAL (
    SELECT tt.token_hash FROM tenant_tokens tt
    WHERE tt.client = t.client ORDER BY tt.created_at DESC LIMIT 1
) newest ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n, min(tt.expires_at) AS grace_until FROM tenant_tokens tt
    WHERE tt.client = t.client AND t.revoked_at IS NULL AND {_LIVE}
) live ON true
ORDER BY t.client
"""

# $1 client: revoking ends every token at once.
REVOKE_TENANT = f"""
WITH t AS (
    UPDATE tenants SET revoked_at = now()
    WHERE client = $1 AND revoked_at IS NULL
    RETURNING client
), expired AS (
    UPDATE tenant_tokens tt SET expires_at = now()
    FROM t WHERE tt.client = t.client AND {_LIVE}
)
SELECT client FROM t
"""

TENANT_TOKENS = f"""
SELECT tt.token_hash, tt.client FROM tenant_tokens tt
JOIN tenants t ON t.client = tt.client
WHERE t.revoked_at IS NULL AND {_LIVE}
"""

TOKEN_KEY = "SELECT value FROM secrets WHERE name = 'token_hmac_key'"

# Overrides of the daemon-wide limits for every active tenant that has any
# (0005_limits_admin.sql).
TENANT_LIMITS = """
SELECT client, limits::text AS limits FROM tenants
WHERE revoked_at IS NULL AND limits <> '{}'::jsonb
"""

# $1 client, $2 the new overrides (a JSON object, text): replaces them all.
SET_TENANT_LIMITS = """
UPDATE tenants SET limits = $2::jsonb
WHERE client = $1 AND revoked_at IS NULL
RETURNING limits::text AS limits
"""

GET_TENANT_LIMITS = """
SELECT limits::text AS limits FROM tenants WHERE client = $1 AND revoked_at IS NULL
"""

# $1 token hash: the new current operator token (no expiry).
INSERT_ADMIN_TOKEN = "INSERT INTO admin_tokens (token_hash) VALUES ($1)"

# $1 grace seconds. Older previous tokens go; the current one expires after
# the grace; then INSERT_ADMIN_TOKEN adds the new one. Serialised by a lock.
LOCK_ADMIN_TOKENS = "LOCK TABLE admin_tokens IN SHARE ROW EXCLUSIVE MODE"
ADMIN_DROP_OLD = "DELETE FROM admin_tokens WHERE expires_at IS NOT NULL"
ADMIN_EXPIRE_CURRENT = """
UPDATE admin_tokens SET expires_at = now() + make_interval(secs => $1)
WHERE expires_at IS NULL
"""
REVOKE_ADMIN_TOKENS = "DELETE FROM admin_tokens"

ADMIN_TOKENS = """
SELECT token_hash FROM admin_tokens WHERE expires_at IS NULL OR expires_at > now()
"""

# $1 lower bound of the tenant's stored types ('client-'), $2 the upper bound
# ('client.'), $3 the cap: counts waiting and scheduled jobs (lock '') on
# jobs_waiting_idx, reading at most $3 entries.
COUNT_WAITING_CAPPED = """
SELECT count(*) FROM (
    SELECT 1 FROM jobs WHERE type >= $1 AND type < $2 AND lock = '' LIMIT $3
) w
"""

# --- the dashboard (GET /admin/overview, GET /{client}/overview) ---------------

# Each query comes in two forms: every tenant (operator), and one tenant, whose
# stored types are the C-collated range ['client-', 'client.') as in STATS
# ($1 is that client; the other parameters follow it, and move up by one in
# the operator's form). Two texts rather than "$1 IS NULL OR ...": a prepared
# statement's generic plan could not use the range as an index condition.
_ALL = "true"
_ONE = "type >= $1 || '-' AND type < $1 || '.'"

# Depth per stored type ({limit} rows at most, by type), without reading
# archived jobs and without counting a deep queue to its end: the waiting
# types are found by a loose scan of jobs_waiting_idx (one descent per type, as
# in WAITING_JOBTYPES), and each type's waiting and scheduled jobs are counted
# up to {cap} index entries each; running jobs from jobs_running_idx; done
# counts from type_counts (0003). The cost is bounded by types x cap, not by
# the number of jobs.
_QUEUE_DEPTHS = """
WITH RECURSIVE wtypes(type) AS (
    (SELECT type FROM jobs WHERE lock = '' AND {scope} ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT j.type FROM jobs j
            WHERE j.lock = '' AND j.type > wtypes.type AND {scope_j}
            ORDER BY j.type LIMIT 1)
    FROM wtypes
    WHERE wtypes.type IS NOT NULL
), waiting AS (
    SELECT t.type,
           (SELECT count(*) FROM (
                SELECT 1 FROM jobs j
                WHERE j.type = t.type AND j.lock = '' AND j.dt <= now() LIMIT {cap}
           ) c) AS waiting,
           (SELECT count(*) FROM (
                SELECT 1 FROM jobs j
                WHERE j.type = t.type AND j.lock = '' AND j.dt > now() LIMIT {cap}
           ) c) AS scheduled
    FROM wtypes t
    WHERE t.type IS NOT NULL
), done AS (
    SELECT type,
           sum(n) FILTER (WHERE code = 'ok') AS done_ok,
           sum(n) FILTER (WHERE code = 'failed') AS done_failed,
           sum(n) FILTER (WHERE code = 'error') AS done_error
    FROM type_counts
    WHERE {scope} AND n <> 0
    GROUP BY type
), running AS (
    SELECT type, count(*) AS running
    FROM jobs
    WHERE lock <> '' AND lock <> '__done' AND {scope}
    GROUP BY type
)
SELECT type,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(w.scheduled, 0) AS scheduled,
       coalesce(w.waiting >= {cap} OR w.scheduled >= {cap}, false) AS capped,
       coalesce(r.running, 0) AS running,
       coalesce(d.done_ok, 0)::bigint AS done_ok,
       coalesce(d.done_failed, 0)::bigint AS done_failed,
       coalesce(d.done_error, 0)::bigint AS done_error
FROM waiting w
FULL JOIN running r USING (type)
FULL JOIN done d USING (type)
ORDER BY type
LIMIT {limit}
"""
_ONE_J = "j.type >= $1 || '-' AND j.type < $1 || '.'"
QUEUE_DEPTHS_ALL = _QUEUE_DEPTHS.format(scope=_ALL, scope_j=_ALL, limit="$1", cap="$2")
QUEUE_DEPTHS_CLIENT = _QUEUE_DEPTHS.format(scope=_ONE, scope_j=_ONE_J, limit="$2", cap="$3")

# Running jobs, oldest first ({limit} at most), with how many run in all. Reads
# jobs_running_idx only: the running set is bounded by the daemons' concurrency.
_RUNNING_JOBS = """
SELECT id, type, lock AS sysid, attempts, create_dt, dt AS lease_until,
       count(*) OVER () AS total
FROM jobs
WHERE lock <> '' AND lock <> '__done' AND {scope}
ORDER BY create_dt, id
LIMIT {limit}
"""
RUNNING_JOBS_ALL = _RUNNING_JOBS.format(scope=_ALL, limit="$1")
RUNNING_JOBS_CLIENT = _RUNNING_JOBS.format(scope=_ONE, limit="$2")

# The newest {limit} failed or errored jobs, their result cut to {chars}
# characters. One descent of jobs_failed_idx (0006) per type that has such a
# job (found in type_counts), at most {limit} entries each; then the newest
# {limit} of those.
_RECENT_FAILURES = """
SELECT f.*
FROM (
    SELECT DISTINCT type FROM type_counts
    WHERE code IN ('failed', 'error') AND n > 0 AND {scope}
) t
CROSS JOIN LATERAL (
    SELECT j.id, j.type, j.code, j.exitcode, j.attempts, j.create_dt, j.done_dt,
           left(j.result, {chars}) AS result,
           coalesce(char_length(j.result) > {chars}, false) AS result_cut
    FROM jobs j
    WHERE j.type = t.type AND j.lock = '__done' AND j.code IN ('failed', 'error')
    ORDER BY j.done_dt DESC
    LIMIT {limit}
) f
ORDER BY f.done_dt DESC, f.id DESC
LIMIT {limit}
"""
RECENT_FAILURES_ALL = _RECENT_FAILURES.format(scope=_ALL, limit="$1", chars="$2")
RECENT_FAILURES_CLIENT = _RECENT_FAILURES.format(scope=_ONE, limit="$2", chars="$3")

# Daemons' sysid leases ($1 at most): live ones first, then those that lapsed
# or were released most recently.
DAEMON_LEASES = """
SELECT sysid, host, data_dir, expires, released_at,
       CASE WHEN released_at IS NOT NULL THEN 'released'
            WHEN expires IS NULL OR expires <= now() THEN 'expired'
            ELSE 'live' END AS state,
       now() AS now
FROM sysids
ORDER BY (released_at IS NULL AND expires > now()) DESC,
         coalesce(released_at, expires) DESC NULLS LAST, sysid
LIMIT $1
"""

# Jobs ever archived per stored type (0006), every code together: sampled by
# each daemon for the throughput. type_counts has a row per (type, code).
ARCHIVED_COUNTS = "SELECT type, sum(archived)::bigint AS archived FROM type_counts GROUP BY type"

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

# --- jobs: the claim path -----------------------------------------------------

JOBS_CHANNEL = "qd_jobs"
HANDLERS_CHANNEL = "qd_handlers"

# $1 the payload: "" (anything may have changed) or which jobs were added and
# are due now, as "jobtype=count" separated by spaces (see store.notes)
NOTIFY_JOBS = "SELECT pg_notify('qd_jobs', $1)"
# The ingest's commits do not wait for the WAL flush (the rows are seen and
# notified at once); FLUSHED then waits for it (in add_jobs, or in flush for
# every batch inserted before it). A transaction that wrote WAL commits
# synchronously, flushing the WAL up to its own commit record, which comes
# after theirs; one that only took an id (as
# pg_current_xact_id() does) wrote none and would not wait. A transactional
# logical message is a WAL record of a few bytes, at any wal_level.
ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true)"
FLUSHED = "SELECT pg_logical_emit_message(true, 'queue_daemon', '')"

# Stored jobtypes with eligible jobs, each counted up to $1. A loose index scan
# over jobs_waiting_idx: each step of the recursion is one descent of the index
# to the next distinct type, so the cost grows with the number of waiting
# types, not of waiting jobs. The count of a type reads at most $1 index
# entries. A type with only future jobs is stepped over with a count of 0.
WAITING_JOBTYPES = """
WITH RECURSIVE types(type) AS (
    (SELECT type FROM jobs WHERE lock = '' ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT j.type FROM jobs j
            WHERE j.lock = '' AND j.type > types.type
            ORDER BY j.type LIMIT 1)
    FROM types
    WHERE types.type IS NOT NULL
)
SELECT types.type, eligible.n
FROM types
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (SELECT 1 FROM jobs j
          WHERE j.type = types.type AND j.lock = '' AND j.dt <= now()
          LIMIT $1) capped
) eligible
WHERE types.type IS NOT NULL AND eligible.n > 0
"""

# $1 type, $2 limit. Kept apart so a test can EXPLAIN it: it must read
# jobs_waiting_idx, oldest dt first.
CLAIM_IDS = """
SELECT id FROM jobs
WHERE type = $1 AND lock = '' AND dt <= now()
ORDER BY dt
LIMIT $2
FOR UPDATE SKIP LOCKED
"""

# The type's live handler version (evaluated once per statement): the claim
# reads it in the snapshot that found the jobs, so a job added after a handler
# was replaced is never run by the version before (its daemon's cache may not
# have heard of the change yet).
LIVE_HANDLER_ID = """
SELECT h.id FROM handlers h
WHERE h.type = $1 AND h.deleted_at IS NULL
ORDER BY h.dt DESC, h.id DESC
LIMIT 1
"""

# $3 sysid, $4 lease seconds. `= ANY(ARRAY(...))` rather than `IN (...)`: the
# array is computed first and the update then reads the primary key; with IN
# the planner sometimes joined against a scan of the whole table (docs/architecture.md).
# due_ms: since when the job was due, in epoch ms: the later of its creation
# and its dt before this update (a subquery in RETURNING reads the statement's
# snapshot, which does not see the statement's own changes); the queue log
# reports how long each job waited from then.
CLAIM = f"""
UPDATE jobs
SET lock = $3, dt = now() + make_interval(secs => $4), attempts = attempts + 1
WHERE id = ANY(ARRAY({CLAIM_IDS}))
RETURNING id, type, data, attempts, create_dt,
          (SELECT floor(extract(epoch FROM greatest(o.dt, o.create_dt)) * 1000)::bigint
           FROM jobs o WHERE o.id = jobs.id) AS due_ms,
          ({LIVE_HANDLER_ID}) AS handler
"""

# Waiting jobs of type $1 created more than $2 seconds ago are done with
# error 503 and result $3 (a type without a handler whose jobs' time ran
# out), at most $4 a statement; through the waiting index, never done jobs.
EXPIRE_WAITING = """
UPDATE jobs
SET lock = '__done', done_dt = now(), dt = now() + interval '1000 years',
    code = 'error', exitcode = 503, result = $3
WHERE id = ANY(ARRAY(
    SELECT id FROM jobs
    WHERE type = $1 AND lock = '' AND dt <= now()
      AND create_dt < now() - make_interval(secs => $2)
    LIMIT $4
    FOR UPDATE SKIP LOCKED
))
RETURNING id
"""

# $1 ids, $2 sysid, $3 lease seconds
RENEW = """
UPDATE jobs SET dt = now() + make_interval(secs => $3)
WHERE id = ANY($1::text[]) AND lock = $2
"""

# One row of the unnest per release: $1 id, $2 how, $3 code, $4 exitcode,
# $5 result, $6 delay seconds, $7 refund_attempt; $8 sysid. The outcome
# (code, exitcode, result) is written as a whole when code is given and kept
# as it was when not, so a result never outlives the run that produced it.
RELEASE = """
UPDATE jobs j
SET lock = CASE r.how WHEN 'archive' THEN '__done' ELSE '' END,
    dt = CASE r.how
        WHEN 'retry' THEN now() + make_interval(secs => r.delay)
        WHEN 'unget' THEN now()
        ELSE now() + interval '1000 years'
    END,
    done_dt = CASE r.how WHEN 'archive' THEN now() ELSE j.done_dt END,
    code = CASE WHEN r.code IS NULL THEN j.code ELSE r.code END,
    exitcode = CASE WHEN r.code IS NULL THEN j.exitcode ELSE r.exitcode END,
    result = CASE WHEN r.code IS NULL THEN j.result ELSE r.result END,
    attempts = CASE WHEN r.refund THEN greatest(j.attempts - 1, 0) ELSE j.attempts END
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::float8[],
            $7::bool[]) AS r(id, how, code, exitcode, result, delay, refund)
WHERE j.id = r.id AND j.lock = $8
"""

# Running jobs whose lease passed, or whose owner's sysid lapsed or was
# released (at once, whatever their dt). Reads only running jobs
# (jobs_running_idx), never waiting or done ones. SKIP LOCKED: a row that its
# owner is releasing right now is left to it, and two daemons expiring at once
# neither wait on nor deadlock with each other.
EXPIRE_LOCKS = """
UPDATE jobs SET lock = '', dt = now()
WHERE id = ANY(ARRAY(
    SELECT j.id
    FROM jobs j
    LEFT JOIN sysids s ON s.sysid = j.lock
    WHERE j.lock <> '' AND j.lock <> '__done'
      AND (j.dt < now() OR s.expires < now() OR s.released_at IS NOT NULL)
    FOR UPDATE OF j SKIP LOCKED
))
RETURNING id, type, attempts
"""

# $1 retention seconds, $2 chunk size: one bounded chunk per statement; the
# rows deleted, counted per jobtype (for the queue log).
PURGE_CHUNK = """
WITH gone AS (
    DELETE FROM jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM jobs
        WHERE lock = '__done' AND done_dt < now() - make_interval(secs => $1)
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING type
)
SELECT type, count(*)::int AS n FROM gone GROUP BY type
"""

# --- handlers -----------------------------------------------------------------

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
