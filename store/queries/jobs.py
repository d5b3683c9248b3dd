"""A tenant's view of its jobs: get, list, stats, cancel."""

from __future__ import annotations

from queue_daemon.store.queries import counts, queue

_JOB_COLUMNS = """
    id,
    substr(type, strpos(type, '-') + 1) AS type,
    lock, dt, create_dt, done_dt, attempts, code, exitcode, result, data, priority, progress, ckey
"""

GET_JOB = f"""
SELECT {_JOB_COLUMNS}, runs, log
FROM all_jobs
WHERE id = $1 AND split_part(type, '-', 1) = $2
"""

# $1 client, $2 type without prefix or NULL, $3 state or NULL, $4 limit
_LIST_FILTERS = """
WHERE split_part(type, '-', 1) = $1
  AND ($2::text IS NULL OR type = $1 || '-' || $2::text)
  AND ($3::text IS NULL OR $3::text = CASE lock
        WHEN '' THEN CASE WHEN dt = 'infinity' THEN 'blocked' ELSE 'waiting' END
        WHEN '__done' THEN 'done' ELSE 'running' END)
"""

# A page holds at most $4 rows (one more than asked tells whether a next page
# exists), and stops at the row that starts past $5 (FIRST) or $7 (AFTER)
# bytes of payloads and results: a page of big jobs is shorter, never huge.
# ``octet_length`` of a stored value reads its size, not the value; ``rows``:
# how many the page had before the byte cut.
#
# The jobs are read in two parts, each in the index's order up to $4 rows, then
# merged: the waiting, blocked and done ones (jobs_client_created_idx holds only
# those, 0014, merged with jobs_done's index), and the running ones (read
# through jobs_running_idx, as many as run now, and sorted). Each part is a
# subquery of its own: a part of a UNION ALL with a condition of its own is not
# merged into the parts of all_jobs, and would be read whole and sorted. A
# state asked for ($3) leaves out the part that cannot hold it before it is read.
_ORDER = "ORDER BY split_part(type, '-', 1), create_dt DESC, id DESC"
_PAGE = f"""
SELECT *, count(*) OVER () AS rows
FROM (
    SELECT {{columns}},
        sum(octet_length(data) + coalesce(octet_length(result), 0))
            OVER (ORDER BY create_dt DESC, id DESC) AS upto,
        octet_length(data) + coalesce(octet_length(result), 0) AS size
    FROM (
        (SELECT * FROM all_jobs {{filters}} AND (lock = '' OR lock = '__done')
           AND $3::text IS DISTINCT FROM 'running' {{after}}
         {_ORDER} LIMIT $4)
        UNION ALL
        (SELECT * FROM all_jobs {{filters}} AND lock <> '' AND lock <> '__done'
           AND ($3::text IS NULL OR $3::text = 'running') {{after}}
         {_ORDER} LIMIT $4)
    ) listed
    ORDER BY create_dt DESC, id DESC
    LIMIT $4
) page
"""

LIST_JOBS_FIRST = f"""
SELECT * FROM ({_PAGE.format(columns=_JOB_COLUMNS, filters=_LIST_FILTERS, after="")}) cut
WHERE upto - size < $5
ORDER BY upto
"""

# $5 create_dt, $6 id of the last row of the previous page. The row comparison
# with the index's own order (both DESC) makes it an index condition.
LIST_JOBS_AFTER = f"""
SELECT * FROM ({
    _PAGE.format(
        columns=_JOB_COLUMNS,
        filters=_LIST_FILTERS,
        after="AND (create_dt, id) < ($5::timestamptz, $6::text)",
    )
}) cut
WHERE upto - size < $7
ORDER BY upto
"""

