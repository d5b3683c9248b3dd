"""Pull workers: claims by a tenant's own processes, their renewals, completes
and hand-backs, the registry of workers, and the done-job checks that wake
``GET /job/{id}?wait=``.

A pulled job's lock is ``'w:' || <32 hex claim token> || ':' || <worker>``
(migration 0008); every statement here matches a whole lock value, so only
the holder of a claim can act on it. Every statement is scoped to the client
($client) in SQL as well.
"""

from __future__ import annotations

from queue_daemon.store.queries.queue import (
    CLAIMABLE,
    CLAIMABLE_CTES,
    KEY_CURSOR,
    PICKED_COLUMNS,
)

DONE_CHANNEL = "qd_done"
LOCK_PREFIX_LEN = 35  # len('w:') + 32 hex + len(':'): substr(lock, 36) is the worker name

# The rows of the ids $1 of one client, for a statement that finds its rows
# by id: an index condition on the primary key with an array the planner
# cannot see into (as queue.CLAIM's), and the client as a range of the type
# (as STATS, the same rows), which no index of jobs can take. With statistics
# from when the table was small (the usual case while a backlog is drained),
# a plain join with the ids and split_part(type, ...) = client was planned as
# a scan of the client's jobs (its expression index, or the whole table)
# hashed against the ids: 38 ms instead of 1.6 for a complete of 1,000 jobs
# with 100,000 waiting, measured.
_BY_IDS = """{row}id = ANY(ARRAY(SELECT unnest($1::text[])))
  AND {row}type >= {client} || '-' AND {row}type < {client} || '.'"""

# The worker's heartbeat, a CTE of each statement below: $client, $worker and
# the lease its jobs are held under (NULL: keep the one it had).
_HEARTBEAT = """
heartbeat AS (
    INSERT INTO workers AS w (client, name, lease)
    VALUES ({client}, {worker}, coalesce({lease}, 60))
    ON CONFLICT (client, name) DO UPDATE
    SET last_seen = now(), lease = coalesce({lease}, w.lease)
)
"""

# $1 type, $2 limit, $3 lock, $4 lease seconds, $5 client, $6 worker, $7 the
# key after which a keyed claim starts; the last row, its id NULL, carries in
# its last column where the next one starts (queue.KEY_CURSOR)
CLAIM = f"""
WITH {_HEARTBEAT.format(client="$5", worker="$6", lease="$4::float8")},
{CLAIMABLE_CTES.format(after="$7", also="true")}
-- as queue.CLAIM: picked and locked, then updated by primary key
, picked AS MATERIALIZED ({CLAIMABLE.format(columns=PICKED_COLUMNS, also="true")}
), claimed AS (
    UPDATE jobs
    SET lock = $3, dt = now() + make_interval(secs => $4), attempts = attempts + 1,
        run_dt = now()
    WHERE id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING id, type, data, attempts, create_dt, dt AS lease_until, ckey, trace
)
(SELECT c.id, c.type, c.data, c.attempts, c.create_dt, c.lease_until, p.due_ms, c.ckey,
        c.trace
 FROM claimed c JOIN picked p ON p.id = c.id
 ORDER BY p.priority DESC, p.picked_dt, c.id)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, {KEY_CURSOR}, NULL
"""

# The lease of a pulled type: its live handler's timeout ($fallback without one).
_TYPE_LEASE = """
coalesce((SELECT (h.data->>'timeout')::float8 FROM handlers h
          WHERE h.type = j.type COLLATE "default" AND h.deleted_at IS NULL
          ORDER BY h.dt DESC, h.id DESC LIMIT 1), {fallback})
"""

# $1 ids, $2 locks, $3 client, $4 worker, $5 lease when the type has no handler
RENEW = f"""
WITH {_HEARTBEAT.format(client="$3", worker="$4", lease="NULL::float8")}
UPDATE jobs j
SET dt = now() + make_interval(secs => {_TYPE_LEASE.format(fallback="$5")})
FROM unnest($1::text[], $2::text[]) AS r(id, lock)
WHERE {_BY_IDS.format(row="j.", client="$3")} AND j.id = r.id AND j.lock = r.lock
RETURNING j.id, j.dt AS lease_until
"""

# The held jobs among $1 ids with their $2 locks, locked until the complete
# commits (an expiry skips them, a claim cannot see them): $3 client.
HELD_FOR_UPDATE = f"""
SELECT j.id, j.type, j.attempts, j.create_dt
FROM jobs j
JOIN unnest($1::text[], $2::text[]) AS r(id, lock) ON j.id = r.id AND j.lock = r.lock
WHERE {_BY_IDS.format(row="j.", client="$3")}
ORDER BY j.id
FOR UPDATE OF j
"""

