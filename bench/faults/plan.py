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

    def describe(self) -> str:
        return f"round {self.number}: {self.daemons} daemons, " + ", ".join(map(str, self.faults))


def plan_round(seed: int, number: int) -> RoundPlan:
    """The plan of round ``number`` (1-based): the same for the same seed, whatever
    rounds ran before it, so one round can be run again on its own."""
    rng = random.Random(f"queue-daemon-faults/{seed}/{number}")
    daemons = rng.choice((2, 3))
    kinds = rng.sample(KINDS, rng.randint(1, MAX_FAULTS))
    faults = []
    for kind in kinds:
        victim = rng.randrange(daemons)
        hold = rng.uniform(0.5, 2.5)  # a stop lasts the lease plus this
        faults.append(Fault(kind=kind, victim=victim, hold=hold, where=rng.random()))
    return RoundPlan(number=number, daemons=daemons, faults=tuple(faults))
