"""Traces (docs/operations.md, "Traces"): a daemon started with --otlp-endpoint
exports a span for each add (a child of the caller's W3C traceparent), and the
ingest, claim, run and release of each of its jobs in the same trace; handlers
get their run's context (ctx.traceparent, TRACEPARENT), pull workers their
claim's. The receiver is an OTLP/HTTP endpoint in the test process."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import aiohttp
import pytest

from harness.api import Api, Handlers, claim_jobs, pulled_type, until, wait_all_done
from harness.daemons import DaemonFactory, Deployment, deploy
from harness.otlp import Receiver, Span, receiver

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
ECHO = "def handler(p, ctx):\n    return ctx.traceparent or 'none'\n"
JOB_SPANS = {"queue.add", "queue.ingest", "queue.claim", "queue.run", "queue.release"}


@pytest.fixture(scope="module")
def otlp() -> Iterator[Receiver]:
    with receiver() as got:
        yield got


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory,
    module_dsn: str,
    tmp_path_factory: pytest.TempPathFactory,
    otlp: Receiver,
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("tracing")
    deployed = deploy(module_daemons, module_dsn, root, ["tr"], "--otlp-endpoint", otlp.url)
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


@pytest.fixture
def tr(deployment: Deployment, session: aiohttp.ClientSession) -> Api:
    return deployment.api(session, "tr")


def _caller() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def _add(api: Api, jobtype: str, payload: str, traceparent: str | None) -> str:
    headers = {} if traceparent is None else {"traceparent": traceparent}
    reply = await api.add_raw(jobtype, payload + "\n", headers=headers)
    assert reply.status == 200, reply
    (job_id,) = reply.json["ids"]
    return str(job_id)


def _one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


async def test_a_jobs_add_ingest_claim_run_and_release_are_spans_of_the_callers_trace(
    tr: Api, otlp: Receiver
) -> None:
    await Handlers(tr).add("echo", "python", ECHO)
    traceparent, trace_id, caller_span = _caller()
    job_id = await _add(tr, "echo", "x", traceparent)
    (job,) = (await wait_all_done(tr, [job_id])).values()
    spans = otlp.wait_for(trace_id, JOB_SPANS)
    add = _one(spans, "queue.add")
    assert add.parent_id == caller_span and add.kind == 2  # SERVER
    assert add.attributes["queue.tenant"] == "tr" and add.attributes["queue.jobs"] == 1
    assert add.service == "queue-daemon"
    for name in ("queue.ingest", "queue.claim", "queue.run"):
        step = _one(spans, name)
        assert step.parent_id == add.span_id, (name, step, add)
        assert step.start_ns <= step.end_ns
    run, release = _one(spans, "queue.run"), _one(spans, "queue.release")
    assert run.attributes["queue.job"] == job_id and run.attributes["queue.code"] == "ok"
    assert release.parent_id == run.span_id
    # the handler ran under its run's span
    match = TRACEPARENT.fullmatch(job["result"])
    assert match is not None, job["result"]
    assert match.groups() == (trace_id, run.span_id)


async def test_an_add_without_a_traceparent_starts_a_trace(tr: Api, otlp: Receiver) -> None:
    await Handlers(tr).add("echo", "python", ECHO)
    job_id = await _add(tr, "echo", "y", None)
    (job,) = (await wait_all_done(tr, [job_id])).values()
    match = TRACEPARENT.fullmatch(job["result"])
    assert match is not None, job["result"]
    spans = otlp.wait_for(match.group(1), JOB_SPANS)
    assert _one(spans, "queue.add").parent_id == ""


@pytest.mark.parametrize("bad", ["garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "01-ab"])
async def test_a_malformed_traceparent_is_ignored(tr: Api, otlp: Receiver, bad: str) -> None:
    await Handlers(tr).add("echo", "python", ECHO)
    job_id = await _add(tr, "echo", "z", bad)
    (job,) = (await wait_all_done(tr, [job_id])).values()
    match = TRACEPARENT.fullmatch(job["result"])
    assert match is not None, job["result"]
    spans = otlp.wait_for(match.group(1), {"queue.add"})
    assert _one(spans, "queue.add").parent_id == ""


@pytest.mark.parametrize(
    ("lang", "body"),
    [
        ("shell", 'echo "S: 200 $TRACEPARENT"'),
        ("node", "module.exports = async (p, ctx) => ctx.traceparent || 'none'"),
    ],
)
async def test_shell_and_node_handlers_get_the_runs_context(
    tr: Api, otlp: Receiver, lang: str, body: str
) -> None:
    await Handlers(tr).add(lang, lang, body)
    traceparent, trace_id, _ = _caller()
    job_id = await _add(tr, lang, "x", traceparent)
    (job,) = (await wait_all_done(tr, [job_id])).values()
    spans = otlp.wait_for(trace_id, {"queue.run"})
    assert job["result"] == f"00-{trace_id}-{_one(spans, 'queue.run').span_id}-01", job


async def test_a_pull_worker_gets_its_claims_span(tr: Api, otlp: Receiver) -> None:
    await pulled_type(tr, "pulled")
    traceparent, trace_id, _ = _caller()
    await _add(tr, "pulled", "x", traceparent)

    async def claimed() -> list[dict[str, object]] | None:
        return await claim_jobs(tr, "pulled", "w1", limit=5) or None

    (job,) = await until(claimed, 30, "the pulled job")
    spans = otlp.wait_for(trace_id, {"queue.add", "queue.claim"})
    claim = _one(spans, "queue.claim")
    assert claim.parent_id == _one(spans, "queue.add").span_id
    assert claim.attributes["queue.worker"] == "w1"
    assert job["traceparent"] == f"00-{trace_id}-{claim.span_id}-01", job
