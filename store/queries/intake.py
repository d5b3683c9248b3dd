"""Jobs in: ingestion from the journal (COPY through a staging table, or one INSERT)."""

from __future__ import annotations

JOBS_TABLE = "jobs"

# Ingestion that may insert a batch again (``fresh`` false: after a crash, a
# failed flush or a retry) skips the ids already done and moved to jobs_done
# (0013); jobs' primary key skips the others. A fresh batch (read from the
# journal for the first time by the daemon that wrote it) cannot be there.

# A small batch in one statement, one round trip: the insert, and the jobs
# notification sent at its commit ($6, or "" when some ids existed already:
# which of the jobs were new is not known then). $1..$5 the columns as
# arrays; $7 fresh.
INSERT_FEW = """
WITH added AS (
    INSERT INTO jobs (id, type, dt, data, create_dt)
    SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[],
                         $5::timestamptz[]) AS n(id, type, dt, data, create_dt)
    WHERE $7::bool OR NOT EXISTS (SELECT 1 FROM jobs_done d WHERE d.id = n.id)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT n, CASE WHEN n > 0 THEN
    pg_notify('qd_jobs', CASE WHEN n = cardinality($1::text[]) THEN $6 ELSE '' END)
END, set_config('synchronous_commit', 'off', true)
FROM (SELECT count(*) AS n FROM added) c
"""
INSERT_FROM_JOBS_IN = """
INSERT INTO jobs (id, type, dt, data, create_dt)
SELECT id, type, dt, data, create_dt FROM jobs_in i
WHERE NOT EXISTS (SELECT 1 FROM jobs_done d WHERE d.id = i.id)
ON CONFLICT (id) DO NOTHING
"""

# The eligible-jobs read without locking (CLAIM_IDS below is the claim's own);
# kept here so a test can check its plan uses jobs_waiting_idx.
ELIGIBLE_IDS = """
SELECT id FROM jobs WHERE type = $1 AND lock = '' AND dt <= now() ORDER BY dt LIMIT 100
"""
