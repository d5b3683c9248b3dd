"""Upkeep: renewing, expiring and purging, each a service started by one supervisor."""