# A tenant's counts per type. Waiting jobs from the state counts (0012, one
# row per type and state, never one per job); of those, the scheduled ones
# (dt in the future) read from jobs_waiting_idx, one entry each, only past now;
# running from jobs_running_idx (bounded by the daemons' concurrency); done
# from type_counts (0003). $1 the client: its stored types are the C-collated
# range ['client-', 'client.').
_TENANT = "type >= $1 || '-' AND type < $1 || '.'"
STATS = f"""
WITH states AS ({counts.STATE_SUMS.format(scope=_TENANT)}
), waiting AS (
    SELECT s.type, s.queued - f.scheduled AS waiting, f.scheduled, s.blocked
    FROM states s
    CROSS JOIN LATERAL (
        SELECT count(*) AS scheduled FROM jobs j
        WHERE j.type = s.type AND j.lock = '' AND j.dt > now() AND j.dt < 'infinity'
    ) f
), done AS (
    SELECT type,
           sum(n) FILTER (WHERE code = 'ok') AS done_ok,
           sum(n) FILTER (WHERE code IN ('failed', 'cancelled')) AS done_failed,
           sum(n) FILTER (WHERE code = 'error') AS done_error
    FROM type_counts
    WHERE {_TENANT} AND n <> 0
    GROUP BY type
), running AS (
    SELECT type, count(*) AS running
    FROM jobs
    WHERE lock <> '' AND lock <> '__done' AND {_TENANT}
    GROUP BY type
)
SELECT substr(type, strpos(type, '-') + 1) AS type,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(w.scheduled, 0) AS scheduled,
       coalesce(w.blocked, 0) AS blocked,
       coalesce(r.running, 0) AS running,
       coalesce(d.done_ok, 0)::bigint AS done_ok,
       coalesce(d.done_failed, 0)::bigint AS done_failed,
       coalesce(d.done_error, 0)::bigint AS done_error
FROM waiting w
FULL JOIN running r USING (type)
FULL JOIN done d USING (type)
ORDER BY type
"""

# A job that is not done: a waiting or blocked one ends failed, 499, with a
# run of reason cancelled that never started; a running one (a daemon's or a
# pull worker's claim) ends with code cancelled, 499, its run (started at its
# claim, by its holder) ended with reason cancelled; ``was`` is the lock it
# had, so the caller can tell its holder. The row is locked first: a claim or
# a release that holds it makes this wait, then see the row as it left it.
CANCEL_JOB = f"""
WITH target AS MATERIALIZED (
    SELECT id, lock FROM jobs
    WHERE id = $1 AND split_part(type, '-', 1) = $2 AND lock <> '__done'
    FOR UPDATE
), ended AS (
    UPDATE jobs j
    SET lock = '__done',
        done_dt = now(),
        dt = now() + interval '1000 years',
        code = CASE WHEN t.lock = '' THEN 'failed' ELSE 'cancelled' END,
        exitcode = 499,
        result = 'cancelled',
        runs = coalesce(j.runs, '[]'::jsonb) || CASE WHEN t.lock = ''
            THEN jsonb_build_array(jsonb_build_object(
                'started', NULL, 'ended', floor(extract(epoch FROM now()) * 1000)::bigint,
                'by', NULL, 'exitcode', 499, 'code', 'failed', 'reason', 'cancelled'))
            ELSE {
    queue.RUN_ENTRY.format(
        by=queue.BY_OF.format(lock="t.lock"),
        exitcode="499",
        code="'cancelled'",
        reason="'cancelled'",
    )
} END
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, substr(j.type, strpos(j.type, '-') + 1) AS type, j.lock, j.dt, j.create_dt,
              j.done_dt, j.attempts, j.code, j.exitcode, j.result, j.data, j.priority,
              j.progress, j.ckey, j.log, j.dependents, t.lock AS was
)
SELECT * FROM ended
"""
# The daemon $1 that runs the job $2 is told to stop it (engine.run.loop).
CANCEL_CHANNEL = "qd_cancel"
NOTIFY_CANCELLED = "SELECT pg_notify('qd_cancel', $1 || ' ' || $2)"

# A tenant's done jobs deleted early, at most $4 a statement (both tables):
# $1 client, $2 stored type or NULL, $3 done before. Through the client's
# indexes (its jobs only); a done job whose dependents are not resolved yet
# stays (the sweep that resolves them finds it by its row). Counted per type
# for the queue log.
DELETE_DONE = queue.DELETE_DONE_JOBS.format(
    where="""split_part(type, '-', 1) = $1
          AND ($2::text IS NULL OR type = $2::text)
          AND done_dt < $3 AND NOT dependents""",
    limit="$4",
)

