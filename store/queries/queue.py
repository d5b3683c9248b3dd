"""The claim path: waiting types, claims, renewals, releases, expiry, purge, notifications."""

from __future__ import annotations

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
# Both also name the server's history: its start time, the time its shared
# statistics were last reset and its WAL timeline. A flush proves durable only
# the commits made on the history it ran on: a restart starts a new one; so does
# a backend's crash, after which the postmaster reinitialises shared memory and
# recovers from the WAL on disk (losing commits not yet written, with the same
# start time; the statistics are reset then); and so does a standby's promotion
# (a new timeline, on another server), whose WAL may lack what the old primary
# committed. A manual reset of the statistics only inserts rows again.
HISTORY = (
    "pg_postmaster_start_time()::text || ' r' "
    "|| coalesce(pg_stat_get_bgwriter_stat_reset_time()::text, '')"
)
EPOCH = f"{HISTORY} || ' tl' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8)"
# A server that refuses the WAL functions (some managed ones do) is named without
# the timeline: every restart then counts as a new timeline.
EPOCH_NO_TIMELINE = HISTORY
# The flush's own commit waits at least for the local WAL flush: a server whose
# synchronous_commit is off gets on for it; any other level (local, remote_write,
# on, remote_apply) is the operator's choice of what a commit waits for, which
# with a synchronous standby includes the standby (docs/deploy.md).
FLUSH = """SELECT pg_logical_emit_message(true, 'queue_daemon', ''),
    set_config('synchronous_commit', CASE current_setting('synchronous_commit')
        WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true),
    {epoch} AS epoch"""
FLUSHED = FLUSH.format(epoch=EPOCH)
SERVER_EPOCH = f"SELECT {EPOCH}"
IN_RECOVERY = "SELECT pg_is_in_recovery()"

# Neither the stored type {type} nor its tenant is paused (migration 0015): a
# one-time filter where {type} is a parameter, one probe of paused's key.
NOT_PAUSED = """NOT EXISTS (
    SELECT 1 FROM paused p WHERE p.name IN ({type}, split_part({type}, '-', 1)))"""

# The newest live handler version of every type, one descent of
# handlers_live_idx per type (a loose index scan): ``live(type, lang)``.
LIVE_TYPES = """
live(type, lang) AS (
    (SELECT type, data->>'lang' FROM handlers
     WHERE deleted_at IS NULL ORDER BY type, dt DESC, id DESC LIMIT 1)
    UNION ALL
    SELECT n.type, n.lang
    FROM live
    CROSS JOIN LATERAL (
        SELECT h.type, h.data->>'lang' AS lang FROM handlers h
        WHERE h.deleted_at IS NULL AND h.type > live.type
        ORDER BY h.type, h.dt DESC, h.id DESC LIMIT 1
    ) n
)
"""

# Stored jobtypes a daemon runs (a live handler that is not a pull worker's)
# with eligible jobs, each counted up to $1 index entries of jobs_waiting_idx
# (none read for a paused type: the check is a one-time filter of the count).
# Driven by the handlers, not by the waiting jobs: types that wait without a
# handler (a tenant's idle or pulled types, however many) cost nothing here;
# the cost grows with the number of daemon-run types. A type with only future
# jobs has a count of 0 and is left out.
WAITING_JOBTYPES = f"""
WITH RECURSIVE {LIVE_TYPES}
SELECT live.type, eligible.n
FROM live
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (SELECT 1 FROM jobs j
          WHERE j.type = live.type COLLATE "C" AND j.lock = '' AND j.dt <= now()
            AND {NOT_PAUSED.format(type='live.type COLLATE "C"')}
          ORDER BY j.dt
          LIMIT $1) capped
) eligible
WHERE live.lang IS DISTINCT FROM 'worker' AND eligible.n > 0
"""

