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
-- the running ones, counted per key by a claim: the predicate is the count's
-- own (see qd_claim_keyed), so done rows waiting in jobs for their purge are
-- not in it, and jobs_running_idx (every running job of every type) never
-- serves the count
CREATE INDEX jobs_key_running_idx ON jobs (type, ckey)
    WHERE ckey IS NOT NULL AND lock <> '' AND (lock = '__done') IS NOT TRUE;

-- Up to p_limit waiting jobs of the type p_type, locked, at most p_cap running
-- per key, for a claim of a type whose live handler sets keyConcurrency (no
-- other claim takes its jobs: store.queries.queue.CLAIMABLE).
--
-- Claims of one capped type take turns: each first locks the type's live
-- handler row (FOR NO KEY UPDATE: a row lock, no entry in the lock table, and
-- one no other tenant can name), waiting for a claim of the type in progress
-- to commit. Its next statement then takes a fresh snapshot (each statement
-- of a VOLATILE function does, under READ COMMITTED), which sees every claim
-- committed before, so the running jobs it counts per key are all there are;
-- releases only lower the counts. So no key runs more than p_cap.
--
-- The keys are served in turn, in the order of their bytes, starting after
-- p_after and coming round (a loose index scan of jobs_keyed_idx: a descent a
-- key), at most MAX_KEY_STEPS keys a call; each key's due jobs by priority,
-- then age, up to its room. Then, when fewer were found, jobs without a key
-- (uncapped) among the type's 1,000 oldest due ones. The last row has a NULL
-- id and the last key visited: where the caller's next claim starts.
CREATE FUNCTION qd_claim_keyed(p_type text, p_limit int, p_cap int, p_after text)
RETURNS TABLE (id text, ckey text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    max_key_steps CONSTANT int := 1000;
    start text COLLATE "C" := coalesce(p_after, '');
    lo text COLLATE "C";
    hi text COLLATE "C";
    pass int := 0;
    row record;
    last text COLLATE "C";
    steps int := 0;
    taken int := 0;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'qd_claim_keyed needs READ COMMITTED, not %',
            current_setting('transaction_isolation');
    END IF;
    IF EXISTS (SELECT 1 FROM paused p WHERE p.name IN (p_type, split_part(p_type, '-', 1))) THEN
        RETURN;
    END IF;
    PERFORM 1 FROM handlers h
    WHERE h.id = (SELECT l.id FROM handlers l
                  WHERE l.type = p_type AND l.deleted_at IS NULL
                  ORDER BY l.dt DESC, l.id DESC LIMIT 1)
    FOR NO KEY UPDATE;
    -- pass 1: the keys after start; pass 2: from the first key up to start
    WHILE pass < 2 AND taken < p_limit AND steps < max_key_steps LOOP
        pass := pass + 1;
        IF pass = 1 THEN
            lo := start;
            hi := NULL;
        ELSIF start = '' THEN
            EXIT;
        ELSE
            lo := '';
            hi := start;
        END IF;
        FOR row IN
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
                WHERE walk.n < max_key_steps - steps
            )
            SELECT w.k, t.id
            FROM walk w
            CROSS JOIN LATERAL (
                -- "(... = '__done') IS NOT TRUE" as jobs_key_running_idx says it
                SELECT count(*)::int AS running FROM jobs r
                WHERE r.type = p_type AND r.ckey = w.k AND r.lock <> ''
                  AND (r.lock = '__done') IS NOT TRUE
            ) c
            LEFT JOIN LATERAL (
                SELECT j.id FROM jobs j
                WHERE j.type = p_type AND j.ckey = w.k AND j.lock = '' AND j.dt <= now()
                  AND (j.deadline IS NULL OR j.deadline > now())
                ORDER BY j.priority DESC, j.dt
                LIMIT greatest(p_cap - c.running, 0)
                FOR UPDATE SKIP LOCKED
            ) t ON true
        LOOP
            IF last IS DISTINCT FROM row.k THEN
                last := row.k;
                steps := steps + 1;
            END IF;
            IF row.id IS NOT NULL THEN
                id := row.id;
                ckey := row.k;
                RETURN NEXT;
                taken := taken + 1;
                EXIT WHEN taken >= p_limit;
            END IF;
        END LOOP;
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
    IF last IS NOT NULL THEN
        RETURN QUERY SELECT NULL::text, last::text;
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
