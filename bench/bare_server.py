"""The ceiling for a durable add over HTTP: bare aiohttp doing "the same fsync".

``python -m bench.bare_server --file PATH [--port 0]`` serves any POST by
appending its body to PATH and replying ``200 {"ids": [...]}`` (one id per
line, like the daemon) once a group-commit ``fdatasync`` covers it. Requests
that arrive while a sync runs wait together for the next one; every sync runs
in one worker thread, so the event loop never blocks on the disk. Nothing
else: no auth, no validation, no id scheme, no journal format. Prints
``listening on http://HOST:PORT`` when ready; stops on SIGTERM/SIGINT. It runs
on uvloop, the daemon's default loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import orjson
import uvloop
from aiohttp import web


class GroupCommit:
    """Appends on the loop thread; one fdatasync at a time in a worker thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._waiting: list[asyncio.Future[None]] = []
        self._syncing = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fsync")

    async def append(self, data: bytes) -> None:
        os.write(self._fd, data)
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        if not self._syncing:
            self._start()
        await future

    def _start(self) -> None:
        group, self._waiting = self._waiting, []
        self._syncing = True
        sync = asyncio.get_running_loop().run_in_executor(self._pool, os.fdatasync, self._fd)
        sync.add_done_callback(lambda done: self._finish(group, done))

    def _finish(self, group: list[asyncio.Future[None]], done: asyncio.Future[None]) -> None:
        self._syncing = False
        error = done.exception()
        for future in group:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
        if self._waiting:
            self._start()

    def close(self) -> None:
        self._pool.shutdown()


COMMIT = web.AppKey("commit", GroupCommit)


async def add(request: web.Request) -> web.Response:
    body = await request.read()
    if not body.endswith(b"\n"):
        body += b"\n"
    lines = body.count(b"\n")
    await request.app[COMMIT].append(body)
    ids = [str(i) for i in range(lines)]
    return web.Response(body=orjson.dumps({"ids": ids}), content_type="application/json")


async def serve(path: str, host: str, port: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    commit = GroupCommit(fd)
    app = web.Application(client_max_size=64 << 20)
    app[COMMIT] = commit
    app.router.add_post("/{tail:.*}", add)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        sys.stdout.write(f"listening on http://{bound_host}:{bound_port}\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await runner.cleanup()
        commit.close()
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_server")
    parser.add_argument("--file", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    # the daemon's default loop, so that the ratio compares the work, not the loops
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args.file, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
