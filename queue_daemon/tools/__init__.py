"""Offline tools over queue logfiles (``queue-daemon stats``): analytics and the HTML report.

Only the CLI imports this package; the daemon never does.
"""
