"""Periodic jobs: cron expressions and the ticker that adds due ticks."""