# Which of $1 ids are $2's jobs at all (to tell 404 from 409).
EXISTING = f"""
SELECT id FROM all_jobs WHERE {_BY_IDS.format(row="", client="$2")}
"""
# Of those, the ones cancelled while they ran (queries.jobs.CANCEL_JOB).
CANCELLED = f"""
SELECT id FROM all_jobs WHERE {_BY_IDS.format(row="", client="$2")} AND code = 'cancelled'
"""

# The worker's completes by code: $1 client, $2 worker, $3..$6 ok, failed, error, retry.
COUNT_DONE = """
INSERT INTO workers AS w (client, name, done_ok, done_failed, done_error, done_retry)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (client, name) DO UPDATE
SET last_seen = now(), done_ok = w.done_ok + $3, done_failed = w.done_failed + $4,
    done_error = w.done_error + $5, done_retry = w.done_retry + $6
"""

# Hand jobs back unrun: waiting at once, the claim's attempt not counted.
# $1 ids, $2 locks, $3 client, $4 worker.
HAND_BACK = f"""
WITH {_HEARTBEAT.format(client="$3", worker="$4", lease="NULL::float8")}
UPDATE jobs j
SET lock = '', dt = now(), attempts = greatest(j.attempts - 1, 0)
FROM unnest($1::text[], $2::text[]) AS r(id, lock)
WHERE {_BY_IDS.format(row="j.", client="$3")} AND j.id = r.id AND j.lock = r.lock
RETURNING j.id, j.type
"""

# Which of $1 ids are done (for the daemons' waiting GETs).
DONE_AMONG = """
SELECT id FROM all_jobs WHERE id = ANY($1::text[]) AND lock = '__done'
"""

# Pulled jobs held now, per client and worker: only running jobs are read
# (the predicate of jobs_running_idx).
_HOLDING = f"""
SELECT split_part(type, '-', 1) AS client, substr(lock, {LOCK_PREFIX_LEN + 1}) AS name,
       count(*)::int AS n
FROM jobs
WHERE lock <> '' AND lock <> '__done' AND lock LIKE 'w:%'
"""

_WORKER_COLUMNS = """
w.client, w.name, w.first_seen, w.last_seen,
w.last_seen + make_interval(secs => w.lease) > now() AS live,
coalesce(h.n, 0) AS holding, w.done_ok, w.done_failed, w.done_error, w.done_retry
"""

# $1 client: its workers seen within a day
WORKERS_OF = f"""
SELECT {_WORKER_COLUMNS}
FROM workers w
LEFT JOIN ({_HOLDING} AND split_part(type, '-', 1) = $1 GROUP BY 1, 2) h
       ON h.client = w.client AND h.name = w.name
WHERE w.client = $1 AND w.last_seen > now() - interval '1 day'
ORDER BY w.name
LIMIT 10000
"""

ALL_WORKERS = f"""
SELECT {_WORKER_COLUMNS}
FROM workers w
LEFT JOIN ({_HOLDING} GROUP BY 1, 2) h ON h.client = w.client AND h.name = w.name
WHERE w.last_seen > now() - interval '1 day'
ORDER BY w.client, w.name
LIMIT 10000
"""

# Every daemon seen within a day, with the jobs it runs now.
DAEMONS = """
SELECT s.sysid, s.host, s.expires, s.released_at,
       CASE WHEN s.released_at IS NOT NULL THEN 'released'
            WHEN s.expires IS NULL OR s.expires < now() THEN 'expired'
            ELSE 'live' END AS state,
       coalesce(r.n, 0) AS running
FROM sysids s
LEFT JOIN (SELECT lock, count(*)::int AS n FROM jobs
           WHERE lock <> '' AND lock <> '__done' AND lock NOT LIKE 'w:%'
           GROUP BY lock) r ON r.lock = s.sysid
WHERE s.holder IS NOT NULL
  AND coalesce(s.released_at, s.expires, now()) > now() - interval '1 day'
ORDER BY s.sysid
"""

FORGET_WORKERS = "DELETE FROM workers WHERE last_seen < now() - interval '1 day'"

LIVE_WORKERS = """
SELECT client, count(*)::int AS n FROM workers
WHERE last_seen > now() - interval '1 day' AND last_seen + make_interval(secs => lease) > now()
GROUP BY client
"""

# $1 payload: stored types of jobs just done, space separated ('': any)
NOTIFY_DONE = "SELECT pg_notify('qd_done', $1)"
