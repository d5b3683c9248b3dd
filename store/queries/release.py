"""Releases: the end of runs, written with their outcomes (the claim path's
last step, ``JobQueue.release``)."""

from __future__ import annotations

from queue_daemon.store.queries.queue import BY_OF, NOTE_DONE, REASON_OF, RUN_ENTRY

# One row of the unnest per release: $1 id, $2 how, $3 code, $4 exitcode,
# $5 result, $6 delay seconds, $7 refund_attempt ('t' or 'f'), $8 the
# releasing sysid (the same on every row), $9 the run's log excerpt (an
# array, as the results; NULL for a run that printed nothing). Every column but the results is one
# text of the values joined by spaces (none holds a space: the daemon's ids are
# hex digits, letters and '-', sysids [a-z0-9_], the others words and numbers;
# '' is NULL): asyncpg encodes an
# array element by element in Python, 1.2 ms for the eight arrays of 1,000
# releases, against 0.3 ms for these texts and the results' array.
#
# The outcome (code, exitcode, result) is written as a whole when code is
# given and kept as it was when not, so a result never outlives the run that
# produced it.
#
# A job that is done leaves jobs for jobs_done (0013) in this statement, its
# final run in columns (``ran_by``, NULL when the run did not count); one
# that runs again (retry, or put back) stays in jobs, its run appended to
# ``runs`` when it counted.
#
# The sysid is matched as a column of the unnest (``j.lock = r.lock``), not as
# a constant: a constant lets the planner read jobs_running_idx, which the
# statistics often think empty (analyzed while little ran), and join each of
# its entries against every release (200 x 1,000 comparisons, 60 ms a batch,
# measured); as a join column, every release is one lookup of the primary key.
_RELEASES = """
unnest(string_to_array($1, ' '), string_to_array($2, ' '), string_to_array($3, ' ', ''),
       string_to_array($4, ' ', '')::int[], $5::text[], string_to_array($6, ' ')::float8[],
       string_to_array($7, ' ')::bool[], string_to_array($8, ' '), $9::text[])
    AS r(id, how, code, exitcode, result, delay, refund, lock, log)
"""
_ARCHIVED = f"""
archived AS (
    DELETE FROM jobs j USING {_RELEASES}
    WHERE r.how = 'archive' AND j.id = r.id AND j.lock = r.lock{{scope}}
    RETURNING j.id, j.type, j.data, j.create_dt, j.attempts, j.run_dt, j.runs, j.dependents,
              j.deadline, j.priority, j.progress, j.ckey, j.trace, j.lock, r.refund,
              coalesce(r.code, j.code) AS code,
              CASE WHEN r.code IS NULL THEN j.exitcode ELSE r.exitcode END AS exitcode,
              CASE WHEN r.code IS NULL THEN j.result ELSE r.result END AS result,
              CASE WHEN r.code IS NULL THEN j.log ELSE r.log END AS log,
              r.code IS NULL OR r.refund AS uncounted
)
"""
_ARCHIVED_ANY = _ARCHIVED.format(scope="")
# ARCHIVE_PULLED's rows: the client's, and not an ok run of a chaining type
_PULLED_SCOPE = """
      AND j.type >= $10 || '-' AND j.type < $10 || '.'
      AND (r.code <> 'ok' OR j.type NOT IN (SELECT type FROM chained))"""
