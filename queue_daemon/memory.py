"""Giving memory back to the system after a burst, and keeping the cyclic
collector off what start-up built (``settle_heap``).

CPython frees big objects (a context's reply, a chunk of follow-on jobs, an
ingested journal batch) to the C allocator, which keeps the pages for the
next allocation rather than returning them: a daemon that once held a few
hundred MiB for a burst keeps them resident. Every ``interval`` seconds the
daemon asks glibc to return its free pages (``malloc_trim``), in a thread,
when its resident memory changed since the last time. Elsewhere (musl, macOS)
this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

TRIM_INTERVAL = 5.0
_STATM = Path("/proc/self/statm")


def _trimmer() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


def resident_pages() -> int:
    try:
        return int(_STATM.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


async def give_back(interval: float = TRIM_INTERVAL) -> None:
    """Forever: return free heap pages to the system when resident memory changed."""
    trim = _trimmer()
    if trim is None:
        logger.debug("no malloc_trim here", extra={"action": "memory_trim"})
        return
    after = 0  # resident pages after the last trim
    while True:
        await asyncio.sleep(interval)
        if await asyncio.to_thread(resident_pages) != after:  # something was used or freed
            await asyncio.to_thread(trim)
            after = await asyncio.to_thread(resident_pages)


# new live objects between collections of the young generation (Python 3.11's default: 700);
# about 0.5 us of the daemon's CPU a no-op job less (measured end to end)
GC_YOUNG = 20_000


def settle_heap() -> None:
    """Take what start-up built (modules, pools, routes: ~45k objects) out of the cyclic
    collector's sight. A full collection walks every tracked object and runs on the event
    loop: 20-30 ms on two slow cores with them, a stall that every add, claim and ack
    waiting at that moment pays. Frozen, a full collection walks only what the daemon
    made since; objects frozen here are still freed by reference counting. The young
    generation is collected once ``GC_YOUNG`` more objects live than at the last
    collection, rather than 700: a batch of 1,000 jobs keeps thousands alive at once
    (its jobs, inputs, results, releases), which a collection every 700 walked again
    and again, freeing nothing (reference counting frees them)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])
