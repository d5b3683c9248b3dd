-- 0021: a job's trace (docs/operations.md, "Traces"): the W3C traceparent of
-- the span of the add that made it, kept when the daemon exports traces
-- (--otlp-endpoint) so that its ingest, claims, runs and releases are spans
-- of the caller's trace and its handler gets the context. NULL otherwise:
-- nearly every job, so the column costs nothing. Kept through the archive
-- (a rerun is traced as its first run was).
ALTER TABLE jobs ADD COLUMN trace text;
ALTER TABLE jobs_done ADD COLUMN trace text;