# A round of the sweep of waiting types that no daemon runs: up to $3 waiting
# types after $2 (by name), each with whether its oldest due job became due
# more than $1 seconds ago and no daemon runs it (no live handler, or a pull
# worker's: then pulled) - the candidates of EXPIRE_WAITING. A loose index
# scan of jobs_waiting_idx: each step is one descent to the next type's first
# entry, which is its oldest dt; a candidate's live handler is one descent of
# handlers_live_idx. Bounded per round, so a store of many idle types is swept
# a slice at a time (the caller goes on from the last type it got).
UNHANDLED_TYPES = f"""
WITH RECURSIVE types(type, dt, n) AS (
    (SELECT type, dt, 1 FROM jobs WHERE lock = '' AND type > $2 ORDER BY type, dt LIMIT 1)
    UNION ALL
    SELECT x.type, x.dt, types.n + 1
    FROM types
    CROSS JOIN LATERAL (
        SELECT j.type, j.dt FROM jobs j
        WHERE j.lock = '' AND j.type > types.type
        ORDER BY j.type, j.dt LIMIT 1
    ) x
    WHERE types.n < $3
)
SELECT t.type,
       t.dt < now() - make_interval(secs => $1) AND (h.lang IS NULL OR h.lang = 'worker')
           AND {NOT_PAUSED.format(type="t.type")} AS expired,
       coalesce(h.lang = 'worker', false) AS pulled
FROM types t
LEFT JOIN LATERAL (
    SELECT data->>'lang' AS lang FROM handlers
    WHERE type = t.type COLLATE "default" AND deleted_at IS NULL
      AND t.dt < now() - make_interval(secs => $1)
    ORDER BY dt DESC, id DESC LIMIT 1
) h ON true
ORDER BY t.type
"""
# One daemon at a time sweeps the waiting types (the others skip that round).
UNHANDLED_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('qd_unhandled'))"

# $1 type, $2 limit: the {columns} of the claimable jobs, locked, the higher
# priority first, then the oldest dt, unless the type is paused or {also}
# does not hold. Three parts read in turn, each only if the ones before found
# fewer than $2 (an Append under a Limit): the jobs of a positive priority
# (jobs_priority_idx, migration 0018: empty unless priorities are used), those
# of priority 0 (jobs_waiting_idx in dt order, nearly every job), those of a
# negative priority (jobs_priority_idx again). A type whose live handler sets
# keyConcurrency (migration 0020) reads none of them: its jobs come from
# qd_claim_keyed, called in the CTE ``keyed`` of CLAIMABLE_CTES (only for such
# a type), starting after the key {after}. The CTE ``cap`` reads the type's
# live handler once (its version and its cap): the claim reads it in the
# snapshot that found the jobs, so a job added after a handler was replaced
# is never run by the version before (its daemon's cache may not have heard
# of the change yet). ``gate`` decides once whether the parts read anything
# (a one-time filter each: the pause, {also} and the cap, not planned and
# checked in every part). CLAIM_IDS is kept apart so a test can EXPLAIN it:
# it must read jobs_waiting_idx.
CLAIMABLE_CTES = f"""
cap AS MATERIALIZED (
    SELECT h.id, (h.data->>'keyConcurrency')::int AS n FROM handlers h
    WHERE h.type = $1 AND h.deleted_at IS NULL
    ORDER BY h.dt DESC, h.id DESC
    LIMIT 1
), gate AS MATERIALIZED (
    SELECT c.n, c.live, c.live AND c.n IS NULL AND {NOT_PAUSED.format(type="$1")} AS open
    FROM (SELECT (SELECT n FROM cap) AS n, {{also}} AS live OFFSET 0) c
), keyed AS MATERIALIZED (
    SELECT k.id, k.ckey FROM qd_claim_keyed($1, $2::int, (SELECT n FROM gate), {{after}}) k
    WHERE (SELECT n IS NOT NULL AND live FROM gate)
)"""
_CLAIMABLE_PART = """
SELECT * FROM (
    SELECT {{columns}}, priority, dt AS picked_dt, ckey FROM jobs
    WHERE type = $1 AND lock = '' AND {part} AND dt <= now()
      AND (deadline IS NULL OR deadline > now())
      AND (SELECT open FROM gate)
    ORDER BY {order}
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) {name}"""
CLAIMABLE = f"""
SELECT * FROM (
{_CLAIMABLE_PART.format(part="priority > 0", order="priority DESC, dt", name="high")}
UNION ALL
{_CLAIMABLE_PART.format(part="priority = 0", order="dt", name="plain")}
UNION ALL
{_CLAIMABLE_PART.format(part="priority < 0", order="priority DESC, dt", name="low")}
UNION ALL
SELECT {{columns}}, priority, dt AS picked_dt, ckey FROM jobs
WHERE id = ANY(ARRAY(SELECT id FROM keyed WHERE id IS NOT NULL))
) claimable
LIMIT $2
"""
CLAIM_IDS = (
    "WITH "
    + CLAIMABLE_CTES.format(after="NULL", also="true")
    + CLAIMABLE.format(columns="id", also="true")
)
# The last key a keyed claim visited (NULL for any other): where the claimer's
# next one starts, so that the keys are served in turn.
KEY_CURSOR = "(SELECT ckey FROM keyed WHERE id IS NULL)"

