"""Progress (migration 0019): written only while its holder holds the job, kept
when the job is done, cleared by a rerun."""

from __future__ import annotations

from queue_daemon.domain.jobs import Progress, Release, ReleaseHow
from tests.contract.conftest import Rig, new

LOCK = "w:" + "0" * 32 + ":w1"


async def test_progress_is_written_for_the_holder_and_kept_when_done(rig: Rig) -> None:
    s = rig.store
    await s.add_jobs([new("a"), new("b"), new("w")])
    await s.claim("a-t", 1, sysid="1", lease=30)  # a (the oldest... or b: the same dt)
    held = "a" if (await rig.row("a")).lock == "1" else "b"  # type: ignore[union-attr]
    await s.claim_pulled("a-t", 1, lock=LOCK, lease=30, client="a", worker="w1")
    pulled = "b" if held == "a" else "a"
    notes = [
        Progress(held, "1", 0.25, "a quarter"),
        Progress(pulled, LOCK, 0.5, "half"),
        Progress("w", "1", 0.9, "not held"),  # waiting: nobody holds it
        Progress(held, "2", 1.0, "another daemon's"),
    ]
    assert await s.note_progress(notes) == {held, pulled}
    assert await s.note_progress([]) == set()
    job = await s.get_job("a", held)
    assert job.progress is not None
    assert (job.progress["fraction"], job.progress["message"]) == (0.25, "a quarter")
    assert str(job.progress["at"]).endswith("Z")
    assert (await s.get_job("a", "w")).progress is None
    release = Release(id=held, how=ReleaseHow.ARCHIVE, code="ok", exitcode=200, result="r")
    assert await s.release([release], sysid="1") == {held}
    done = await s.get_job("a", held)
    assert done.progress is not None and done.progress["message"] == "a quarter"
    assert (await s.rerun_job("a", held)).progress is None
    assert (await s.get_job("a", pulled)).progress == {
        "fraction": 0.5,
        "message": "half",
        "at": (await s.get_job("a", pulled)).progress["at"],  # type: ignore[index]
    }
