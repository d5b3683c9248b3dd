"""The stored jobtype splits at its first ``-`` and round-trips; timestamps keep one width."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from queue_daemon.domain.names import JobType, iso


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


def test_every_timestamp_has_the_same_width_so_strings_sort_in_time_order() -> None:
    whole = datetime(2026, 11, 25, 1, 38, 25, tzinfo=UTC)
    later = whole + timedelta(milliseconds=4)
    assert iso(whole) == "2026-11-25T01:38:25.000000Z"
    assert iso(later) == "2026-11-25T01:38:25.004000Z"
    assert str(iso(later)) > str(iso(whole))
    assert iso(None) is None
