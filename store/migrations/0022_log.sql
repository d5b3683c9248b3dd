-- 0022: a job's log excerpt (docs/api.md): the last lines its last run
-- printed when that run did not end ok (at most LOG_EXCERPT_LINES lines and
-- LOG_EXCERPT_CHARS characters, engine.releases), written by the release of
-- that run and shown by a GET of the job and the dashboard's job page. NULL
-- for an ok run and one that printed nothing: nearly every one, so the column
-- costs nothing and ok runs keep their fast release. Moved with the job to the
-- archive; cleared by a rerun.
ALTER TABLE jobs ADD COLUMN log text;
ALTER TABLE jobs_done ADD COLUMN log text;

CREATE OR REPLACE VIEW all_jobs AS
SELECT id, type, dt, lock, data, create_dt, done_dt, attempts, code, exitcode, result,
       run_dt, runs, deps, deps_dt, resolve_any, dependents, deadline, priority, progress, ckey,
       log
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
       NULL::int, NULL::timestamptz, NULL::boolean, dependents, deadline, priority, progress, ckey,
       log
FROM jobs_done;