# Pausing (migration 0015). $1 a stored type, $2 and $3 the bounds of its
# tenant's stored types ('client-', 'client.'), $4 the most paused types a
# tenant may have: whether the type is paused now (false: the tenant has $4
# paused already). After PAUSE_LOCK in its transaction, so that two pauses
# at once cannot both pass the count.
PAUSE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('qd_paused:' || $1))"
PAUSE_TYPE = """
WITH added AS (
    INSERT INTO paused (name)
    SELECT $1
    WHERE (SELECT count(*) FROM (
              SELECT 1 FROM paused WHERE name >= $2 AND name < $3 LIMIT $4) c) < $4
    ON CONFLICT (name) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM added) OR EXISTS (SELECT 1 FROM paused WHERE name = $1)
"""
# $1 a tenant: paused, when it is an active one or $2 is false (--no-auth: any
# name is a tenant); whether it was.
PAUSE_TENANT = """
WITH active AS (
    SELECT client FROM tenants WHERE client = $1 AND revoked_at IS NULL
    UNION SELECT $1 WHERE NOT $2::bool
),
added AS (INSERT INTO paused (name) SELECT client FROM active ON CONFLICT (name) DO NOTHING)
SELECT EXISTS (SELECT 1 FROM active)
"""
# $1 a stored type: resumed, and the daemons told at commit of its due jobs
# (counted up to 1,000, as WAITING_JOBTYPES counts them) when it was paused
# and has any: they claim them, and the workers waiting on the type wake.
RESUME_TYPE = """
WITH gone AS (DELETE FROM paused WHERE name = $1 RETURNING 1)
SELECT pg_notify('qd_jobs', $1 || '=' || due.n)
FROM (SELECT count(*) AS n FROM (
          SELECT 1 FROM jobs WHERE type = $1 AND lock = '' AND dt <= now() LIMIT 1000) c
     ) due
WHERE due.n > 0 AND EXISTS (SELECT 1 FROM gone)
"""
# $1 a tenant: resumed, and the daemons told to read the waiting types again
# (a notification at commit, when it was paused).
RESUME_TENANT = """
WITH gone AS (DELETE FROM paused WHERE name = $1 RETURNING 1)
SELECT pg_notify('qd_jobs', '') FROM gone
"""
# Per tenant: whether it is paused itself, and how many of its types are.
PAUSED_COUNTS = """
SELECT split_part(name, '-', 1) AS client, bool_or(strpos(name, '-') = 0) AS tenant,
       count(*) FILTER (WHERE strpos(name, '-') > 0) AS types
FROM paused
GROUP BY 1
"""
# $1 a tenant: the tenant's own name when it is paused, and its paused types.
PAUSED = """
SELECT name FROM paused WHERE name = $1 OR (name >= $1 || '-' AND name < $1 || '.')
"""

