-- 0006: what the dashboard reads (GET /admin/overview, GET /{client}/overview).
--
-- `type_counts.archived` counts the jobs of a (type, code) ever archived: it
-- only grows (a purge lowers `n`, never `archived`), so the difference of two
-- samples taken by a daemon is the throughput between them, whoever archived
-- the jobs and whatever was purged meanwhile. The update trigger adds the
-- positive part of its per-(type, code) change, which is the number of jobs
-- the statement archived (store statements never move a job out of '__done').
--
-- `jobs_failed_idx` holds only archived jobs that failed or errored, newest
-- first per type: the recent failures are read per type from it, never from
-- the (much larger) set of archived jobs. Jobs that end OK never enter it.

LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE type_counts ADD COLUMN archived bigint NOT NULL DEFAULT 0;
UPDATE type_counts SET archived = greatest(n, 0);

CREATE OR REPLACE FUNCTION jobs_count_done_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO type_counts AS c (type, code, n, archived)
    SELECT d.type, d.code, sum(d.n), greatest(sum(d.n), 0)
    FROM (
        SELECT type, coalesce(code, '') AS code, 1 AS n FROM new_rows WHERE lock = '__done'
        UNION ALL
        SELECT type, coalesce(code, ''), -1 FROM old_rows WHERE lock = '__done'
    ) d
    GROUP BY d.type, d.code
    HAVING sum(d.n) <> 0
    ORDER BY d.type, d.code
    ON CONFLICT (type, code) DO UPDATE
        SET n = c.n + EXCLUDED.n, archived = c.archived + EXCLUDED.archived;
    RETURN NULL;
END
$$;

CREATE INDEX jobs_failed_idx ON jobs (type, done_dt DESC)
    WHERE lock = '__done' AND code IN ('failed', 'error');
