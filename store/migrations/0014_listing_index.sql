-- 0014: the tenant's listing index leaves out running jobs.
--
-- A claim sets a job's lock and dt, columns of jobs' indexes, so its update is
-- never a HOT one: the new row version gets an entry in every index whose
-- predicate it meets. jobs_client_created_idx held every row, so each claim
-- wrote an entry there too (about 1.3 us of PostgreSQL's CPU a job, measured
-- with pulled no-op jobs). It now holds the waiting, blocked and done rows of
-- jobs; the running ones, as many as the daemons' slots and the workers'
-- claims hold, are listed through jobs_running_idx (store.queries.jobs).

DROP INDEX jobs_client_created_idx;
CREATE INDEX jobs_client_created_idx
    ON jobs (split_part(type, '-', 1), create_dt DESC, id DESC)
    WHERE lock = '' OR lock = '__done';
