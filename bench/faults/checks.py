"""The invariants a round must keep, as pure functions of what the campaign saw.

Each returns the violations it found (empty: the invariant holds), so that a
summary can count them and the unit tests can feed each one bad data.

Inputs: ``acked`` (id -> payload of every add answered 2xx), ``stored``
(id -> the job's row, for every row of the round's jobtypes: an id stored
twice appears in ``counts`` with 2), ``runs`` (the run log), and
``forgiven`` (ids that a journal fault destroyed on purpose: the batches it
cut or corrupted, which a real power loss could only have held unacknowledged).
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stored:
    """A job's row in the store."""

    id: str
    data: str
    done: bool
    code: str | None
    exitcode: int | None
    result: str | None


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a job, from the run log: ``owner`` is its daemon's part of the
    work root (``…/run/d-<id>``, one per daemon process) for a daemon-run handler
    and ``w-<name>`` for a pulled worker; ``end`` None for a run whose process was
    killed before it ended."""

    job_id: str
    owner: str
    start: float
    end: float | None


def payload(sleep: float, tag: str) -> str:
    """A job's payload: how long its handler sleeps, a unique tag, and a checksum
    of both, so that a stored payload with a flipped byte is told apart."""
    text = f"{sleep:g}/{tag}"
    return f"{text}/{zlib.crc32(text.encode()):08x}"


def payload_intact(data: str) -> bool:
    text, _, crc = data.rpartition("/")
    return bool(text) and f"{zlib.crc32(text.encode()):08x}" == crc


def result_owner(result: str | None, data: str) -> str | None:
    """Who produced a stored result ``ok <payload> <owner>``; None if it is not one."""
    prefix = f"ok {data} "
    if result is None or not result.startswith(prefix):
        return None
    return result[len(prefix) :]


def parse_run_log(text: str) -> tuple[list[Run], list[str]]:
    """The runs of a run log, and its lines that are not records (torn or foreign).

    Records: ``start ID OWNER T0`` when a run starts, ``end ID OWNER T0 T1`` when it
    ends; a start without its end is a run whose process was killed.
    """
    open_runs: dict[tuple[str, str, str], Run] = {}
    runs: list[Run] = []
    bad: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ")
        try:
            if parts[0] == "start" and len(parts) == 4:
                open_runs[(parts[1], parts[2], parts[3])] = Run(
                    parts[1], parts[2], float(parts[3]), None
                )
                continue
            if parts[0] == "end" and len(parts) == 5:
                open_runs.pop((parts[1], parts[2], parts[3]), None)
                runs.append(Run(parts[1], parts[2], float(parts[3]), float(parts[4])))
                continue
        except ValueError:
            pass
        bad.append(line)
    return runs + list(open_runs.values()), bad


def lost(
    acked: Mapping[str, str], stored: Mapping[str, Stored], forgiven: Collection[str]
) -> list[str]:
    """Acknowledged ids that are not in the store (a journal fault's own victims aside)."""
    return sorted(i for i in acked if i not in stored and i not in forgiven)


def refused_whole(status: int) -> bool:
    """Whether an add answered ``status`` accepted none of its jobs: a 4xx, or 503
    (its journal could not be written); a 500 or no answer says nothing."""
    return 400 <= status < 500 or status == 503


def stored_though_refused(refused: Collection[str], stored: Mapping[str, Stored]) -> list[str]:
    """Stored jobs whose payload was sent in an add that was refused whole."""
    return sorted(job.id for job in stored.values() if job.data in refused)


def duplicated(counts: Mapping[str, int]) -> list[str]:
    """Ids stored more than once."""
    return sorted(i for i, n in counts.items() if n > 1)


def corrupted(acked: Mapping[str, str], stored: Mapping[str, Stored]) -> list[str]:
    """Stored jobs whose payload is not what was sent: differs from the acknowledged
    one, or (for jobs whose add was not answered) fails its own checksum."""
    bad = []
    for job in stored.values():
        sent = acked.get(job.id)
        if (sent is not None and job.data != sent) or not payload_intact(job.data):
            bad.append(job.id)
    return sorted(bad)


def not_done_ok(stored: Mapping[str, Stored], ids: Iterable[str]) -> list[str]:
    """Jobs among ``ids`` (whose handlers always succeed) that did not end done OK
    with their handler's result."""
    bad = []
    for job_id in ids:
        job = stored.get(job_id)
        if job is None:
            continue  # lost() reports it
        finished_ok = job.done and job.code == "ok" and job.exitcode == 200
        if not finished_ok or result_owner(job.result, job.data) is None:
            bad.append(job_id)
    return sorted(bad)


def _by_job(runs: Iterable[Run]) -> dict[str, list[Run]]:
    by_id: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_id[run.job_id].append(run)
    for its_runs in by_id.values():
        its_runs.sort(key=lambda r: r.start)
    return by_id


def overlapping(runs: Iterable[Run]) -> list[tuple[Run, Run]]:
    """Pairs of finished runs of one job at overlapping times (one owner at a time).

    A run whose process was killed has no end and cannot be placed in time; the
    campaign checks that such processes are gone."""
    found = []
    for its_runs in _by_job(runs).values():
        ended = [r for r in its_runs if r.end is not None]
        for before, after in itertools.combinations(ended, 2):
            assert before.end is not None and after.end is not None
            if before.start < after.end and after.start < before.end:
                found.append((before, after))
    return found


def accepted_twice(records: Iterable[Mapping[str, object]]) -> list[str]:
    """Jobs whose outcome was accepted more than once, from the daemons' queue logs
    (``finished`` records that archived the job): a late release that overwrote the
    outcome of the run that took the job over shows up as a second one."""
    done: Counter[str] = Counter()
    for record in records:
        if record.get("ev") == "finished" and record.get("how") == "archive":
            done[str(record.get("id"))] += 1
    return sorted(i for i, n in done.items() if n > 1)


def stale_runs(stored: Mapping[str, Stored], runs: Iterable[Run]) -> list[Run]:
    """Runs that started after the run whose outcome the store kept had ended, by
    another owner: a daemon (or worker) that ran a job it had claimed but no longer
    held (it stalled past its lease first). Their outcome is refused; the run happens."""
    found = []
    for job_id, its_runs in _by_job(runs).items():
        job = stored.get(job_id)
        if job is None or not job.done:
            continue
        owner = result_owner(job.result, job.data)
        kept = [r for r in its_runs if r.owner == owner and r.end is not None]
        if not kept:
            continue
        kept_end = min(r.end for r in kept if r.end is not None)
        found += [r for r in its_runs if r.owner != owner and r.start > kept_end]
    return found


def reruns(runs: Iterable[Run]) -> int:
    """Runs beyond the first of each job (expected after crashes and stalls)."""
    return sum(len(its) - 1 for its in _by_job(runs).values())


def never_ran(stored: Mapping[str, Stored], runs: Iterable[Run]) -> list[str]:
    """Jobs done OK whose result names an owner with no finished run of the job in
    the log: an outcome nobody produced."""
    finished = {(r.job_id, r.owner) for r in runs if r.end is not None}
    return sorted(
        j.id
        for j in stored.values()
        if j.done and j.code == "ok" and (j.id, result_owner(j.result, j.data)) not in finished
    )


def leftover_processes(
    cgroups: Mapping[int, str], daemon_pids: Collection[int], alive: Collection[int]
) -> list[int]:
    """Processes still alive after a round: its daemons, and anything in their
    handlers' cgroups (``…/queue-daemon-<daemon pid>.<k>/…``). ``cgroups``: pid -> the
    process's cgroup path."""
    marks = tuple(f"/queue-daemon-{pid}." for pid in daemon_pids)
    left = {pid for pid in daemon_pids if pid in alive}
    left |= {pid for pid, path in cgroups.items() if any(m in path + "/" for m in marks)}
    return sorted(left)


def leftover_cgroups(names: Iterable[str], daemon_pids: Collection[int]) -> list[str]:
    """Cgroup directories of the round's daemons still present after it."""
    wanted = {f"queue-daemon-{pid}" for pid in daemon_pids}
    return sorted(n for n in names if n.split(".", 1)[0] in wanted)
