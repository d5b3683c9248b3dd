"""The job store: schema, migrations and every SQL statement (PostgreSQL via asyncpg)."""
