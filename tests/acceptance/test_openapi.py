"""``GET /openapi.json`` and a schemathesis run of every route against a real daemon.

The document is loaded from the live daemon (so what is served is what is
checked); the path's ``client`` is pinned to the test's tenant and its bearer
token is sent, so most calls get past authentication and reach the handlers.
Checks: no 5xx, every status is documented, every reply conforms to its schema.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from harness.daemons import DaemonFactory, Deployment, deploy
from queue_daemon.api.openapi import document

CLIENT = "fuzz"
MAX_EXAMPLES = 25  # per operation: the whole run stays well under a minute and a half
STATUSES: Counter[str] = Counter()  # "METHOD path status" -> calls, over the fuzz run
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("openapi"), [CLIENT])
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


async def test_openapi_json_is_served_without_auth(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    async with session.get(f"{deployment.url}/openapi.json") as reply:
        assert reply.status == 200
        assert reply.content_type == "application/json"
        served = await reply.json()
    assert served == document()
    assert served["openapi"].startswith("3.")
    live = schemathesis.openapi.from_url(f"{deployment.url}/openapi.json")
    operations = {(op.method.upper(), op.path) for op in map(_ok, live.get_all_operations())}
    routes = {
        (method.upper(), path)
        for path, item in served["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete")
    }
    assert len(routes) == 41
    # schemathesis leaves out the URL it loaded the document from
    assert operations == routes - {("GET", "/openapi.json")}, routes - operations


def _ok(result: Any) -> Any:
    return result.ok()


# The document as built in-process: the test above asserts it is exactly what the
# daemon serves. (schemathesis.pytest.from_fixture, the lazy form, breaks on pytest 9.)
schema = schemathesis.openapi.from_dict(document())
schema.config.update(parameters={"path.client": CLIENT}, request_timeout=30)
schema.config.generation.update(max_examples=MAX_EXAMPLES)


@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
@schema.parametrize()
def test_every_route_conforms_to_the_document(case: Any, deployment: Deployment) -> None:
    response = case.call_and_validate(
        base_url=deployment.url,
        headers={"Authorization": f"Bearer {deployment.tokens[CLIENT]}"},
        checks=CHECKS,
    )
    STATUSES[f"{case.operation.label} {response.status_code}"] += 1


def test_the_fuzz_run_got_past_authentication() -> None:
    """Runs after the fuzz test: most calls must have reached the handlers (not 401/403)."""
    if not STATUSES:
        pytest.skip("the fuzz test did not run")
    print(sorted(STATUSES.items()))
    total = sum(STATUSES.values())
    denied = sum(n for key, n in STATUSES.items() if key.endswith((" 401", " 403")))
    assert denied < total / 2, STATUSES
    assert any(key.endswith(" 200") for key in STATUSES), STATUSES
