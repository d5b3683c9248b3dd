"""Jobs that wait for other jobs (migration 0011): adding them, and resolving
their dependencies when those are done.

Ordering across daemons. An add first locks the live rows of its
dependencies (``MARK_DEPENDENCIES``, the UPDATE that marks them as having
dependents), then, in the same transaction, reads their state and writes its
edges (``INSERT``, a statement of its own so that its snapshot sees every job
archived before the lock was granted: a release moves a done job from jobs
to jobs_done, 0013). A job's archiving locks the same row: whichever commits
second sees the other. An add that comes second finds the dependency done and
counts it at once (no edge); an archiving that comes second returns
``dependents`` true, and its caller runs ``RESOLVE`` afterwards, a statement
that sees the edges. A crash between the archiving and ``RESOLVE`` leaves
``dependents`` set on a done job: ``PENDING`` finds it and the resolution is
run then.
"""

from __future__ import annotations

from queue_daemon.store.queries.queue import BY_OF, NOTE_DONE, RUN_ENTRY

# $1 the ids of the dependencies: the live ones are marked and locked.
MARK_DEPENDENCIES = """
UPDATE jobs SET dependents = dependents OR lock <> '__done'
WHERE id = ANY($1::text[])
"""

# $1..$5 the new jobs' columns as arrays (as intake.INSERT_FEW), $6 the ids of
# their dependencies, $7 resolve_any (all-resolved), $8 deadline or NULL, $9
# the priority, $10 the key or NULL, $11 the trace or NULL; after
# MARK_DEPENDENCIES in its transaction. A dependency that is no longer in the
# store (purged) counts as completed.
INSERT = """
WITH deps AS (
    SELECT id, lock, code FROM jobs WHERE id = ANY($6::text[])
    UNION ALL
    SELECT id, '__done', code FROM jobs_done WHERE id = ANY($6::text[])
),
state AS (
    SELECT count(*) FILTER (WHERE lock <> '__done') AS open,
           min(id) FILTER (WHERE lock = '__done' AND code IS DISTINCT FROM 'ok'
                           AND NOT $7::bool) AS bad
    FROM deps
),
added AS (
    INSERT INTO jobs (id, type, dt, data, create_dt, deadline, resolve_any, deps, deps_dt,
                      lock, done_dt, code, exitcode, result, priority, ckey, trace)
    SELECT n.id, n.type,
           CASE WHEN s.bad IS NOT NULL THEN now() + interval '1000 years'
                WHEN s.open > 0 THEN 'infinity'::timestamptz
                ELSE n.dt END,
           n.data, n.create_dt, $8::timestamptz, $7::bool,
           CASE WHEN s.bad IS NULL THEN s.open::int END, n.dt,
           CASE WHEN s.bad IS NOT NULL THEN '__done' ELSE '' END,
           CASE WHEN s.bad IS NOT NULL THEN now() END,
           CASE WHEN s.bad IS NOT NULL THEN 'failed' END,
           CASE WHEN s.bad IS NOT NULL THEN 424 END,
           CASE WHEN s.bad IS NOT NULL THEN 'dependency ' || s.bad || ' did not complete' END,
           $9::smallint, $10::text, $11::text
    FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::timestamptz[])
         AS n(id, type, dt, data, create_dt)
    CROSS JOIN state s
    ON CONFLICT (id) DO NOTHING
    RETURNING id, type, lock, dt
),
counted AS (
    -- a job added done (its dependency failed) is counted here: type_counts'
    -- triggers (migration 0003) count updates and deletes, not inserts
    INSERT INTO type_counts AS c (type, code, n)
    SELECT type, 'failed', count(*) FROM added WHERE lock = '__done'
    GROUP BY type ORDER BY type
    ON CONFLICT (type, code) DO UPDATE SET n = c.n + EXCLUDED.n
),
edges AS (
    INSERT INTO job_deps (dep, job)
    SELECT d.id, a.id FROM deps d CROSS JOIN added a
    WHERE d.lock <> '__done' AND a.lock = ''
    ON CONFLICT DO NOTHING
)
SELECT id, type,
       CASE WHEN lock = '__done' THEN 'failed'
            WHEN dt = 'infinity' THEN 'blocked'
            WHEN dt <= now() THEN 'due' ELSE 'later' END AS state
FROM added
"""

