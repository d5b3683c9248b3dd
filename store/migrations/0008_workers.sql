-- 0008: pull workers. A job of a pulled type (its handler's lang is
-- 'worker') is claimed by a tenant's own process over HTTP: its lock is then
-- 'w:<32 hex claim token>:<worker name>' instead of a daemon's sysid, and
-- its dt the end of the claim's lease, so a lapsed claim expires like a
-- daemon's (0001's jobs_running_idx). The registry below is kept from every
-- claim, renew and complete: the worker's last contact, the lease it holds
-- jobs under (it is live while last_seen + lease is ahead) and its completes
-- per code. Rows not seen for a day are deleted by the purge.

CREATE TABLE workers (
    client      text COLLATE "C" NOT NULL,
    name        text COLLATE "C" NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    lease       float8 NOT NULL DEFAULT 60,
    done_ok     bigint NOT NULL DEFAULT 0,
    done_failed bigint NOT NULL DEFAULT 0,
    done_error  bigint NOT NULL DEFAULT 0,
    done_retry  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (client, name)
);

CREATE INDEX workers_last_seen_idx ON workers (last_seen);
