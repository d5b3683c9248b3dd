-- 0001: jobs, handlers, tenants, sysids.
--
-- A job's state lives in `lock`: '' waiting, '__done' done (archived, with
-- dt = done_dt + 1000 years), anything else the sysid of the daemon running it.
-- `type` is "client-type"; the client never contains '-', so
-- split_part(type, '-', 1) is the tenant.

CREATE TABLE jobs (
    id        text COLLATE "C" PRIMARY KEY,
    type      text COLLATE "C" NOT NULL,
    dt        timestamptz NOT NULL,
    lock      text COLLATE "C" NOT NULL DEFAULT '',
    data      text NOT NULL,
    create_dt timestamptz NOT NULL,
    done_dt   timestamptz,
    attempts  int NOT NULL DEFAULT 0,
    code      text,
    exitcode  int,
    result    text
);

-- The claim path: eligible jobs of one type, oldest dt first. Done and running
-- jobs are not in this index, so its size is the number of waiting jobs.
CREATE INDEX jobs_waiting_idx ON jobs (type, dt) WHERE lock = '';

-- Expiry of running locks: only running jobs are in it.
CREATE INDEX jobs_running_idx ON jobs (dt) WHERE lock <> '' AND lock <> '__done';

-- Tenant-scoped listing, newest first, and per-tenant stats. An expression
-- index rather than a stored `client` column: the heap row stays as it is
-- (COPY writes no extra column) and the index gives the same ordered scan.
CREATE INDEX jobs_client_created_idx
    ON jobs (split_part(type, '-', 1), create_dt DESC, id DESC);

CREATE TABLE handlers (
    id   text PRIMARY KEY,
    type text NOT NULL,
    dt   timestamptz NOT NULL DEFAULT now(),
    data jsonb NOT NULL
);

CREATE INDEX handlers_type_dt_idx ON handlers (type, dt DESC);

CREATE TABLE tenants (
    client     text PRIMARY KEY,
    token_hash bytea NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE TABLE sysids (
    sysid       text PRIMARY KEY,
    holder      text,
    host        text,
    data_dir    text,
    expires     timestamptz,
    released_at timestamptz
);

CREATE SEQUENCE sysid_seq;
