"""Upkeep: the store's periodic services, one a module (renew, expire,
deadlines, counts, unhandled, purge), started by one supervisor."""