# Reruns: a done job waits again, due now, with fresh attempts (0), its
# outcome, log, deadline and progress cleared, its runs, priority and key kept, and
# waiting for nothing: `deps` NULL,
# so that RESOLVE (graph.py: deps > 0) passes over the edges a job cancelled
# while blocked still has (they go when their dependency is resolved). Not a
# job with MAX_RUNS runs (a cancel and rerun loop would grow its runs without
# end), nor one whose dependents are not resolved yet (``dependents``: the
# RESOLVE of its release, or the sweep after a crash, would no longer find it
# done). A job in jobs_done goes back to jobs, its final run (kept in columns
# there) appended to `runs` as all_jobs shows it; one marked done in jobs is
# updated in place. Both parts in one
# statement; the count triggers move it from done to waiting. {pick_done}
# and {pick_live} select the ids of each table (locked, SKIP LOCKED); the
# jobs come back with their stored type, and the daemons are told of them at
# commit (the due jobs per type, or "" past a notification's size).
MAX_RUNS = 100
_FINAL_RUN = """
CASE WHEN m.ran_by IS NULL THEN m.runs
     ELSE coalesce(m.runs, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
         'started', floor(extract(epoch FROM m.run_dt) * 1000)::bigint,
         'ended', floor(extract(epoch FROM m.done_dt) * 1000)::bigint,
         'by', CASE WHEN m.ran_by LIKE 'w:%' THEN 'worker:' || substr(m.ran_by, 36)
                    ELSE 'sysid:' || m.ran_by END,
         'exitcode', m.exitcode,
         'code', m.code,
         'reason', CASE m.code WHEN 'ok' THEN 'completed' WHEN 'failed' THEN 'failed'
                               ELSE 'exception' END))
END
"""
_RERUN = f"""
WITH moved AS (
    DELETE FROM jobs_done
    WHERE id = ANY(ARRAY({{pick_done}}))
    RETURNING *
), back AS (
    INSERT INTO jobs (id, type, dt, data, create_dt, attempts, runs, priority, ckey, trace)
    SELECT m.id, m.type, now(), m.data, m.create_dt, 0, {_FINAL_RUN}, m.priority, m.ckey,
           m.trace
    FROM moved m
    RETURNING id, type
), here AS (
    UPDATE jobs
    SET lock = '', dt = now(), done_dt = NULL, attempts = 0, code = NULL, exitcode = NULL,
        result = NULL, run_dt = NULL, deadline = NULL, deps = NULL, deps_dt = NULL,
        resolve_any = NULL, progress = NULL, log = NULL
    WHERE id = ANY(ARRAY({{pick_live}}))
    RETURNING id, type
), rerun AS (
    SELECT id, type FROM back UNION ALL SELECT id, type FROM here
), note AS (
    SELECT pg_notify('qd_jobs', CASE WHEN length(t) < 7000 THEN t ELSE '' END)
    FROM (SELECT string_agg(type || '=' || n, ' ') AS t
          FROM (SELECT type, count(*) AS n FROM rerun GROUP BY type) c) p
    WHERE t IS NOT NULL
)
SELECT id, type FROM rerun
UNION ALL SELECT NULL, NULL FROM note
"""
# what a rerun takes of either table: not past MAX_RUNS (jobs_done keeps its
# final run apart), dependents resolved
_RERUNNABLE_DONE = f"""
      coalesce(jsonb_array_length(runs), 0) + (ran_by IS NOT NULL)::int < {MAX_RUNS}
      AND NOT dependents"""
_RERUNNABLE_LIVE = f"""coalesce(jsonb_array_length(runs), 0) < {MAX_RUNS} AND NOT dependents"""
# $1 id, $2 client
RERUN_JOB = _RERUN.format(
    pick_done="SELECT id FROM jobs_done WHERE id = $1 AND split_part(type, '-', 1) = $2"
    f" AND {_RERUNNABLE_DONE} FOR UPDATE",
    pick_live="SELECT id FROM jobs WHERE id = $1 AND split_part(type, '-', 1) = $2"
    f" AND lock = '__done' AND {_RERUNNABLE_LIVE} FOR UPDATE",
)
# $1 client, $2 stored type or NULL, $3 codes, $4 done before, $5 at most this
# many in all: through the failed jobs' indexes (jobs_done_failed_idx,
# jobs_failed_idx: codes failed and error), the client's range of types. Not
# the jobs the tenant cancelled (499), nor those that failed because a
# dependency did (424): they never ran, and a rerun would run them at once.
_RERUN_WHERE = """type >= $1 || '-' AND type < $1 || '.' AND ($2::text IS NULL OR type = $2::text)
      AND code IN ('failed', 'error') AND code = ANY($3::text[]) AND done_dt < $4
      AND exitcode IS DISTINCT FROM 499 AND exitcode IS DISTINCT FROM 424"""
RERUN_DONE = _RERUN.format(
    pick_done=f"""SELECT id FROM jobs_done WHERE {_RERUN_WHERE} AND {_RERUNNABLE_DONE}
          LIMIT $5 FOR UPDATE SKIP LOCKED""",
    pick_live=f"""SELECT id FROM jobs WHERE lock = '__done' AND {_RERUN_WHERE}
          AND {_RERUNNABLE_LIVE}
          LIMIT greatest(0, $5 - (SELECT count(*) FROM moved)) FOR UPDATE SKIP LOCKED""",
)

# Progress (migration 0019): $1 ids, $2 their holders' locks, $3 fractions,
# $4 messages; each job still held by that lock gets the value, with now().
# Returns the ids written.
NOTE_PROGRESS = """
UPDATE jobs j
SET progress = jsonb_build_object(
    'fraction', p.fraction, 'message', p.message,
    'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[]) AS p(id, lock, fraction, message)
WHERE j.id = p.id AND j.lock = p.lock
RETURNING j.id
"""
