-- 0010: every run of a job, kept with the job (Taskcluster's runs).
--
-- `run_dt` is when the current run was claimed; `runs` the finished runs, a
-- JSON array of {"started", "ended" (epoch ms), "by" ("sysid:<n>" or
-- "worker:<name>"), "exitcode", "code", "reason"}, one appended by the
-- statement that ends the run (a release, a complete, a lease that ran out,
-- a cancel). Columns without defaults: adding them rewrites nothing, and
-- ingestion's COPY does not name them.

ALTER TABLE jobs ADD COLUMN run_dt timestamptz, ADD COLUMN runs jsonb;
