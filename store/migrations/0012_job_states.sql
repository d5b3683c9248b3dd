-- 0012: counts of waiting jobs per type, so that a tenant's stats, the
-- dashboards and the waiting limit never count a deep queue job by job.
--
-- A waiting job (lock '') is in state 'q' (queued: due now or later) or 'b'
-- (blocked: dt 'infinity', see 0011). Statement-level triggers append, in the
-- statement that changes jobs, one row per (type, state) the statement moved:
-- the difference of its rows after and before. Appending rather than updating
-- a counter row: writers never wait on each other's counter rows, and
-- statements of one transaction cannot deadlock on them in any order. The
-- upkeep folds the appended rows into job_states now and then
-- (store.queries.counts.FOLD_STATES); a reader sums job_states and what was
-- appended since. Running and done jobs are counted elsewhere (the running
-- index, bounded by the daemons' concurrency; type_counts, 0003).

LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE job_states (
    type  text COLLATE "C" NOT NULL,
    state "char" NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (type, state)
);

-- The rows a fold brought to 0, until the fold drops them (it finds them here,
-- never by reading every type's row).
CREATE INDEX job_states_empty_idx ON job_states (type) WHERE n = 0;

CREATE TABLE job_state_moves (
    type  text COLLATE "C" NOT NULL,
    state "char" NOT NULL,
    n     bigint NOT NULL
);
CREATE INDEX job_state_moves_type_idx ON job_state_moves (type);
-- Every row is deleted within about a second of its insert: vacuumed whenever
-- a few thousand are dead (the default waits for a fifth of the table), so the
-- readers' index scans do not step over a long tail of dead entries.
ALTER TABLE job_state_moves SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000
);

CREATE FUNCTION jobs_count_states_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_state_moves (type, state, n)
    SELECT type, CASE WHEN dt = 'infinity' THEN 'b' ELSE 'q' END, count(*)
    FROM new_rows WHERE lock = ''
    GROUP BY 1, 2;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobs_count_states_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_state_moves (type, state, n)
    SELECT d.type, d.state, sum(d.n)
    FROM (
        SELECT type, CASE WHEN dt = 'infinity' THEN 'b' ELSE 'q' END AS state, 1 AS n
        FROM new_rows WHERE lock = ''
        UNION ALL
        SELECT type, CASE WHEN dt = 'infinity' THEN 'b' ELSE 'q' END, -1
        FROM old_rows WHERE lock = ''
    ) d
    GROUP BY d.type, d.state
    HAVING sum(d.n) <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION jobs_count_states_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_state_moves (type, state, n)
    SELECT type, CASE WHEN dt = 'infinity' THEN 'b' ELSE 'q' END, -count(*)
    FROM old_rows WHERE lock = ''
    GROUP BY 1, 2;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_count_states_insert
    AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_states_insert();

CREATE TRIGGER jobs_count_states_update
    AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_states_update();

CREATE TRIGGER jobs_count_states_delete
    AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_states_delete();

INSERT INTO job_states (type, state, n)
SELECT type, CASE WHEN dt = 'infinity' THEN 'b' ELSE 'q' END, count(*)
FROM jobs
WHERE lock = ''
GROUP BY 1, 2;