# $3 sysid, $4 lease seconds. The jobs are picked and locked first (a
# materialized CTE, with what the queue log needs of them before the update:
# since when each was due, in epoch ms, the later of its creation and its dt),
# then updated by primary key: `= ANY(ARRAY(...))` rather than a join or
# `IN (...)`, with which the planner sometimes joined against a scan of the
# whole table (docs/architecture.md). The rows come back joined to what was
# picked (a hash join of the batch, not a lookup of each job again), in the
# order they were picked (priority, then dt before the claim, then id), without
# their type (the one asked for), with their key and trace; one more row, its id NULL,
# carries the type's live handler version in its second column (``cap``'s, read
# once, not per job) and in its last the key where the next claim starts (KEY_CURSOR).
#
# Nothing is claimed under a sysid whose lease ran out or was released: every
# daemon's expiry (EXPIRE_LOCKS) takes the jobs of such a sysid back at once,
# whatever their own lease, and runs them again, so a daemon that was cut off
# from the store past its sysid lease and claims before it renewed it would run
# jobs that another daemon runs at the same time. (A one-time filter: when it
# holds, no row is read or locked.)
# what a claim picks: each job's id and since when it was due, in epoch ms
PICKED_COLUMNS = "id, floor(extract(epoch FROM greatest(dt, create_dt)) * 1000)::bigint AS due_ms"
_SYSID_LIVE = """NOT EXISTS (
        SELECT 1 FROM sysids s
        WHERE s.sysid = $3 AND (s.expires < now() OR s.released_at IS NOT NULL))"""
# $5 the key after which a keyed claim starts
CLAIM = f"""
WITH {CLAIMABLE_CTES.format(after="$5", also=_SYSID_LIVE)},
picked AS MATERIALIZED ({CLAIMABLE.format(columns=PICKED_COLUMNS, also=_SYSID_LIVE)}), claimed AS (
    UPDATE jobs
    SET lock = $3, dt = now() + make_interval(secs => $4), attempts = attempts + 1,
        run_dt = now()
    WHERE id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING id, data, attempts, floor(extract(epoch FROM create_dt) * 1000)::bigint AS created_ms,
              deadline, ckey, trace
)
(SELECT c.id, c.data, c.attempts, c.created_ms, c.deadline, p.due_ms, c.ckey, c.trace
 FROM claimed c JOIN picked p ON p.id = c.id
 ORDER BY p.priority DESC, p.picked_dt, c.id)
UNION ALL
SELECT NULL, (SELECT id FROM cap), NULL, NULL, NULL, NULL, {KEY_CURSOR}, NULL
"""

# Waiting jobs of type $1 created and due more than $2 seconds ago are done
# with error 503 and result $3 (a type without a handler whose jobs' time ran
# out), at most $4 a statement, none while the type is paused (the sweep saw
# it unpaused, a moment before); through the waiting index, reading only the
# entries due that long ago (never the type's younger jobs, nor done ones).
EXPIRE_WAITING = f"""
UPDATE jobs
SET lock = '__done', done_dt = now(), dt = now() + interval '1000 years',
    code = 'error', exitcode = 503, result = $3
WHERE id = ANY(ARRAY(
    SELECT id FROM jobs
    WHERE type = $1 AND lock = '' AND dt < now() - make_interval(secs => $2)
      AND create_dt < now() - make_interval(secs => $2)
      AND {NOT_PAUSED.format(type="$1")}
    ORDER BY dt
    LIMIT $4
    FOR UPDATE SKIP LOCKED
))
RETURNING id, dependents
"""

# $1 ids, $2 sysid, $3 lease seconds
RENEW = """
UPDATE jobs SET dt = now() + make_interval(secs => $3)
WHERE id = ANY($1::text[]) AND lock = $2
"""

# One finished run as a JSON object (docs/workers.md, "runs"): ``by``, the
# exitcode, code and reason expressions, and the run's start in ``j.run_dt``.
RUN_ENTRY = """
jsonb_build_array(jsonb_build_object(
    'started', floor(extract(epoch FROM j.run_dt) * 1000)::bigint,
    'ended', floor(extract(epoch FROM now()) * 1000)::bigint,
    'by', {by}, 'exitcode', {exitcode}, 'code', {code}, 'reason', {reason}))
"""
# Who ran a job, from its lock: "sysid:<n>", or "worker:<name>" for a pull
# worker's claim ('w:<32 hex token>:<name>').
BY_OF = (
    "CASE WHEN {lock} LIKE 'w:%' THEN 'worker:' || substr({lock}, 36) ELSE 'sysid:' || {lock} END"
)
LEASE_EXPIRED_EXIT = 500  # the exitcode of a job whose every run's lease ran out
# The reason of a run that ended with ``code``.
REASON_OF = (
    "CASE {code} WHEN 'ok' THEN 'completed' WHEN 'failed' THEN 'failed' ELSE 'exception' END"
)

