"""The journal's exceptions."""


class JournalError(Exception):
    """Base of every error the journal raises."""


class JournalInUse(JournalError):
    """Another live process holds the journal's lock."""


class JournalUnavailable(JournalError):
    """The journal cannot take writes: closed, disk full, I/O error or a failed fsync."""
