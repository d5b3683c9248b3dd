-- 0002: the claim path's remaining indexes, and handler versions.
--
-- Claiming and waiting_jobtypes use 0001's jobs_waiting_idx (type, dt)
-- WHERE lock = '' (checked with EXPLAIN in tests/integration/test_store_claim.py);
-- expiry of leases uses 0001's jobs_running_idx (dt) over running jobs only.

-- Purge of archived jobs by age: only done jobs are in it.
CREATE INDEX jobs_done_idx ON jobs (done_dt) WHERE lock = '__done';

-- Handlers keep every version for audit. Deleting a handler stamps every
-- live version of its type with deleted_at; a later add starts a new live one.
ALTER TABLE handlers ADD COLUMN deleted_at timestamptz;

-- The newest live version of a type, and the live types of a client.
CREATE INDEX handlers_live_idx ON handlers (type, dt DESC, id DESC) WHERE deleted_at IS NULL;
CREATE INDEX handlers_live_client_idx
    ON handlers (split_part(type, '-', 1), type) WHERE deleted_at IS NULL;