_MOVED = """
moved AS (
    INSERT INTO jobs_done (id, type, data, create_dt, done_dt, attempts, code, exitcode, result,
                           run_dt, ran_by, runs, dependents, deadline, priority, progress,
                           ckey, trace, log)
    SELECT id, type, data, create_dt, now(),
           CASE WHEN refund THEN greatest(attempts - 1, 0) ELSE attempts END,
           code, exitcode, result, run_dt, CASE WHEN uncounted THEN NULL ELSE lock END, runs,
           dependents, deadline, priority, progress, ckey, trace, log
    FROM archived
    {conflict}
)
"""
# An id done already (stored twice by a race that ingestion guards against,
# store.queries.intake): the statements above fail on it (a unique violation,
# nothing applied) and the release is made again with these, where that row
# goes and the first stays. Not in the statements of every release: the
# arbiter's check costs an archive about 15% more.
_KEEP_FIRST = "ON CONFLICT (id) DO NOTHING"
# The jobs that run again. Their releases are picked by the two hows that
# mean it, not by ``<> 'archive'``: the planner, which knows nothing of the
# unnest's values, expects an equality (or two) to keep a few of its rows and
# a difference nearly all, and for a batch of 1,000 it joined them to every
# entry of jobs_pkey in order (a merge join reading the whole index) instead
# of looking each one up.
_AGAIN = f"""
again AS (
UPDATE jobs j
SET lock = '',
    dt = CASE r.how WHEN 'retry' THEN now() + make_interval(secs => r.delay) ELSE now() END,
    code = CASE WHEN r.code IS NULL THEN j.code ELSE r.code END,
    exitcode = CASE WHEN r.code IS NULL THEN j.exitcode ELSE r.exitcode END,
    result = CASE WHEN r.code IS NULL THEN j.result ELSE r.result END,
    log = CASE WHEN r.code IS NULL THEN j.log ELSE r.log END,
    attempts = CASE WHEN r.refund THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
    -- a run that did not count (put back, no handler) is not a run
    runs = CASE WHEN r.refund OR r.code IS NULL THEN j.runs
                ELSE coalesce(j.runs, '[]'::jsonb) || {
    RUN_ENTRY.format(
        by=BY_OF.format(lock="r.lock"),
        exitcode="r.exitcode",
        code="r.code",
        reason=REASON_OF.format(code="r.code"),
    )
} END
FROM {_RELEASES}
WHERE r.how IN ('retry', 'unget') AND j.id = r.id AND j.lock = r.lock
RETURNING j.id, j.type, j.ckey
)
"""
# The done jobs' types on qd_done (NOTE_DONE), and, when some had a
# concurrency key and their type's live handler caps keys, how many per type
# on qd_jobs: their keys may be below their caps again, and the daemons' and
# workers' next claims (which skipped them) take the keys' next jobs now
# (docs/api.md, "Concurrency keys"). {ended}: the rows (type, ckey) of the
# runs that ended; one lookup of the live handler per type that had keyed ones.
_FREED = """, freed AS (
    SELECT pg_notify('qd_jobs', CASE WHEN length(t) < 7000 THEN t ELSE '' END)
    FROM (
        SELECT string_agg(k.type || '=' || k.n, ' ') AS t
        FROM (SELECT type, count(*) AS n FROM {ended} e WHERE ckey IS NOT NULL GROUP BY type) k
        WHERE (SELECT h.data ? 'keyConcurrency' FROM handlers h
               WHERE h.type = k.type COLLATE "default" AND h.deleted_at IS NULL
               ORDER BY h.dt DESC, h.id DESC LIMIT 1)
    ) f
    WHERE t IS NOT NULL
)"""
_NOTE = NOTE_DONE.format(rows="(SELECT type, '__done' AS lock FROM archived) a")
_NOTED = _NOTE + _FREED.format(ended="archived")
_NOTED_AGAIN = _NOTE + _FREED.format(
    ended="(SELECT type, ckey FROM archived UNION ALL SELECT type, ckey FROM again)"
)
_RELEASE = """
WITH {archived}, {moved}, {again}, {noted}
SELECT id, dependents AS resolve FROM archived
UNION ALL SELECT id, false FROM again
UNION ALL SELECT NULL, NULL FROM note
UNION ALL SELECT NULL, NULL FROM freed
"""
RELEASE = _RELEASE.format(
    archived=_ARCHIVED_ANY, moved=_MOVED.format(conflict=""), again=_AGAIN, noted=_NOTED_AGAIN
)
RELEASE_KEEP_FIRST = _RELEASE.format(
    archived=_ARCHIVED_ANY,
    moved=_MOVED.format(conflict=_KEEP_FIRST),
    again=_AGAIN,
    noted=_NOTED_AGAIN,
)
# RELEASE when every release archives (the common batch): without the update
# of the jobs that run again, the statement is planned in half the time and
# reads its releases once.
_ARCHIVE = """
WITH {archived}, {moved}, {noted}
SELECT id, dependents AS resolve FROM archived
UNION ALL SELECT NULL, NULL FROM note
UNION ALL SELECT NULL, NULL FROM freed
"""
ARCHIVE = _ARCHIVE.format(archived=_ARCHIVED_ANY, moved=_MOVED.format(conflict=""), noted=_NOTED)
ARCHIVE_KEEP_FIRST = _ARCHIVE.format(
    archived=_ARCHIVED_ANY, moved=_MOVED.format(conflict=_KEEP_FIRST), noted=_NOTED
)
# ARCHIVE when every run ended ok with exit code 200, returned no result and
# counted (the common batch), all under one lock ($2; $1 the ids, as in
# _RELEASES): the outcome is a constant, so two parameters to send and split
# instead of eight arrays, about 1.3 us of PostgreSQL's CPU a job less
# (measured end to end on no-op jobs). The ids and the lock are read through
# sub-selects: the planner then knows neither the number of ids (a join
# against 1,000 of them it planned as a hash of the whole table, 2 us a job
# more) nor the lock (a constant lets it read jobs_running_idx, see
# _RELEASES), and looks each id up by primary key.
_ARCHIVED_OK = """
archived AS (
    DELETE FROM jobs j
    WHERE j.id = ANY((SELECT string_to_array($1, ' '))::text[]) AND j.lock = (SELECT $2::text)
    RETURNING j.id, j.type, j.data, j.create_dt, j.attempts, j.run_dt, j.runs, j.dependents,
              j.deadline, j.priority, j.progress, j.ckey, j.trace, j.lock, false AS refund,
              'ok'::text AS code, 200 AS exitcode, NULL::text AS result, NULL::text AS log,
              false AS uncounted
)
"""
ARCHIVE_OK = _ARCHIVE.format(archived=_ARCHIVED_OK, moved=_MOVED.format(conflict=""), noted=_NOTED)
ARCHIVE_OK_KEEP_FIRST = _ARCHIVE.format(
    archived=_ARCHIVED_OK, moved=_MOVED.format(conflict=_KEEP_FIRST), noted=_NOTED
)

