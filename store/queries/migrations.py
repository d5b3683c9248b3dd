"""The schema_migrations table and the per-connection setup."""

from __future__ import annotations

MIGRATION_LOCK = "SELECT pg_advisory_lock($1)"
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock($1)"
MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    int PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
MIGRATIONS_APPLIED = "SELECT version FROM schema_migrations ORDER BY version"
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
MIGRATION_RECORD = "INSERT INTO schema_migrations (version) VALUES ($1)"


# One per session; rows vanish at each commit, so it is always empty between calls.
CREATE_JOBS_IN = """
CREATE TEMP TABLE IF NOT EXISTS jobs_in (
    id        text,
    type      text,
    dt        timestamptz,
    data      text,
    create_dt timestamptz
) ON COMMIT DELETE ROWS
"""
JOBS_IN_TABLE = "jobs_in"
JOB_COPY_COLUMNS = ("id", "type", "dt", "data", "create_dt")

PING = "SELECT 1"
