-- 0018: job priorities (docs/api.md, "Priorities"). Among the due jobs of one
-- type a claim takes the higher priority first, then the oldest. Nearly every
-- job has priority 0: they stay in jobs_waiting_idx alone, in dt order, and
-- only the others are in jobs_priority_idx too, so an add or a claim that
-- uses no priority pays one descent of an empty index
-- (store.queries.queue.CLAIMABLE reads both). Adding a column with a constant
-- default rewrites no row.
ALTER TABLE jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE jobs_done ADD COLUMN priority smallint NOT NULL DEFAULT 0;

CREATE INDEX jobs_priority_idx ON jobs (type, priority DESC, dt)
    WHERE lock = '' AND priority <> 0;

CREATE OR REPLACE VIEW all_jobs AS
SELECT id, type, dt, lock, data, create_dt, done_dt, attempts, code, exitcode, result,
       run_dt, runs, deps, deps_dt, resolve_any, dependents, deadline, priority
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
       NULL::int, NULL::timestamptz, NULL::boolean, dependents, deadline, priority
FROM jobs_done;
