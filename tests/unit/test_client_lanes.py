"""``Lanes``: a plain function's jobs run by threads that take one after another."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from queue_daemon.client.lanes import Lanes

Done = list[tuple[int, Any, BaseException | None]]


async def _until(check: Any, what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {within} s"
        await asyncio.sleep(0.005)


async def test_every_job_runs_once_and_its_result_comes_back_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    results: Done = []
    on_loop: list[bool] = []

    def finished(done: Done) -> None:
        on_loop.append(threading.current_thread() is threading.main_thread())
        results.extend(done)

    def square(n: int) -> int:
        if n == 7:
            raise ValueError("seven")
        return n * n

    lanes: Lanes[int] = Lanes(50, square, finished, loop)
    lanes.put(list(range(5000)))
    await _until(lambda: len(results) == 5000, "5000 results")
    lanes.close()
    assert sorted(n for n, _, _ in results) == list(range(5000))
    assert all(v == n * n for n, v, e in results if n != 7)
    [(_, value, error)] = [r for r in results if r[0] == 7]
    assert value is None and isinstance(error, ValueError)
    assert all(on_loop) and len(on_loop) < 5000, "results come back in bursts, on the loop"


async def test_slow_jobs_get_as_many_lanes_as_allowed_and_no_more() -> None:
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    running, most = [0], [0]
    lock = threading.Lock()
    results: Done = []

    def slow(n: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(10)
        with lock:
            running[0] -= 1
        return n

    lanes: Lanes[int] = Lanes(4, slow, results.extend, loop)
    lanes.put(list(range(10)))
    await _until(lambda: running[0] == 4, "4 jobs running at once")
    assert lanes.take_waiting() == [4, 5, 6, 7, 8, 9], "not started: handed back on a stop"
    gate.set()
    await _until(lambda: len(results) == 4, "the 4 running jobs done")
    lanes.close()
    assert most[0] == 4 and sorted(n for n, _, _ in results) == [0, 1, 2, 3]
