-- 0013: finished runs leave the hot table. A release that ends a job (a run
-- that completed, failed, or used its last attempt; a pull worker's complete)
-- deletes its row from `jobs` and appends it to `jobs_done`, in one statement.
--
-- Why: `jobs` then holds the live jobs (waiting, blocked, running) and few
-- done ones, so its indexes stay small and a release costs PostgreSQL a
-- delete (no index entries) and one append to a table with fewer indexes,
-- instead of an update that wrote a new version into every index of `jobs`
-- and a run entry built as JSON.
--
-- `jobs_done` keeps the final run in columns (`run_dt` its start, `done_dt`
-- its end, `ran_by` the lock it ran under, `code`/`exitcode` its outcome);
-- `runs` there holds only the runs before it. The view `all_jobs` shows both
-- tables with the columns of `jobs`, the final run appended to `runs`: every
-- read of done jobs goes through it.
--
-- The rarer ways a job ends (cancelled, deadline, a failed dependency, its
-- time ran out without a handler, every lease ran out) still mark its row
-- done in `jobs` (lock '__done'), as before; rows done before this migration
-- stay there too. Both are purged after the retention as ever.
--
-- Ids stay unique across both tables: a row is appended to `jobs_done` only by
-- the statement that deletes it from `jobs`, and ingestion that may insert a
-- batch again (after a crash, a failed flush, a retry) skips ids already in
-- `jobs_done` (store.queries.intake).

CREATE TABLE jobs_done (
    id          text COLLATE "C" PRIMARY KEY,
    type        text COLLATE "C" NOT NULL,
    data        text NOT NULL,
    create_dt   timestamptz NOT NULL,
    done_dt     timestamptz NOT NULL,
    attempts    int NOT NULL,
    code        text,
    exitcode    int,
    result      text,
    run_dt      timestamptz,
    ran_by      text,  -- the final run's lock (a sysid or 'w:<token>:<worker>'); NULL: no final run
    runs        jsonb,  -- the runs before the final one
    dependents  boolean NOT NULL DEFAULT false,
    deadline    timestamptz
);

-- A tenant's listing, newest first (as jobs_client_created_idx on jobs).
CREATE INDEX jobs_done_client_created_idx
    ON jobs_done (split_part(type, '-', 1), create_dt DESC, id DESC);
-- The dashboard's recent failures (as jobs_failed_idx on jobs).
CREATE INDEX jobs_done_failed_idx ON jobs_done (type, done_dt DESC)
    WHERE code IN ('failed', 'error');
-- Done jobs whose dependents a crash left unresolved (as jobs_dependents_idx).
CREATE INDEX jobs_done_dependents_idx ON jobs_done (id) WHERE dependents;
-- Retention: rows are appended in done_dt order, so a block range index finds
-- the old ones at a fraction of a B-tree's cost per append.
CREATE INDEX jobs_done_dt_idx ON jobs_done USING brin (done_dt);

ALTER TABLE jobs_done SET (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_scale_factor = 0.05
);

-- type_counts (0003, 0006) counts the done jobs of jobs_done as it counts
-- those of jobs: appended (n and archived grow), deleted (n falls), updated
-- to another code (moved between codes).
CREATE FUNCTION jobs_done_count_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO type_counts AS c (type, code, n, archived)
    SELECT type, coalesce(code, ''), count(*), count(*)
    FROM new_rows
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (type, code) DO UPDATE
        SET n = c.n + EXCLUDED.n, archived = c.archived + EXCLUDED.archived;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobs_done_count_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO type_counts AS c (type, code, n)
    SELECT type, coalesce(code, ''), -count(*)
    FROM old_rows
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (type, code) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

-- An operator's UPDATE by hand that changes a code keeps the counts exact.
CREATE FUNCTION jobs_done_count_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO type_counts AS c (type, code, n)
    SELECT d.type, d.code, sum(d.n)
    FROM (
        SELECT type, coalesce(code, '') AS code, 1 AS n FROM new_rows
        UNION ALL
        SELECT type, coalesce(code, ''), -1 FROM old_rows
    ) d
    GROUP BY d.type, d.code
    HAVING sum(d.n) <> 0
    ORDER BY d.type, d.code
    ON CONFLICT (type, code) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_done_count_update
    AFTER UPDATE ON jobs_done
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_done_count_update();

CREATE TRIGGER jobs_done_count_insert
    AFTER INSERT ON jobs_done
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_done_count_insert();

CREATE TRIGGER jobs_done_count_delete
    AFTER DELETE ON jobs_done
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_done_count_delete();

-- Every job, live or done, with the columns of jobs. A condition on `lock`
-- leaves out the branch it cannot match (the planner folds the constant).
CREATE VIEW all_jobs AS
SELECT id, type, dt, lock, data, create_dt, done_dt, attempts, code, exitcode, result,
       run_dt, runs, deps, deps_dt, resolve_any, dependents, deadline
FROM jobs
UNION ALL
SELECT id, type, done_dt + interval '1000 years', '__done'::text COLLATE "C", data, create_dt,
       done_dt, attempts, code, exitcode, result, run_dt,
       CASE WHEN ran_by IS NULL THEN runs
            ELSE coalesce(runs, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                'started', floor(extract(epoch FROM run_dt) * 1000)::bigint,
                'ended', floor(extract(epoch FROM done_dt) * 1000)::bigint,
                'by', CASE WHEN ran_by LIKE 'w:%' THEN 'worker:' || substr(ran_by, 36)
                           ELSE 'sysid:' || ran_by END,
                'exitcode', exitcode,
                'code', code,
                'reason', CASE code WHEN 'ok' THEN 'completed' WHEN 'failed' THEN 'failed'
                                    ELSE 'exception' END))
       END,
       NULL::int, NULL::timestamptz, NULL::boolean, dependents, deadline
FROM jobs_done;
