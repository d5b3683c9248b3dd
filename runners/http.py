"""HTTP handlers: the body is a URL and each job's payload is POSTed to it.

The reply's status is the job's exitcode and its body (bounded) the result;
an endpoint that cannot be reached is 502, one that does not answer in time
504. One shared ``aiohttp.ClientSession`` pools the connections; it never
reads the daemon's environment (no proxy settings, no netrc).

The daemon connects only to addresses its ``AddressPolicy`` allows
(``queue_daemon.runners.sandbox.addresses``): a host name is refused when any address it resolves
to is refused, and every socket is checked again right before it connects
(the address actually used: no DNS rebinding, IP literals and every redirect
hop included). A refused address ends the job with 403 (failed, not retried)
and a result that names the address and why.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from queue_daemon.runners.codes import BAD_GATEWAY, ERROR, FORBIDDEN, TIMEOUT, valid_exitcode
from queue_daemon.runners.models import HandlerSpec, JobInput, JobResult
from queue_daemon.runners.output import clip
from queue_daemon.runners.sandbox.addresses import AddressPolicy, AddressRefused

SCHEMES = ("http", "https")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an http handler's body, or None."""
    text = url.strip()
    if not text:
        return "the body must be an http(s) URL"
    if any(ch.isspace() or ord(ch) < 32 for ch in text):
        return "the URL contains whitespace or control characters"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return f"not a valid URL: {exc}"
    if parts.scheme.lower() not in SCHEMES:
        return f"only http and https URLs are allowed, not {parts.scheme or 'no scheme'!r}"
    if not parts.hostname:
        return "the URL has no host"
    return None


class CheckedResolver(AbstractResolver):
    """Resolves as usual, then refuses a name if any of its addresses is refused."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            problem = self._policy.problem(result["host"])
            if problem is not None:
                raise AddressRefused(f"{host} resolves to {problem}")
        return results

    async def close(self) -> None:
        await self._inner.close()


def checked_socket(policy: AddressPolicy) -> Callable[[Any], socket.socket]:
    """aiohttp's ``socket_factory``: the last check, on the address about to be connected."""

    def make(addr_info: Any) -> socket.socket:
        family, type_, proto, _, address = addr_info
        policy.check(str(address[0]))
        return socket.socket(family=family, type=type_, proto=proto)

    return make


def refusal(exc: BaseException) -> AddressRefused | None:
    """The address refusal behind an aiohttp error, if that is what it is."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, AddressRefused):
            return seen
        seen = getattr(seen, "os_error", None) or seen.__cause__ or seen.__context__
    return None


class HttpRunner:
    """Posts each job of a batch, ``concurrency`` requests at a time."""

    def __init__(
        self,
        *,
        result_limit: int = 1 << 20,
        concurrency: int = 32,
        policy: AddressPolicy | None = None,
    ) -> None:
        self._max_result = result_limit
        self._concurrency = concurrency
        self._policy = policy or AddressPolicy()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=256,
                    resolver=CheckedResolver(self._policy),
                    socket_factory=checked_socket(self._policy),
                ),
                trust_env=False,
                auto_decompress=True,
            )
        return self._session

    async def run_batch(self, spec: HandlerSpec, jobs: Sequence[JobInput]) -> list[JobResult]:
        problem = url_problem(spec.body)
        if problem is not None:
            return [JobResult(id=job.id, exitcode=ERROR, result=problem) for job in jobs]
        gate = asyncio.Semaphore(self._concurrency)

        async def one(job: JobInput) -> JobResult:
            async with gate:
                return await self.post(spec, job)

        return list(await asyncio.gather(*(one(job) for job in jobs)))

    async def post(self, spec: HandlerSpec, job: JobInput) -> JobResult:
        headers = {
            "Content-Type": "text/plain; charset=utf-8",
            "X-Job-Id": job.id,
            "X-Job-Attempt": str(job.attempt),
            "X-Job-Type": spec.type,
        }
        if job.traceparent is not None:  # the daemon traces: the endpoint's span may join
            headers["traceparent"] = job.traceparent
        timeout = aiohttp.ClientTimeout(total=spec.timeout)
        try:
            async with self._client().post(
                spec.body.strip(),
                data=job.payload.encode("utf-8", "surrogatepass"),
                headers=headers,
                timeout=timeout,
            ) as reply:
                body = await reply.content.read(self._max_result + 4)
                status = reply.status
                charset = reply.charset or "utf-8"
        except TimeoutError:
            return JobResult(
                id=job.id, exitcode=TIMEOUT, result=f"timed out after {spec.timeout:g}s"
            )
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            refused = refusal(exc)
            if refused is not None:
                return JobResult(id=job.id, exitcode=FORBIDDEN, result=f"refused: {refused}")
            return JobResult(
                id=job.id, exitcode=BAD_GATEWAY, result=f"request failed: {describe(exc)}"
            )
        try:
            text = body.decode(charset, "replace")
        except LookupError:
            text = body.decode("utf-8", "replace")
        result = clip(text, self._max_result)
        if not valid_exitcode(status):
            return JobResult(id=job.id, exitcode=BAD_GATEWAY, result=f"status {status}: {result}")
        return JobResult(id=job.id, exitcode=status, result=result)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return clip(f"{type(exc).__name__}: {text}" if str(exc) else text, 1000)
