"""Tenants, their tokens and limit overrides, and operator tokens."""

from __future__ import annotations

# A token is live while its tenant is active and expires_at is NULL or in the
# future, by the database clock (0004_tenant_tokens.sql).
_LIVE = "(tt.expires_at IS NULL OR tt.expires_at > now())"

# $1 client. Takes the tenant's row lock, so adds, rotations and revokes of one
# tenant run one after the other.
LOCK_TENANT = "SELECT client, revoked_at FROM tenants WHERE client = $1 FOR UPDATE"

# $1 client: creates the tenant or re-activates a revoked one; NULL if active.
ADD_TENANT = """
INSERT INTO tenants AS t (client) VALUES ($1)
ON CONFLICT (client) DO UPDATE
    SET created_at = now(), revoked_at = NULL
    WHERE t.revoked_at IS NOT NULL
RETURNING client
"""

# $1 client: a new tenant's uid slot (a re-activated one keeps its own).
ADD_UID_SLOT = "INSERT INTO tenant_uids (client) VALUES ($1) ON CONFLICT (client) DO NOTHING"

# $1 client: a re-activated tenant starts without its revoked tokens.
DELETE_TENANT_TOKENS = "DELETE FROM tenant_tokens WHERE client = $1"

# $1 client, $2 token hash (HMAC); the current token has no expiry.
INSERT_TENANT_TOKEN = "INSERT INTO tenant_tokens (client, token_hash) VALUES ($1, $2)"

# $1 client, $2 grace seconds. Only the newest previous token stays live: older
# ones (expired, or still in a former grace) go; the current token (expires_at
# NULL) expires at now() + grace. Then INSERT_TENANT_TOKEN adds the new one.
ROTATE_DROP_OLD = """
DELETE FROM tenant_tokens WHERE client = $1 AND expires_at IS NOT NULL
"""
ROTATE_EXPIRE_CURRENT = """
UPDATE tenant_tokens SET expires_at = now() + make_interval(secs => $2)
WHERE client = $1 AND expires_at IS NULL
"""

LIST_TENANTS = f"""
SELECT t.client, t.created_at, t.revoked_at, t.limits::text AS limits,
       coalesce(newest.token_hash, ''::bytea) AS token_hash,
       coalesce(live.n, 0) AS live_tokens,
       live.grace_until
FROM tenants t
LEFT JOIN LATERAL (
    SELECT tt.token_hash FROM tenant_tokens tt
    WHERE tt.client = t.client ORDER BY tt.created_at DESC LIMIT 1
) newest ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS n, min(tt.expires_at) AS grace_until FROM tenant_tokens tt
    WHERE tt.client = t.client AND t.revoked_at IS NULL AND {_LIVE}
) live ON true
ORDER BY t.client
"""

# $1 client: revoking ends every token at once.
REVOKE_TENANT = f"""
WITH t AS (
    UPDATE tenants SET revoked_at = now()
    WHERE client = $1 AND revoked_at IS NULL
    RETURNING client
), expired AS (
    UPDATE tenant_tokens tt SET expires_at = now()
    FROM t WHERE tt.client = t.client AND {_LIVE}
)
SELECT client FROM t
"""

TENANT_TOKENS = f"""
SELECT tt.token_hash, tt.client FROM tenant_tokens tt
JOIN tenants t ON t.client = tt.client
WHERE t.revoked_at IS NULL AND {_LIVE}
"""

TOKEN_KEY = "SELECT value FROM secrets WHERE name = 'token_hmac_key'"

# Every client's uid slot (0007_tenant_uids.sql): a slot is never another's.
TENANT_UID_SLOTS = "SELECT client, slot FROM tenant_uids"

# $1 client: its slot, given now if it has none (a gap in the sequence when two
# daemons race for it is harmless).
ENSURE_UID_SLOT = """
WITH given AS (
    INSERT INTO tenant_uids (client) VALUES ($1)
    ON CONFLICT (client) DO NOTHING
    RETURNING slot
)
SELECT slot FROM given
UNION ALL
SELECT slot FROM tenant_uids WHERE client = $1
LIMIT 1
"""

# Overrides of the daemon-wide limits for every active tenant that has any
# (0005_limits_admin.sql).
TENANT_LIMITS = """
SELECT client, limits::text AS limits FROM tenants
WHERE revoked_at IS NULL AND limits <> '{}'::jsonb
"""

# $1 client, $2 the new overrides (a JSON object, text): replaces them all.
SET_TENANT_LIMITS = """
UPDATE tenants SET limits = $2::jsonb
WHERE client = $1 AND revoked_at IS NULL
RETURNING limits::text AS limits
"""

GET_TENANT_LIMITS = """
SELECT limits::text AS limits FROM tenants WHERE client = $1 AND revoked_at IS NULL
"""

# $1 token hash: the new current operator token (no expiry).
INSERT_ADMIN_TOKEN = "INSERT INTO admin_tokens (token_hash) VALUES ($1)"

# $1 grace seconds. Older previous tokens go; the current one expires after
# the grace; then INSERT_ADMIN_TOKEN adds the new one. Serialised by a lock.
LOCK_ADMIN_TOKENS = "LOCK TABLE admin_tokens IN SHARE ROW EXCLUSIVE MODE"
ADMIN_DROP_OLD = "DELETE FROM admin_tokens WHERE expires_at IS NOT NULL"
ADMIN_EXPIRE_CURRENT = """
UPDATE admin_tokens SET expires_at = now() + make_interval(secs => $1)
WHERE expires_at IS NULL
"""
REVOKE_ADMIN_TOKENS = "DELETE FROM admin_tokens"

ADMIN_TOKENS = """
SELECT token_hash FROM admin_tokens WHERE expires_at IS NULL OR expires_at > now()
"""