# A CTE named ``note``: one notification on qd_done naming the stored types of
# the jobs of ``rows`` (id, type, lock) that are now done, when there are any
# (``GET /job/{id}?wait=`` waits on it on every daemon). A statement selects
# from ``note`` (a row of NULLs) so that it runs.
NOTE_DONE = """
note AS (
    SELECT pg_notify('qd_done', CASE WHEN length(t) < 7000 THEN t ELSE '' END)
    FROM (SELECT string_agg(DISTINCT type, ' ') AS t FROM {rows} WHERE lock = '__done') d
    WHERE t IS NOT NULL
)
"""

# Running jobs whose lease passed, or whose owner's sysid lapsed or was
# released (at once, whatever their dt). Reads only running jobs
# (jobs_running_idx), never waiting or done ones. SKIP LOCKED: a row that its
# owner is releasing right now is left to it, and two daemons expiring at once
# neither wait on nor deadlock with each other. Each is a run that ended with
# reason lease-expired; a job that has had its handler's maxAttempts runs
# (default 5) is done (error, 500) rather than waiting again: a job that kills
# or wedges whatever runs it is not run forever.
EXPIRE_LOCKS = f"""
WITH lapsed AS MATERIALIZED (
    SELECT e.id,
           e.attempts >= coalesce(
               (SELECT (h.data->>'maxAttempts')::int FROM handlers h
                WHERE h.type = e.type COLLATE "default" AND h.deleted_at IS NULL
                ORDER BY h.dt DESC, h.id DESC LIMIT 1), 5) AS last
    FROM jobs e
    LEFT JOIN sysids s ON s.sysid = e.lock
    WHERE e.lock <> '' AND e.lock <> '__done'
      AND (e.dt < now() OR s.expires < now() OR s.released_at IS NOT NULL)
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE jobs j
SET lock = CASE WHEN x.last THEN '__done' ELSE '' END,
    dt = CASE WHEN x.last THEN now() + interval '1000 years' ELSE now() END,
    done_dt = CASE WHEN x.last THEN now() ELSE j.done_dt END,
    code = CASE WHEN x.last THEN 'error' ELSE j.code END,
    exitcode = CASE WHEN x.last THEN {LEASE_EXPIRED_EXIT} ELSE j.exitcode END,
    result = CASE WHEN x.last THEN
        'the lease of each of its ' || j.attempts || ' runs ran out (what ran it died or stalled)'
        ELSE j.result END,
    runs = coalesce(j.runs, '[]'::jsonb) || {
    RUN_ENTRY.format(
        by=BY_OF.format(lock="j.lock"),
        exitcode="NULL::int",
        code="NULL::text",
        reason="'lease-expired'",
    )
}
FROM lapsed x
-- the array first, so jobs is read by its primary key (a plain join estimated
-- the lapsed rows from the whole running index and scanned the table)
WHERE j.id = ANY(ARRAY(SELECT id FROM lapsed)) AND j.id = x.id
RETURNING j.id, j.type, j.attempts, x.last, j.dependents
"""

# Done jobs deleted from both tables (those marked done in jobs, and jobs_done,
# 0013), at most {limit} in all, each table's chosen by its {where} (a
# condition on done_dt and the like; in jobs, the rows done too): the rows
# deleted, counted per jobtype (for the queue log).
DELETE_DONE_JOBS = """
WITH gone_live AS (
    DELETE FROM jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM jobs
        WHERE lock = '__done' AND {where}
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING type
), gone_done AS (
    DELETE FROM jobs_done
    WHERE id = ANY(ARRAY(
        SELECT id FROM jobs_done
        WHERE {where}
        LIMIT greatest(0, {limit} - (SELECT count(*) FROM gone_live))
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING type
)
SELECT type, count(*)::int AS n
FROM (SELECT type FROM gone_live UNION ALL SELECT type FROM gone_done) g
GROUP BY type
"""

# $1 retention seconds, $2 chunk size: one bounded chunk per statement.
PURGE_CHUNK = DELETE_DONE_JOBS.format(
    where="done_dt < now() - make_interval(secs => $1)", limit="$2"
)
