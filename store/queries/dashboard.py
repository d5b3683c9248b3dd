"""The dashboard (GET /admin/overview, GET /{client}/overview): depths, running,
failures, daemons, throughput."""

from __future__ import annotations

# Each query comes in two forms: every tenant (operator), and one tenant, whose
# stored types are the C-collated range ['client-', 'client.') as in STATS
# ($1 is that client; the other parameters follow it, and move up by one in
# the operator's form). Two texts rather than "$1 IS NULL OR ...": a prepared
# statement's generic plan could not use the range as an index condition.
_ALL = "true"
_ONE = "type >= $1 || '-' AND type < $1 || '.'"

# Depth per stored type ({limit} rows at most, by type), without reading
# archived jobs and without counting a deep queue job by job. The types are the
# first {limit} by name that have waiting (0012), running or done (0003) jobs:
# each source read in key order and stopped early, so the cost does not grow
# with the number of types in the store. For each: waiting and blocked from
# the state counts; of the waiting, the scheduled ones (dt in the future)
# counted on jobs_waiting_idx up to {cap} entries, and when that many are
# scheduled the due ones counted up to {cap} instead (capped); running jobs
# from jobs_running_idx; done counts from type_counts (a type has at most a
# handful of codes: 8 rows each are read).
_QUEUE_DEPTHS = """
WITH types AS (
    SELECT DISTINCT type FROM (
        (SELECT type FROM job_states WHERE {scope} ORDER BY type LIMIT 2 * {limit})
        UNION ALL
        (SELECT DISTINCT type FROM job_state_moves WHERE {scope} ORDER BY type LIMIT {limit})
        UNION ALL
        (SELECT type FROM type_counts WHERE {scope} AND n <> 0
         ORDER BY type LIMIT 8 * {limit})
        UNION ALL
        (SELECT type FROM jobs WHERE lock <> '' AND lock <> '__done' AND {scope})
    ) t
    ORDER BY type
    LIMIT {limit}
), moved AS (
    -- the moves not folded yet: a second's worth, summed once (not per type)
    SELECT type,
           sum(n) FILTER (WHERE state = 'q') AS queued,
           sum(n) FILTER (WHERE state = 'b') AS blocked
    FROM job_state_moves
    WHERE {scope}
    GROUP BY type
), states AS (
    SELECT s.* FROM (
        SELECT t.type,
               (coalesce(q.n, 0) + coalesce(m.queued, 0))::bigint AS queued,
               (coalesce(b.n, 0) + coalesce(m.blocked, 0))::bigint AS blocked
        FROM types t
        LEFT JOIN job_states q ON q.type = t.type AND q.state = 'q'
        LEFT JOIN job_states b ON b.type = t.type AND b.state = 'b'
        LEFT JOIN moved m ON m.type = t.type
    ) s
    WHERE s.queued <> 0 OR s.blocked <> 0
), waiting AS (
    SELECT s.type, s.blocked, f.scheduled,
           CASE WHEN f.scheduled < {cap} THEN s.queued - f.scheduled
                ELSE (SELECT count(*) FROM (
                          SELECT 1 FROM jobs j
                          WHERE j.type = s.type AND j.lock = '' AND j.dt <= now()
                          ORDER BY j.dt LIMIT {cap}
                      ) c)
           END AS waiting
    FROM states s
    CROSS JOIN LATERAL (
        SELECT count(*) AS scheduled FROM (
            SELECT 1 FROM jobs j
            WHERE j.type = s.type AND j.lock = '' AND j.dt > now() AND j.dt < 'infinity'
            ORDER BY j.dt LIMIT {cap}
        ) c
    ) f
), done AS (
    SELECT type,
           sum(n) FILTER (WHERE code = 'ok') AS done_ok,
           sum(n) FILTER (WHERE code IN ('failed', 'cancelled')) AS done_failed,
           sum(n) FILTER (WHERE code = 'error') AS done_error
    FROM type_counts
    WHERE type IN (SELECT type FROM types) AND n <> 0
    GROUP BY type
), running AS (
    SELECT type, count(*) AS running
    FROM jobs
    WHERE lock <> '' AND lock <> '__done' AND type IN (SELECT type FROM types)
    GROUP BY type
)
SELECT type,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(w.scheduled, 0) AS scheduled,
       coalesce(w.blocked, 0) AS blocked,
       coalesce(w.waiting >= {cap} OR w.scheduled >= {cap}, false) AS capped,
       coalesce(r.running, 0) AS running,
       coalesce(d.done_ok, 0)::bigint AS done_ok,
       coalesce(d.done_failed, 0)::bigint AS done_failed,
       coalesce(d.done_error, 0)::bigint AS done_error,
       EXISTS (SELECT 1 FROM paused p WHERE p.name IN (type, split_part(type, '-', 1)))
           AS paused
FROM waiting w
FULL JOIN running r USING (type)
FULL JOIN done d USING (type)
ORDER BY type
LIMIT {limit}
"""
QUEUE_DEPTHS_ALL = _QUEUE_DEPTHS.format(scope=_ALL, limit="$1", cap="$2")
QUEUE_DEPTHS_CLIENT = _QUEUE_DEPTHS.format(scope=_ONE, limit="$2", cap="$3")

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
# characters. One descent of jobs_failed_idx (0006) and of jobs_done_failed_idx
# (0013) per type that has such a job (found in type_counts), at most {limit}
# entries each; then the newest {limit} of those.
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
    FROM (
        (SELECT id, type, code, exitcode, attempts, create_dt, done_dt, result FROM jobs j
         WHERE j.type = t.type AND j.lock = '__done' AND j.code IN ('failed', 'error')
         ORDER BY j.done_dt DESC LIMIT {limit})
        UNION ALL
        (SELECT id, type, code, exitcode, attempts, create_dt, done_dt, result FROM jobs_done j
         WHERE j.type = t.type AND j.code IN ('failed', 'error')
         ORDER BY j.done_dt DESC LIMIT {limit})
    ) j
    ORDER BY j.done_dt DESC
    LIMIT {limit}
) f
ORDER BY f.done_dt DESC, f.id DESC
LIMIT {limit}
"""
RECENT_FAILURES_ALL = _RECENT_FAILURES.format(scope=_ALL, limit="$1", chars="$2")
RECENT_FAILURES_CLIENT = _RECENT_FAILURES.format(scope=_ONE, limit="$2", chars="$3")
# the dead letters of one stored type $1
RECENT_FAILURES_TYPE = _RECENT_FAILURES.format(scope="type = $1", limit="$2", chars="$3")

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
