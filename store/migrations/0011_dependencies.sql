-- 0011: jobs that wait for other jobs (dependencies), and deadlines.
--
-- A blocked job is waiting (lock '') with dt 'infinity': no claim or count of
-- due jobs sees it, and the waiting index still counts it per type (stats'
-- `blocked`). `deps` is how many of its dependencies are not done yet,
-- `deps_dt` the dt it asked for, `resolve_any` true under all-resolved (any
-- outcome counts) and false under all-completed (each must end ok, else the
-- job fails with 424). `job_deps` holds an edge per dependency not yet done
-- (dep -> job); `dependents` marks a job that has such edges, so the statement
-- that archives it knows to resolve them, and a sweep finds the ones a crash
-- left unresolved (jobs_dependents_idx, only such jobs).
-- `deadline`: the job ends with 408 if it is not done by then.

ALTER TABLE jobs
    ADD COLUMN deps int,
    ADD COLUMN deps_dt timestamptz,
    ADD COLUMN resolve_any boolean,
    ADD COLUMN dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN deadline timestamptz;

CREATE TABLE job_deps (
    dep text COLLATE "C" NOT NULL,
    job text COLLATE "C" NOT NULL,
    PRIMARY KEY (dep, job)
);

CREATE INDEX jobs_dependents_idx ON jobs (id) WHERE dependents;

CREATE INDEX jobs_deadline_idx ON jobs (deadline) WHERE deadline IS NOT NULL AND lock <> '__done';
