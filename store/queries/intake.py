"""Jobs in: ingestion from the journal (COPY through a staging table, or one INSERT)."""

from __future__ import annotations

JOBS_TABLE = "jobs"

# A small batch in one statement, one round trip: the insert, and the jobs
# notification sent at its commit ($6, or "" when some ids existed already:
# which of the jobs were new is not known then). $1..$5 the columns as arrays.
INSERT_FEW = """
WITH added AS (
    INSERT INTO jobs (id, type, dt, data, create_dt)
    SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[],
                         $5::timestamptz[])
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
SELECT id, type, dt, data, create_dt FROM jobs_in
ON CONFLICT (id) DO NOTHING
"""

# The eligible-jobs read without locking (CLAIM_IDS below is the claim's own);
# kept here so a test can check its plan uses jobs_waiting_idx.
ELIGIBLE_IDS = """
SELECT id FROM jobs WHERE type = $1 AND lock = '' AND dt <= now() ORDER BY dt LIMIT 100
"""
