"""The durable local append-only journal: every accepted job is written here first."""

from queue_daemon.journal.check import CheckProblem, CheckReport, SegmentSummary, check
from queue_daemon.journal.errors import JournalError, JournalInUse, JournalUnavailable
from queue_daemon.journal.journal import Journal
from queue_daemon.journal.models import Entry, JournalLag, Reservation

__all__ = [
    "CheckProblem",
    "CheckReport",
    "Entry",
    "Journal",
    "JournalError",
    "JournalInUse",
    "JournalLag",
    "JournalUnavailable",
    "Reservation",
    "SegmentSummary",
    "check",
]
