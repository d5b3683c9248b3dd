"""The engine: intake of jobs into the journal, ingestion into the store, the worker
that claims and runs them, their outcomes, tenant limits and quotas, ids and sysids."""