# A pull worker's complete whose runs all ended ok or failed, without follow-on
# jobs (the common one): nothing to decide from the jobs' rows, so they are
# archived at once, each where its claim still holds it ($8 its lock), scoped to
# the client $10 as every statement of queries.pulled, and counted for the
# worker $11 in the same statement (no transaction, no rows locked first). An
# ok run of a type whose live handler chains a `then` job is left as it is:
# that job must be journaled before the outcome is stored (the caller
# completes those in a transaction). The rows: each job archived with its
# stored type and attempts, then the note's.
ARCHIVE_PULLED = f"""
WITH chained AS MATERIALIZED (
    SELECT type FROM (
        SELECT DISTINCT ON (type) type, data->>'then' AS chains
        FROM handlers
        WHERE type >= $10 || '-' AND type < $10 || '.' AND deleted_at IS NULL
        ORDER BY type, dt DESC, id DESC
    ) live
    WHERE coalesce(chains, '') <> ''
), {_ARCHIVED.format(scope=_PULLED_SCOPE)},
{_MOVED.format(conflict=_KEEP_FIRST)}, {_NOTED},
counted AS (
    INSERT INTO workers AS w (client, name, done_ok, done_failed, done_error, done_retry)
    SELECT $10, $11, count(*) FILTER (WHERE code = 'ok'), count(*) FILTER (WHERE code = 'failed'),
           count(*) FILTER (WHERE code = 'error'), 0
    FROM archived
    ON CONFLICT (client, name) DO UPDATE
    SET last_seen = now(), done_ok = w.done_ok + EXCLUDED.done_ok,
        done_failed = w.done_failed + EXCLUDED.done_failed,
        done_error = w.done_error + EXCLUDED.done_error
)
SELECT id, type, attempts, dependents AS resolve FROM archived
UNION ALL SELECT NULL, NULL, NULL, NULL FROM note
UNION ALL SELECT NULL, NULL, NULL, NULL FROM freed
"""
