-- 0004: several tokens per tenant (rotation with a grace period), and a
-- per-store secret for keyed token hashes.
--
-- `tenants` stays the registry of tenants (created_at, revoked_at); their
-- tokens move to `tenant_tokens`. A token is live while its tenant is active
-- and its expires_at is NULL or in the future (the database clock decides).
-- An active tenant has exactly one token with expires_at NULL (its current
-- one) and, after a rotation, at most one more: the previous token, live
-- until the end of its grace period. Revoking a tenant expires all its tokens.
--
-- `scheme` says how token_hash was computed: 'hmac' is HMAC-SHA256 keyed with
-- secrets.token_hmac_key; 'sha256' is the plain SHA-256 digest every token
-- created before this migration was stored as. Those keep working: the
-- daemon's lookup tries both digests of a token it does not know.

-- Nobody adds, rotates or revokes a tenant while its token moves.
LOCK TABLE tenants IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE secrets (
    name       text PRIMARY KEY,
    value      bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- 32 bytes from the server's strong random source: gen_random_uuid() uses
-- pg_strong_random (122 random bits each); four of them (488 bits) through
-- SHA-256 give a uniformly distributed 256-bit key without needing pgcrypto.
INSERT INTO secrets (name, value)
SELECT 'token_hmac_key', sha256(convert_to(
    gen_random_uuid()::text || gen_random_uuid()::text
    || gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8'));

CREATE TABLE tenant_tokens (
    client     text NOT NULL REFERENCES tenants (client),
    token_hash bytea NOT NULL UNIQUE,
    scheme     text NOT NULL DEFAULT 'hmac' CHECK (scheme IN ('sha256', 'hmac')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz
);

CREATE INDEX tenant_tokens_client_idx ON tenant_tokens (client, created_at DESC);

INSERT INTO tenant_tokens (client, token_hash, scheme, created_at, expires_at)
SELECT client, token_hash, 'sha256', created_at, revoked_at FROM tenants;

ALTER TABLE tenants DROP COLUMN token_hash;