# $1 ids of jobs just done that had dependents. Their edges are resolved:
# all-completed dependents of a job not done ok fail (424), transitively, in
# this statement; every other dependent counts one dependency less and is due
# (at the dt it asked for) when none is left. Returns the jobs freed and failed,
# and whether a failed one has dependents (to resolve at once in turn).
RESOLVE = """
WITH RECURSIVE done_live AS (
    UPDATE jobs SET dependents = false
    WHERE id = ANY($1::text[]) AND lock = '__done' AND dependents
    RETURNING id, code
),
done_archived AS (
    UPDATE jobs_done SET dependents = false
    WHERE id = ANY($1::text[]) AND dependents
    RETURNING id, code
),
done AS (
    SELECT id, code FROM done_live UNION ALL SELECT id, code FROM done_archived
),
doomed(job, root) AS (
    SELECT e.job, d.id
    FROM done d
    JOIN job_deps e ON e.dep = d.id
    JOIN jobs j ON j.id = e.job
    WHERE d.code IS DISTINCT FROM 'ok' AND NOT j.resolve_any AND j.lock = '' AND j.deps > 0
  UNION
    SELECT e.job, f.root
    FROM doomed f
    JOIN job_deps e ON e.dep = f.job
    JOIN jobs j ON j.id = e.job
    WHERE NOT j.resolve_any AND j.lock = '' AND j.deps > 0
),
failed AS (
    UPDATE jobs j
    SET lock = '__done', dt = now() + interval '1000 years', done_dt = now(),
        code = 'failed', exitcode = 424,
        result = 'dependency ' || x.root || ' did not complete',
        deps = 0
    FROM (SELECT DISTINCT ON (job) job, root FROM doomed ORDER BY job, root) x
    WHERE j.id = x.job AND j.lock = ''
    -- dependents stays set: an edge added to one of these while this statement
    -- ran is not in its snapshot; the caller resolves them again at once
    RETURNING j.id, j.type, j.dependents
),
gone AS (
    DELETE FROM job_deps e
    WHERE e.dep IN (SELECT id FROM done UNION ALL SELECT id FROM failed)
    RETURNING e.job
),
counted AS (
    SELECT g.job, count(*)::int AS n
    FROM gone g
    WHERE g.job NOT IN (SELECT id FROM failed)
    GROUP BY g.job
),
freed AS (
    UPDATE jobs j
    SET deps = j.deps - c.n,
        dt = CASE WHEN j.deps - c.n <= 0 THEN greatest(j.deps_dt, now()) ELSE j.dt END
    FROM counted c
    WHERE j.id = c.job AND j.lock = '' AND j.deps > 0
    RETURNING j.id, j.type, j.deps <= 0 AS due
)
SELECT 'freed' AS what, id, type, false AS dependents FROM freed WHERE due
UNION ALL
SELECT 'failed', id, type, dependents FROM failed
"""

# Done jobs whose dependents a crash left unresolved.
PENDING = """
(SELECT id FROM jobs WHERE dependents AND lock = '__done' LIMIT $1)
UNION ALL
(SELECT id FROM jobs_done WHERE dependents LIMIT $1)
"""

# Jobs whose deadline passed, waiting, blocked or running, at most $1: failed,
# 408. A running one's holder loses it (its release or complete no longer
# applies: the late result is discarded); its run ends with reason deadline.
EXPIRE_DEADLINES = f"""
WITH due AS MATERIALIZED (
    SELECT id, lock FROM jobs
    WHERE deadline IS NOT NULL AND lock <> '__done' AND deadline <= now()
    ORDER BY deadline
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), ended AS (
    UPDATE jobs j
    SET lock = '__done', dt = now() + interval '1000 years', done_dt = now(),
        code = 'failed', exitcode = 408,
        result = 'the deadline passed before the job was done', deps = NULL,
        runs = CASE WHEN d.lock = '' THEN j.runs
                    ELSE coalesce(j.runs, '[]'::jsonb) || {
    RUN_ENTRY.format(
        by=BY_OF.format(lock="d.lock"), exitcode="NULL::int", code="NULL::text", reason="'deadline'"
    )
} END
    FROM due d
    WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND j.id = d.id
    RETURNING j.id, j.type, j.lock, j.dependents, d.lock <> '' AS running
),
{NOTE_DONE.format(rows="ended")}
SELECT id, type, dependents, running FROM ended
UNION ALL SELECT NULL, NULL, NULL, NULL FROM note
"""
