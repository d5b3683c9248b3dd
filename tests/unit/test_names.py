"""The stored jobtype splits at its first ``-`` and round-trips."""

from __future__ import annotations

from queue_daemon.names import JobType


def test_stored_form_round_trips_with_dashes_in_the_name() -> None:
    jobtype = JobType("acme", "resize-big:v2")
    assert jobtype.stored == "acme-resize-big:v2"
    assert str(jobtype) == jobtype.stored
    assert JobType.parse(jobtype.stored) == jobtype


def test_parse_splits_at_the_first_dash_only() -> None:
    assert JobType.parse("a_1-b-c") == JobType("a_1", "b-c")


def test_a_jobtype_unpacks_as_client_and_name() -> None:
    client, name = JobType.parse("acme-t")
    assert (client, name) == ("acme", "t")
