-- 0003: counts of done jobs per (type, code), so a tenant's stats never read
-- archived jobs (kept for days, far more numerous than waiting or running ones).
--
-- `code` is the job's code, or '' when it has none. Every code is counted, not
-- only ok/failed/error, so a type whose only jobs are done with another code
-- (e.g. 'retry', archived when its attempts ran out) is still listed by stats.
--
-- The counts are kept by statement-level triggers on jobs: each UPDATE or
-- DELETE adds, in the same statement, the difference between its done rows
-- after and before, one upsert per (type, code) in key order (so concurrent
-- writers take the counter rows' locks in one order and never deadlock on them).
-- Triggers rather than a CTE in each store statement: the count then stays
-- exact whoever changes a job (a release, a cancel, a purge, or an operator's
-- UPDATE by hand). Inserting a job that is already done is not counted: no
-- store statement does that except the benchmark fill, which counts its own rows.
-- Rows whose count falls to 0 stay (one per type and code ever seen); stats
-- skips them.

-- Writers to jobs wait from here to commit, so the initial count below is exact.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE type_counts (
    type text COLLATE "C" NOT NULL,
    code text COLLATE "C" NOT NULL,
    n    bigint NOT NULL,
    PRIMARY KEY (type, code)
);

CREATE FUNCTION jobs_count_done_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO type_counts AS c (type, code, n)
    SELECT d.type, d.code, sum(d.n)
    FROM (
        SELECT type, coalesce(code, '') AS code, 1 AS n FROM new_rows WHERE lock = '__done'
        UNION ALL
        SELECT type, coalesce(code, ''), -1 FROM old_rows WHERE lock = '__done'
    ) d
    GROUP BY d.type, d.code
    HAVING sum(d.n) <> 0
    ORDER BY d.type, d.code
    ON CONFLICT (type, code) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobs_count_done_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO type_counts AS c (type, code, n)
    SELECT type, coalesce(code, ''), -count(*)
    FROM old_rows
    WHERE lock = '__done'
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (type, code) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_count_done_update
    AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_done_update();

CREATE TRIGGER jobs_count_done_delete
    AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_done_delete();

INSERT INTO type_counts (type, code, n)
SELECT type, coalesce(code, ''), count(*)
FROM jobs
WHERE lock = '__done'
GROUP BY 1, 2;
