-- 0007: each client's slot in the range of uids its handlers run under.
--
-- A uid derived from a hash of the client name let two tenants collide (by
-- chance, or by a name chosen to): the second then ran as the first. Slots
-- come from a sequence, so no two clients ever share one, and a row is never
-- deleted, so a slot never passes to another client. Tenants get theirs when
-- they are added; any other client (anonymous ones, under --no-auth) when its
-- first batch runs. The daemon maps a slot into its configured range
-- (--tenant-uid-base, --tenant-uid-count).

CREATE SEQUENCE tenant_uid_slots MINVALUE 0 START 0;

CREATE TABLE tenant_uids (
    client text PRIMARY KEY,
    slot   integer NOT NULL UNIQUE DEFAULT nextval('tenant_uid_slots')
);

INSERT INTO tenant_uids (client)
SELECT client FROM tenants ORDER BY created_at, client;
