"""Which faults a round injects: a pure function of the campaign's seed and the round."""

from __future__ import annotations

import random
from dataclasses import dataclass

KILL_DAEMON_ADDS = "kill-daemon-adds"
KILL_DAEMON_RUNS = "kill-daemon-runs"
KILL_CONTEXT = "kill-context"
STOP_DAEMON = "stop-daemon"
PG_STOP_FAST = "pg-stop-fast"
PG_STOP_IMMEDIATE = "pg-stop-immediate"
PG_TERMINATE = "pg-terminate-backends"
JOURNAL_FULL = "journal-full"
JOURNAL_TRUNCATE = "journal-truncate"
JOURNAL_FLIP = "journal-flip"
FAILOVER = "failover"

KINDS = (
    KILL_DAEMON_ADDS,
    KILL_DAEMON_RUNS,
    KILL_CONTEXT,
    STOP_DAEMON,
    PG_STOP_FAST,
    PG_STOP_IMMEDIATE,
    PG_TERMINATE,
    JOURNAL_FULL,
    JOURNAL_TRUNCATE,
    JOURNAL_FLIP,
    FAILOVER,
)
MAX_FAULTS = 3


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    victim: int  # index of the daemon it strikes (unused by store-wide faults)
    hold: float  # seconds the fault lasts before it is healed
    where: float  # in [0, 1): which byte a journal fault damages, within its range

    def __str__(self) -> str:
        return f"{self.kind}(daemon{self.victim}, {self.hold:.1f}s)"


@dataclass(frozen=True, slots=True)
class RoundPlan:
    number: int
    daemons: int
    faults: tuple[Fault, ...]

    @property
    def full_disk_victim(self) -> int | None:
        """The daemon whose journal lives on a small tmpfs, if a fault fills it."""
        for fault in self.faults:
            if fault.kind == JOURNAL_FULL:
                return fault.victim
        return None

    @property
    def failover(self) -> bool:
        """Whether the round's store is a primary and a standby (``harness.pgpair``)."""
        return any(fault.kind == FAILOVER for fault in self.faults)

    def describe(self) -> str:
        return f"round {self.number}: {self.daemons} daemons, " + ", ".join(map(str, self.faults))


def plan_round(
    seed: int, number: int, kinds: tuple[str, ...] = (), daemons: int | None = None
) -> RoundPlan:
    """The plan of round ``number`` (1-based): the same for the same seed, whatever
    rounds ran before it, so one round can be run again on its own. ``kinds``:
    these faults, in this order, instead of a random choice; ``daemons``: this
    many daemons instead of two or three."""
    rng = random.Random(f"queue-daemon-faults/{seed}/{number}")
    count = rng.choice((2, 3))
    picked = rng.sample(KINDS, rng.randint(1, MAX_FAULTS))
    count, kinds = daemons or count, kinds or tuple(picked)
    faults = []
    for kind in kinds:
        victim = rng.randrange(count)
        hold = rng.uniform(0.5, 2.5)  # a stop lasts the lease plus this
        faults.append(Fault(kind=kind, victim=victim, hold=hold, where=rng.random()))
    return RoundPlan(number=number, daemons=count, faults=tuple(faults))
