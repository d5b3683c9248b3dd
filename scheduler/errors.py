"""The scheduler's exceptions."""


class SchedulerError(ValueError):
    """Base of every error the scheduler raises: a caller passed an impossible value."""
