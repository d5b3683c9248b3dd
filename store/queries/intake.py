"""Jobs in: ingestion from the journal (COPY through a staging table, or one INSERT)."""

from __future__ import annotations

JOBS_TABLE = "jobs"

# Ingestion that may insert a batch again (``fresh`` false: after a crash, a
# failed flush or a retry) skips the ids already done and moved to jobs_done
# (0013); jobs' primary key skips the others. A fresh batch (read from the
# journal for the first time by the daemon that wrote it) cannot be there.
#
# A job may be moved while its id is inserted again, or another daemon may
# insert the same ids at the same time (an Idempotency-Key added twice, a
# schedule's tick) and its jobs run and move before this insert gets to them:
# no check made before the insert can see that. So an insert that may repeat
# ids is followed, in its transaction, by REMOVE_DONE, a statement of its own
# whose later snapshot sees every move committed before it: the rows it just
# inserted whose ids are in jobs_done go again. A move still in progress when
# the insert reached its id made the insert wait (the unique index) and then
# commit before REMOVE_DONE began; a move that begins after cannot take a row
# this transaction inserted (it is not committed) and finds the other one.
REMOVE_DONE = """
DELETE FROM jobs j
WHERE j.id = ANY($1::text[]) AND EXISTS (SELECT 1 FROM jobs_done d WHERE d.id = j.id)
RETURNING j.id
"""
REMOVE_DONE_FROM_JOBS_IN = """
DELETE FROM jobs j
WHERE j.id IN (SELECT id FROM jobs_in) AND EXISTS (SELECT 1 FROM jobs_done d WHERE d.id = j.id)
"""

# A small batch in one statement, one round trip: the insert, and the jobs
# notification sent at its commit ($6, or "" when some ids existed already:
# which of the jobs were new is not known then). $1..$5 the columns as
# arrays. If the batch is not fresh, REMOVE_DONE follows in its transaction.
INSERT_FEW = """
WITH added AS (
    INSERT INTO jobs (id, type, dt, data, create_dt)
    SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[],
                         $5::timestamptz[]) AS n(id, type, dt, data, create_dt)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT n, CASE WHEN n > 0 THEN
    pg_notify('qd_jobs', CASE WHEN n = cardinality($1::text[]) THEN $6 ELSE '' END)
END, set_config('synchronous_commit', 'off', true)
FROM (SELECT count(*) AS n FROM added) c
"""
# A fresh batch of a few jobs, those whose $6 is true stored claimed by the
# daemon ingesting it (sysid $7, lease $8 seconds, its first attempt), unless
# that sysid's lease ran out or was released (as queue.CLAIM) or their type is
# paused (a probe of paused's key a job: these batches are small) and $11 is
# false ($11: jobs the daemon runs already, stored again); the others
# waiting, notified with $9 at commit when any of them is (or "" when the
# sysid could not claim: which of them wait is not known then; none for the
# jobs of a paused type: nothing can claim them, and a resume notifies). Returns each
# row inserted, whether it was claimed, and its type's live handler version
# in the snapshot that inserted it (as queue.CLAIM). $1..$5 the columns as
# arrays, as INSERT_FEW. It commits without waiting for the WAL flush, as
# ingestion does: a crash of the server that takes the rows before the
# ingester's flush makes the ingester insert them again, those the daemon
# still runs claimed by it again (docs/guarantees.md). With $10 (an add stored
# early, before its journal write is durable: engine.ingest.early) a lapsed
# sysid stores nothing, so that no other daemon can take a job of an add that
# may yet be refused. If the batch is not fresh, REMOVE_DONE follows in its
# transaction.
# The statement is the function insert_dispatched (migration 0016), planned
# once per connection.
INSERT_DISPATCHED = """
SELECT id, claimed, handler
FROM insert_dispatched($1::text[], $2::text[], $3::timestamptz[], $4::text[],
                       $5::timestamptz[], $6::bool[], $7, $8, $9, $10, $11)
"""

# The jobs of an add refused after they were stored early (engine.ingest.early),
# claimed by the daemon $2 and never started (or waiting, when its sysid had
# lapsed); a synchronous commit.
REMOVE_REFUSED = """
DELETE FROM jobs WHERE id = ANY($1::text[]) AND lock IN ('', $2)
"""

# REMOVE_DONE_FROM_JOBS_IN follows in its transaction.
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
