"""Who a handler process runs as: a uid of its tenant's own when the daemon is root,
or the configured run-as user (created as a system user when missing)."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import subprocess
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from queue_daemon.runners.errors import SandboxError

logger = logging.getLogger(__name__)

DEFAULT_USER = "queue-runner"
FALLBACK_USER = "nobody"


@dataclass(frozen=True, slots=True)
class RunAs:
    name: str
    uid: int
    gid: int


# When the daemon runs as root and no run-as user is configured, each tenant's
# handlers run under a uid (and gid) of their own, derived from the client
# name: one tenant cannot signal, ptrace or read the files of another's
# processes, and RLIMIT_NPROC (counted per uid) caps each tenant separately,
# so one tenant's fork bomb cannot stop another's contexts from starting.
# No passwd entry is needed for these ids.
TENANT_UID_BASE = 2_000_000
TENANT_UID_SPAN = 1 << 20


def tenant_ids(client: str) -> RunAs:
    """A tenant's ids derived from its name: the runners' own default when no
    registry is given (the daemon always gives one: ``TenantUids``). Two names
    can share a uid this way."""
    uid = TENANT_UID_BASE + zlib.crc32(client.encode()) % TENANT_UID_SPAN
    return RunAs(f"tenant:{client}", uid, uid)


class NoUidYet(SandboxError):
    """The tenant's slot has not reached this daemon yet: its jobs wait."""


class TenantUids:
    """Each tenant's uid from a registry of slots (unique, never reused: the
    store's ``tenant_uids``), placed in the range ``tenant_uid_base`` .. ``tenant_uid_base +
    tenant_uid_count``; a uid that is a user of this host (it has a passwd entry) is never
    used, since that user's files and processes would be the tenant's."""

    def __init__(
        self,
        slots: Callable[[], Mapping[str, int]],
        tenant_uid_base: int = TENANT_UID_BASE,
        tenant_uid_count: int = TENANT_UID_SPAN,
    ) -> None:
        self._slots = slots
        self.tenant_uid_base = tenant_uid_base
        self.tenant_uid_count = tenant_uid_count
        self._taken: dict[int, str | None] = {}  # uid -> the host user it is, checked once

    def of(self, client: str) -> RunAs:
        """``client``'s ids; SandboxError (its jobs fail, saying why) when it has
        none yet, its slot is past the range, or its uid is a user of this host."""
        slot = self._slots().get(client)
        if slot is None:
            raise NoUidYet(f"tenant {client!r} has no uid here yet")
        if not 0 <= slot < self.tenant_uid_count:
            raise SandboxError(
                f"tenant {client!r} has uid slot {slot}, past the {self.tenant_uid_count} of"
                " --tenant-uid-count"
            )
        uid = self.tenant_uid_base + slot
        if uid not in self._taken:
            self._taken[uid] = host_owner(uid)
        owner = self._taken[uid]
        if owner is not None:
            raise SandboxError(
                f"uid {uid} of tenant {client!r} is {owner} of this host: its handlers do"
                " not run (move the range with --tenant-uid-base)"
            )
        return RunAs(f"tenant:{client}", uid, uid)


def host_owner(uid: int) -> str | None:
    """Who on this host has ``uid`` (as a user, as a group, since a tenant's gid is
    its uid, or in a subordinate id range of /etc/subuid or /etc/subgid), or None."""
    try:
        return f"the user {pwd.getpwuid(uid).pw_name!r}"
    except KeyError:
        pass
    try:
        return f"the group {grp.getgrgid(uid).gr_name!r}"
    except KeyError:
        pass
    for table in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(table).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, rest = line.partition(":")
            first, _, count = rest.partition(":")
            if first.isdigit() and count.isdigit() and int(first) <= uid < int(first) + int(count):
                return f"a subordinate id of {name!r} ({table})"
    return None


def resolve_run_as(run_as: str | None) -> RunAs | None:
    """The user handlers run as: None unless the daemon is root.

    ``run_as`` None means ``queue-runner``, created as a system user when it is
    missing, else ``nobody``. Blocking (may run ``useradd``).
    """
    if os.geteuid() != 0:
        if run_as is not None:
            logger.info(
                "not root: handlers run as the daemon's own user, run_as %r ignored",
                run_as,
                extra={"action": "run_as_ignored"},
            )
        return None
    name = run_as or DEFAULT_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if run_as is not None:
            raise SandboxError(f"run-as user {run_as!r} does not exist") from None
        entry = _create_user(name)
    if entry.pw_uid == 0:
        raise SandboxError(f"run-as user {name!r} is root: handlers must not run as root")
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _create_user(name: str) -> pwd.struct_passwd:
    command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        entry = pwd.getpwnam(name)
        logger.info("created system user %s for handlers", name, extra={"action": "user_created"})
        return entry
    except (OSError, subprocess.SubprocessError, KeyError) as exc:
        logger.warning(
            "cannot create user %s (%s): handlers run as %s",
            name,
            exc,
            FALLBACK_USER,
            extra={"action": "user_fallback"},
        )
    try:
        return pwd.getpwnam(FALLBACK_USER)
    except KeyError:
        raise SandboxError(f"neither {name!r} nor {FALLBACK_USER!r} exists") from None
