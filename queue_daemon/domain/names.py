"""The names docs/api.md fixes: clients, jobtypes and sysids, the stored jobtype, and timestamps."""

from __future__ import annotations

import re
from datetime import datetime
from typing import NamedTuple

CLIENT_RE = re.compile(r"[a-z0-9_]{1,40}")
TYPE_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,100}")
SYSID_RE = re.compile(r"[a-z0-9_]{1,32}")


def iso(value: datetime | None) -> str | None:
    """A timestamp as every reply writes it: UTC, microseconds always, `Z`.

    Fixed width, so two of them compare as strings in time order.
    """
    return (
        None if value is None else value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


def valid_client(name: str) -> bool:
    return CLIENT_RE.fullmatch(name) is not None


def valid_type(name: str) -> bool:
    return TYPE_RE.fullmatch(name) is not None


def valid_sysid(name: str) -> bool:
    return SYSID_RE.fullmatch(name) is not None


class JobType(NamedTuple):
    """A tenant's jobtype: ``client`` and ``name``, stored as ``client-name``.

    Clients never contain ``-``, so the stored form splits at its first ``-``;
    this is the one place that builds or splits it. A named tuple: it unpacks
    as ``client, name = jobtype``.
    """

    client: str
    name: str

    @classmethod
    def parse(cls, stored: str) -> JobType:
        """The jobtype of a stored ``client-name`` string."""
        client, _, name = stored.partition("-")
        return cls(client, name)

    @staticmethod
    def client_of(stored: str) -> str:
        """The client of a stored ``client-name`` string, without building a
        ``JobType``: for loops over every waiting type (the scheduler's picks)."""
        return stored.partition("-")[0]

    @property
    def stored(self) -> str:
        return f"{self.client}-{self.name}"

    def __str__(self) -> str:
        return self.stored
