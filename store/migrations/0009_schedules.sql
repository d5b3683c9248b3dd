-- 0009: periodic jobs. A schedule is a tenant's cron expression (in a time
-- zone) that adds one job of a type with a fixed payload at each tick.
--
-- next_fire is the next tick not yet added. due_at is when any daemon should
-- look at the row next: next_fire, or while a daemon holds the row to add its
-- tick (firing_by), the end of that hold, after which another daemon takes
-- it over. firing_at (the database clock when the first daemon took the row)
-- fixes which tick is added: the latest at or before it, so a daemon that
-- takes over adds the same tick, with the same job id, and ingestion (by id)
-- keeps one job. version changes when the schedule is replaced: the ids of
-- its ticks change with it.

CREATE TABLE schedules (
    client     text        NOT NULL,
    name       text        NOT NULL,
    type       text        NOT NULL,  -- the tenant's type name, without the client
    cron       text        NOT NULL,
    tz         text        NOT NULL,
    payload    text        NOT NULL,
    version    text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    next_fire  timestamptz NOT NULL,
    due_at     timestamptz NOT NULL,
    firing_by  text,
    firing_at  timestamptz,
    last_tick  timestamptz,
    last_job   text,
    PRIMARY KEY (client, name)
);

CREATE INDEX schedules_due_idx ON schedules (due_at);
