"""In-memory stand-ins for unit tests of decisions (beside, never instead of, the
real-PostgreSQL tests)."""
