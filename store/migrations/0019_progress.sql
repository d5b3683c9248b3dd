-- 0019: a running job's progress (docs/api.md, "Progress"): the last
-- {"fraction", "message", "at"} its handler or pull worker reported, written
-- by the daemon at most every half second a job (engine.progress), kept when
-- the job is done and moved with it to the archive. NULL for a job that never
-- reported any: nearly every one, so the column costs nothing.
ALTER TABLE jobs ADD COLUMN progress jsonb;
ALTER TABLE jobs_done ADD COLUMN progress jsonb;

CREATE OR REPLACE VIEW all_jobs AS
SELECT id, type, dt, lock, data, create_dt, done_dt, attempts, code, exitcode, result,
       run_dt, runs, deps, deps_dt, resolve_any, dependents, deadline, priority, progress
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
       NULL::int, NULL::timestamptz, NULL::boolean, dependents, deadline, priority, progress
FROM jobs_done;
