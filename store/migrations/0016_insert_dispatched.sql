-- 0016: the insert of a few jobs, some claimed by the daemon that will run
-- them (store.queries.intake.INSERT_DISPATCHED calls it; its comment says
-- what it does), as a function whose plan is made once per connection.
--
-- Every statement of the store is planned for its own parameters (the pool's
-- plan_cache_mode is force_custom_plan: store.pg_base), which cost this one
-- about 0.25 ms of the server's CPU per call, more than running it. It is on
-- the path from an add to its job's start, and its plan depends on no table's
-- statistics: every table it reads is probed by a unique key or an index
-- (sysids, paused, handlers_live_idx, the jobs' primary key), which
-- enable_seqscan = off holds to even while a table is small.
CREATE FUNCTION insert_dispatched(
    p_ids text[], p_types text[], p_dts timestamptz[], p_data text[],
    p_created timestamptz[], p_claim bool[], p_sysid text, p_lease float8,
    p_note text, p_early bool, p_running bool
) RETURNS TABLE (id text, claimed bool, handler text)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH lapsed AS (
    SELECT EXISTS (
        SELECT 1 FROM sysids s
        WHERE s.sysid = p_sysid AND (s.expires < now() OR s.released_at IS NOT NULL)
    ) AS yes,
    -- for the transaction, not only the function (not one of its SET clauses)
    set_config('synchronous_commit', 'off', true) AS async_commit
),
added AS (
    INSERT INTO jobs (id, type, dt, data, create_dt, lock, attempts, run_dt)
    SELECT n.id, n.type,
           CASE WHEN c.claim THEN now() + make_interval(secs => p_lease) ELSE n.dt END,
           n.data, n.create_dt,
           CASE WHEN c.claim THEN p_sysid ELSE '' END,
           CASE WHEN c.claim THEN 1 ELSE 0 END,
           CASE WHEN c.claim THEN now() END
    FROM unnest(p_ids, p_types, p_dts, p_data, p_created, p_claim)
         AS n(id, type, dt, data, create_dt, claim)
    CROSS JOIN lapsed l
    CROSS JOIN LATERAL (
        SELECT n.claim AND NOT l.yes AND (p_running OR NOT EXISTS (
            SELECT 1 FROM paused p WHERE p.name IN (n.type, split_part(n.type, '-', 1))
        )) AS claim
    ) c
    WHERE NOT (p_early AND l.yes)
    ON CONFLICT (id) DO NOTHING
    RETURNING id, type, lock <> '' AS claimed
),
note AS (
    SELECT pg_notify('qd_jobs', CASE WHEN l.yes THEN '' ELSE p_note END)
    FROM lapsed l
    WHERE EXISTS (
        SELECT 1 FROM added a WHERE NOT a.claimed AND NOT EXISTS (
            SELECT 1 FROM paused p WHERE p.name IN (a.type, split_part(a.type, '-', 1))
            OFFSET 0  -- a probe of paused's key a row, not an anti-join reading it all
        )
    )
)
SELECT a.id, a.claimed,
       CASE WHEN a.claimed THEN (
           SELECT h.id FROM handlers h
           WHERE h.type = a.type COLLATE "default" AND h.deleted_at IS NULL
           ORDER BY h.dt DESC, h.id DESC
           LIMIT 1
       ) END
FROM added a
UNION ALL SELECT NULL, NULL, NULL FROM note;
END
$fn$;
