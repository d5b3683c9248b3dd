"""A daemon started with descriptor 0, 1 or 2 closed runs on /dev/null there
(``cli.standard_descriptors``): no pipe or socket takes those numbers, and
uvloop's loop, which aborts the process when libuv closes one of them, stops
cleanly."""

from __future__ import annotations

import subprocess
import sys

import pytest

# a uvloop loop that opens and closes a pipe transport; with "fix", after the
# daemon's own first step
SCRIPT = """
import asyncio, os, sys, uvloop
if sys.argv[1:] == ["fix"]:
    from queue_daemon.cli import standard_descriptors
    standard_descriptors()
    for fd in (0, 1, 2):
        os.fstat(fd)
        assert os.get_inheritable(fd)
    print("ok", file=sys.stderr, flush=True)
async def main():
    r, w = os.pipe()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        asyncio.Protocol, os.fdopen(r, "rb", closefd=False))
    transport.close()
    await asyncio.sleep(0.01)
    os.close(w)
uvloop.run(main())
"""


def _run(closed: str, *argv: str) -> subprocess.CompletedProcess[bytes]:
    """SCRIPT with the descriptors ``closed`` (shell redirections) closed."""
    command = f'exec "$0" -c "$1" {" ".join(argv)} {closed}'
    return subprocess.run(
        ["sh", "-c", command, sys.executable, SCRIPT], capture_output=True, timeout=60
    )


@pytest.mark.parametrize("closed", ["0<&-", "1>&-", "2>&-", "0<&- 1>&-", "0<&- 1>&- 2>&-"])
def test_a_process_started_with_standard_descriptors_closed_runs_uvloop_cleanly(
    closed: str,
) -> None:
    done = _run(closed, "fix")
    # without standard_descriptors: killed by SIGABRT (libuv's assertion)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    if "2>&-" not in closed:
        assert done.stderr.decode().strip() == "ok"  # sys.stderr is usable
