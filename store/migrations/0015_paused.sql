-- 0015: paused types and tenants. A row names a stored type ('client-type'),
-- paused by its tenant, or a whole tenant ('client': tenant names have no
-- '-'), paused by the operator. Their jobs keep waiting: the claims (a
-- daemon's and a pull worker's), the claim at add, the list of types a daemon
-- runs and the expiry of types nobody runs skip a type while its row or its
-- tenant's is here (store.queries.queue.NOT_PAUSED: one probe of this
-- primary key a statement, not a job). Resuming deletes the row.
CREATE TABLE paused (
    name text COLLATE "C" PRIMARY KEY,
    at   timestamptz NOT NULL DEFAULT now()
);
