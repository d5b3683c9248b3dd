-- 0005: per-tenant limits and operator (admin) tokens.
--
-- `tenants.limits` holds a tenant's overrides of the daemon-wide defaults, as
-- a JSON object with any of the keys running, waiting, rate, burst, payload,
-- result, handlers (numbers; 0 means no limit where that makes sense). A key
-- that is absent falls back to the daemon's flag. The daemon reads the
-- overrides with the token cache, so a change reaches every daemon within
-- its refresh interval.
--
-- `admin_tokens` are operator credentials: they pass every tenant's routes
-- and the operator routes (/admin/...). Like tenant tokens they are stored
-- as HMAC-SHA256 digests keyed with secrets.token_hmac_key; a token is live
-- while expires_at is NULL or in the future (database clock). `admin token`
-- keeps the previous token for a grace period, as tenant rotation does.

ALTER TABLE tenants ADD COLUMN limits jsonb NOT NULL DEFAULT '{}'::jsonb
    CHECK (jsonb_typeof(limits) = 'object');

CREATE TABLE admin_tokens (
    token_hash bytea PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz
);
