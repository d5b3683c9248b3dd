"""The payload of the jobs notification (store.notes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from queue_daemon.domain.jobs import NewJob
from queue_daemon.store.notes import MAX_PAYLOAD, added_payload, parse_payload


def _job(jobtype: str, *, later: bool = False) -> NewJob:
    now = datetime.now(UTC)
    dt = now + timedelta(hours=1) if later else now
    return NewJob(id="x", type=jobtype, dt=dt, data="p", create_dt=now)


def test_due_jobs_are_counted_per_type_and_read_back() -> None:
    jobs = [_job("a-t"), _job("b-u.v:w"), _job("a-t"), _job("a-t", later=True)]
    payload = added_payload(jobs)
    assert parse_payload(payload) == {"a-t": 2, "b-u.v:w": 1}


def test_nothing_due_or_too_many_types_says_read_again() -> None:
    assert added_payload([_job("a-t", later=True)]) == ""
    assert parse_payload("") is None
    many = [_job(f"client-{'t' * 90}{i}") for i in range(100)]
    payload = added_payload(many)
    assert payload == "" and len(" ".join(f"{j.type}=1" for j in many)) > MAX_PAYLOAD


def test_a_payload_in_another_form_says_read_again() -> None:
    for payload in ("x", "a-t=", "=3", "a-t=-1", "a-t=1 b", "a-t=1e3"):
        assert parse_payload(payload) is None, payload
    assert parse_payload("a-t=1  a-t=2") == {"a-t": 3}
