-- 0007: each tenant's slot in the range of uids its handlers run under.
--
-- A uid derived from a hash of the client name let two tenants collide (by
-- chance, or by a name chosen to): the second then ran as the first. Slots
-- come from a sequence, so no two tenants ever share one, and a slot is never
-- given to another tenant (a revoked tenant keeps its row, and its slot). The
-- daemon maps a slot into its configured range (--tenant-uid-base, -count).

LOCK TABLE tenants IN SHARE ROW EXCLUSIVE MODE;

CREATE SEQUENCE tenant_uid_slots MINVALUE 0 START 0;

ALTER TABLE tenants ADD COLUMN uid_slot integer UNIQUE;

UPDATE tenants AS t SET uid_slot = s.slot
FROM (
    SELECT client, nextval('tenant_uid_slots') AS slot
    FROM (SELECT client FROM tenants ORDER BY created_at, client) AS oldest_first
) AS s
WHERE t.client = s.client;

ALTER TABLE tenants ALTER COLUMN uid_slot SET DEFAULT nextval('tenant_uid_slots');
ALTER TABLE tenants ALTER COLUMN uid_slot SET NOT NULL;
