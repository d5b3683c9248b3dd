"""Periodic jobs (``ScheduleStore``): a tenant's schedules, and the due ticks that
daemons take, add and record (migration 0009)."""

from __future__ import annotations

SCHEDULE_COLUMNS = """client, name, type, cron, tz, payload, version, created_at, next_fire,
last_tick, last_job"""

# one tenant's schedule writes at a time: its count is checked, then a row added
LOCK_CLIENT_SCHEDULES = "SELECT pg_advisory_xact_lock(hashtext('qd_schedules:' || $1))"

COUNT_SCHEDULES = "SELECT count(*) FROM schedules WHERE client = $1"

SCHEDULE_EXISTS = "SELECT EXISTS (SELECT 1 FROM schedules WHERE client = $1 AND name = $2)"

# $1 client, $2 name, $3 type, $4 cron, $5 tz, $6 payload, $7 version, $8 next_fire.
# Replacing a schedule drops a hold on it: the old version's tick is not recorded.
PUT_SCHEDULE = f"""
INSERT INTO schedules (client, name, type, cron, tz, payload, version, next_fire, due_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)
ON CONFLICT (client, name) DO UPDATE SET
    type = EXCLUDED.type, cron = EXCLUDED.cron, tz = EXCLUDED.tz,
    payload = EXCLUDED.payload, version = EXCLUDED.version, created_at = now(),
    next_fire = EXCLUDED.next_fire, due_at = EXCLUDED.due_at,
    firing_by = NULL, firing_at = NULL
RETURNING {SCHEDULE_COLUMNS}
"""

LIST_SCHEDULES = f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE client = $1 ORDER BY name"

DELETE_SCHEDULE = "DELETE FROM schedules WHERE client = $1 AND name = $2 RETURNING name"

# Take up to $1 due schedules for $2 (a sysid) for $3 seconds: rows another
# daemon holds are skipped until their hold ends. firing_at is kept from an
# earlier hold (it fixes the tick), else set to the database clock now.
# ``revoked``: its tenant was revoked (its ticks are held back, not added).
CLAIM_DUE = """
WITH due AS (
    SELECT client, name FROM schedules
    WHERE due_at <= now()
    ORDER BY due_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE schedules s
SET due_at = now() + make_interval(secs => $3), firing_by = $2,
    firing_at = coalesce(s.firing_at, now())
FROM due
WHERE s.client = due.client AND s.name = due.name
RETURNING s.client, s.name, s.type, s.cron, s.tz, s.payload, s.version, s.next_fire,
          s.firing_at, now() AS now,
          EXISTS (SELECT 1 FROM tenants t
                  WHERE t.client = s.client AND t.revoked_at IS NOT NULL) AS revoked
"""

# Seconds from the database clock's now until the soonest due_at (NULL: none).
NEXT_DUE = "SELECT extract(epoch FROM min(due_at) - now())::float8 FROM schedules"

# The ticks added by $7 (a sysid): each row's next tick, its hold dropped.
# A row replaced, deleted or taken over meanwhile is left alone.
RECORD_TICKS = """
UPDATE schedules s
SET next_fire = v.next_fire, due_at = v.next_fire, last_tick = v.tick, last_job = v.job,
    firing_by = NULL, firing_at = NULL
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::timestamptz[],
            $6::text[]) AS v(client, name, version, tick, next_fire, job)
WHERE s.client = v.client AND s.name = v.name AND s.version = v.version
  AND s.firing_by = $7
"""

# Ticks $4 (a sysid) could not add now: held by nobody again in $5 seconds,
# keeping firing_at, so the same tick is added then (by any daemon).
DEFER_TICKS = """
UPDATE schedules s
SET due_at = now() + make_interval(secs => $5)
FROM unnest($1::text[], $2::text[], $3::text[]) AS v(client, name, version)
WHERE s.client = v.client AND s.name = v.name AND s.version = v.version
  AND s.firing_by = $4
"""
