"""Token rotation with the real CLI against a running daemon.

``tenant rotate`` prints a new token that works at once (the daemon reloads
its cache on an unknown token) while the previous one keeps working until the
grace period ends; then the previous one gets 401 within a cache refresh.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import aiohttp
import pytest

from harness.api import Reply, assert_error, until
from harness.daemons import DaemonFactory, Deployment, deploy, run_cli, store_args

GRACE = 4.0


@pytest.fixture(scope="module")
def deployment(
    module_daemons: DaemonFactory, module_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    deployed = deploy(module_daemons, module_dsn, tmp_path_factory.mktemp("rotation"), ["a", "b"])
    try:
        yield deployed
    finally:
        deployed.daemon.close()  # before its database is dropped


def cli(deployment: Deployment, *args: str) -> tuple[int, str, str]:
    done = run_cli(
        *args[:2], *store_args(deployment.dsn, deployment.data_dir), *args[2:], cwd=deployment.cwd
    )
    return done.returncode, done.stdout, done.stderr


def listed(deployment: Deployment, client: str) -> list[str]:
    code, out, err = cli(deployment, "tenant", "list")
    assert code == 0, err
    [line] = [line.split() for line in out.splitlines() if line.split()[:1] == [client]]
    return line


async def test_rotated_token_works_at_once_and_the_old_one_until_the_grace_ends(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    old = deployment.api(session, "a")
    assert (await old.stats()).status == 200
    code, out, err = cli(deployment, "tenant", "rotate", "a", "--grace", str(GRACE))
    assert code == 0, err
    token = out.strip().splitlines()[-1].strip()
    assert token.startswith("qd_") and token != deployment.tokens["a"]
    new = old.as_("a", token)

    assert (await new.stats()).status == 200, "the new token must work at once"
    line = listed(deployment, "a")
    assert line[1] == "active" and "tokens=2" in line, line
    # the grace ends by the database's clock (the same machine's): the CLI may
    # have taken a while to exit after it began
    grace_until = datetime.fromisoformat(line[-1].removeprefix("grace_until=")).timestamp()
    if time.time() < grace_until - 0.5:
        assert (await old.stats()).status == 200, "the old token must work during the grace"
    assert_error(await new.as_("b", token).stats(), 403)  # still a's alone
    assert not any(t in " ".join(line) for t in (token, deployment.tokens["a"]))

    async def refused() -> Reply | None:
        reply = await old.stats()
        return reply if reply.status == 401 else None

    assert_error(await until(refused, GRACE + 10, "the old token to be refused"), 401)
    assert time.time() >= grace_until - 0.5, "refused before its grace ended"
    assert (await new.stats()).status == 200
    assert (await deployment.api(session, "b").stats()).status == 200
    assert "tokens=1" in listed(deployment, "a")


async def test_revoke_after_rotate_ends_both_tokens(
    deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    old = deployment.api(session, "b")
    code, out, err = cli(deployment, "tenant", "rotate", "b", "--grace", "3600")
    assert code == 0, err
    new = old.as_("b", out.strip().splitlines()[-1].strip())
    assert (await new.stats()).status == 200 and (await old.stats()).status == 200
    code, _, err = cli(deployment, "tenant", "revoke", "b")
    assert code == 0, err

    async def both_refused() -> bool | None:
        statuses = ((await old.stats()).status, (await new.stats()).status)
        return True if statuses == (401, 401) else None

    await until(both_refused, 10, "both tokens to be refused")
    assert listed(deployment, "b")[1] == "revoked"


def test_rotating_an_unknown_tenant_fails_with_one_line(deployment: Deployment) -> None:
    code, out, err = cli(deployment, "tenant", "rotate", "nosuch")
    assert code != 0, out
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert "nosuch" in err
    assert not out.strip(), f"a failed rotate printed a token: {out}"
    code, _, err = cli(deployment, "tenant", "rotate", "a", "--grace", "-1")
    assert code != 0 and len(err.strip().splitlines()) == 1, err
