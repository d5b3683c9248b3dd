"""Admitting jobs: quotas and limits, ids, and the intake into the journal."""
