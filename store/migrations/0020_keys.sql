-- 0020: concurrency keys (docs/api.md, "Concurrency keys"). A job added with
-- ?key=K keeps K in ckey (NULL without one: nearly every job, so the column
-- and both partial indexes below cost the others nothing). A type whose live
-- handler sets "keyConcurrency": N has at most N jobs of one key running (or
-- claimed by a worker) at once; its claims go through qd_claim_keyed, every
-- other type's as before (store.queries.queue.CLAIMABLE).
ALTER TABLE jobs ADD COLUMN ckey text COLLATE "C";
ALTER TABLE jobs_done ADD COLUMN ckey text COLLATE "C";

-- the waiting jobs of each key, in the order a claim takes them
CREATE INDEX jobs_keyed_idx ON jobs (type, ckey, priority DESC, dt)
    WHERE lock = '' AND ckey IS NOT NULL;
-- the running ones, counted per key by a claim (with the few done ones that
-- wait in jobs for their purge, which the count leaves out; a predicate that
-- its statement implies and jobs_running_idx's does not: see qd_claim_keyed)
CREATE INDEX jobs_key_running_idx ON jobs (type, ckey) WHERE ckey IS NOT NULL AND lock <> '';

-- Up to p_limit waiting jobs of the type p_type, locked, at most p_cap running
-- per key: the keys in turn (in byte order, starting after p_after and coming
-- round), at most MAX_KEY_STEPS keys a call, in rounds of two statements.
-- The first walks jobs_keyed_idx to the next keys with a due job (a loose
-- index scan: a descent a key), as many as the jobs still wanted would fill at
-- the cap, and takes a transaction-level advisory lock on each (a key held by
-- another claim is skipped). The second counts each locked key's running jobs
-- (jobs_key_running_idx) and takes its waiting ones up to the cap: a VOLATILE
-- function's statements each take a fresh snapshot, so the count sees every
-- claim committed by whoever held the key's lock before. Claims of a capped
-- type take this path only, so no claim takes a key past its cap. Then, when
-- fewer were found, jobs without a key (uncapped) among the type's 1,000
-- oldest due ones. The last row has a NULL id and the last key visited:
-- where the caller's next claim starts.
CREATE FUNCTION qd_claim_keyed(p_type text, p_limit int, p_cap int, p_after text)
RETURNS TABLE (id text, ckey text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    max_key_steps CONSTANT int := 1000;
    start text COLLATE "C" := coalesce(p_after, '');
    lo text COLLATE "C" := coalesce(p_after, '');
    hi text COLLATE "C" := NULL;
    keys text[];
    last text COLLATE "C";
    seen int;
    steps int := 0;
    got int;
    taken int := 0;
BEGIN
    IF EXISTS (SELECT 1 FROM paused p WHERE p.name IN (p_type, split_part(p_type, '-', 1))) THEN
        RETURN;
    END IF;
    WHILE taken < p_limit AND steps < max_key_steps LOOP
        WITH RECURSIVE walk(k, n) AS (
            (SELECT j.ckey, 1 FROM jobs j
             WHERE j.type = p_type AND j.lock = '' AND j.ckey IS NOT NULL AND j.ckey > lo
               AND (hi IS NULL OR j.ckey <= hi) AND j.dt <= now()
             ORDER BY j.ckey LIMIT 1)
            UNION ALL
            SELECT x.ckey, walk.n + 1
            FROM walk CROSS JOIN LATERAL (
                SELECT j.ckey FROM jobs j
                WHERE j.type = p_type AND j.lock = '' AND j.ckey IS NOT NULL
                  AND j.ckey > walk.k AND (hi IS NULL OR j.ckey <= hi) AND j.dt <= now()
                ORDER BY j.ckey LIMIT 1
            ) x
            WHERE walk.n < least(max_key_steps - steps,
                                 greatest(1, (p_limit - taken + p_cap - 1) / p_cap))
        )
        SELECT array_agg(w.k ORDER BY w.k)
                   FILTER (WHERE pg_try_advisory_xact_lock(7177, hashtext(p_type || ' ' || w.k))),
               max(w.k), count(*)
        INTO keys, last, seen
        FROM walk w;
        IF seen = 0 THEN
            EXIT WHEN hi IS NOT NULL OR start = '';
            lo := '';  -- round: the keys up to where this call started
            hi := start;
            CONTINUE;
        END IF;
        lo := last;
        steps := steps + seen;
        CONTINUE WHEN keys IS NULL;
        -- in the keys' order (a nested loop over the array, no sort), so the
        -- limit ends the statement, not a sort of what every key had
        RETURN QUERY
            SELECT w.id, w.ckey
            FROM unnest(keys) WITH ORDINALITY AS k(key, n)
            CROSS JOIN LATERAL (
                -- "(... = '__done') IS NOT TRUE" where "<> '__done'" would do, so
                -- that the planner cannot read jobs_running_idx (every running
                -- job of every type) instead, as it did when the statistics
                -- were taken while nothing ran
                SELECT count(*)::int AS running FROM jobs r
                WHERE r.type = p_type AND r.ckey = k.key AND r.lock <> ''
                  AND (r.lock = '__done') IS NOT TRUE
            ) c
            CROSS JOIN LATERAL (
                SELECT j.id, j.ckey FROM jobs j
                WHERE j.type = p_type AND j.ckey = k.key AND j.lock = '' AND j.dt <= now()
                  AND (j.deadline IS NULL OR j.deadline > now())
                ORDER BY j.priority DESC, j.dt
                LIMIT greatest(p_cap - c.running, 0)
                FOR UPDATE SKIP LOCKED
            ) w
            LIMIT p_limit - taken;
        GET DIAGNOSTICS got = ROW_COUNT;
        taken := taken + got;
    END LOOP;
    IF taken < p_limit THEN
        RETURN QUERY
            SELECT w.id, w.ckey FROM jobs w
            WHERE w.id = ANY(ARRAY(
                    SELECT a.id FROM jobs a
                    WHERE a.type = p_type AND a.lock = '' AND a.dt <= now()
                    ORDER BY a.dt LIMIT 1000))
              AND w.ckey IS NULL AND w.lock = '' AND w.dt <= now()
              AND (w.deadline IS NULL OR w.deadline > now())
            ORDER BY w.priority DESC, w.dt
            LIMIT p_limit - taken
            FOR UPDATE SKIP LOCKED;
    END IF;
    IF steps > 0 THEN
        RETURN QUERY SELECT NULL::text, lo::text;
    END IF;
END
$$;

CREATE OR REPLACE VIEW all_jobs AS
SELECT id, type, dt, lock, data, create_dt, done_dt, attempts, code, exitcode, result,
       run_dt, runs, deps, deps_dt, resolve_any, dependents, deadline, priority, progress, ckey
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
       NULL::int, NULL::timestamptz, NULL::boolean, dependents, deadline, priority, progress, ckey
FROM jobs_done;
