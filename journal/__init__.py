"""The durable local append-only journal: every accepted job is written here first."""

from journal.check import CheckProblem, CheckReport, SegmentSummary, check
from journal.errors import JournalError, JournalUnavailable
from journal.journal import Journal
from journal.models import Entry, JournalLag, Reservation

__all__ = [
    "CheckProblem",
    "CheckReport",
    "Entry",
    "Journal",
    "JournalError",
    "JournalLag",
    "JournalUnavailable",
    "Reservation",
    "SegmentSummary",
    "check",
]
