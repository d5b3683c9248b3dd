"""The dashboard page in headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium; nothing is downloaded).

A real daemon; the page is opened with the operator token and watched while
a tenant adds jobs of a type without a handler (the waiting count shows),
then adds the handler (the done count rises, the waiting count falls) and a
failing type whose result is HTML (it shows as text). Then the tenant's own
token: no other tenant's name anywhere, and its schedules with their next fire
times. The browser console must stay free of errors. A screenshot is kept in
pytest's tmp dir and in ``test-artifacts/``.

Without the browser the test is skipped, with the reason, except under
``CI=true`` (``.ci/run`` installs it), where that is a failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import aiohttp
import pytest

from harness.api import Api, Handlers
from harness.daemons import (
    REPO,
    DaemonFactory,
    Deployment,
    deploy,
    reachable_dir,
    run_cli,
    store_args,
)
from tests.needs import missing

T = TypeVar("T")
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
WITHIN = 45.0  # seconds for the page to show a change (it polls every 2 s)
XSS = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b>"


def _missing(why: str) -> NoReturn:
    missing("the browser test", why)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed (pip install -e '.[dev]')")
    chromedriver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    binary = next(filter(None, map(shutil.which, CHROMIUM)), None)
    if not os.access(chromedriver, os.X_OK) or binary is None:
        _missing(
            "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # the tests may run as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--window-size=1400,1100",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=chromedriver, log_output=str(tmp_path / "chromedriver.log"))
    browser = webdriver.Chrome(service=service, options=options)
    try:
        yield browser
    finally:
        browser.quit()  # ends the browser, then stops chromedriver by its pid
        process = getattr(service, "process", None)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture
def deployment(daemons: DaemonFactory, pg_dsn: str) -> Iterator[Deployment]:
    root = reachable_dir("qd-dashboard-")  # handlers must reach the data dir
    try:
        deployed = deploy(daemons, pg_dsn, root, ["acme", "globex"])
        done = run_cli(
            "admin", "token", *store_args(deployed.dsn, deployed.data_dir), cwd=deployed.cwd
        )
        assert done.returncode == 0, done.stderr
        deployed.tokens["*admin"] = done.stdout.strip().splitlines()[-1]
        yield deployed
        deployed.daemon.close()  # before its database is dropped
    finally:
        shutil.rmtree(root, ignore_errors=True)


def wait_for(what: str, probe: Callable[[], T | None], within: float = WITHIN) -> T:
    """Poll the page with a deadline (never a guessed sleep)."""
    deadline = time.monotonic() + within
    while True:
        result = probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"the page did not show {what} within {within:.0f} s")
        time.sleep(0.1)


def cell(driver: Any, queue: str, column: str) -> str | None:
    """The text of a queue row's cell, or None while the row is not shown."""
    text = driver.execute_script(
        "const row = [...document.querySelectorAll('#queues tr')]"
        "  .find(r => r.dataset.queue === arguments[0]);"
        "const td = row && row.querySelector('td[data-col=\"' + arguments[1] + '\"]');"
        "return td ? td.textContent : null;",
        queue,
        column,
    )
    return None if text is None else str(text)


def open_as(driver: Any, url: str, client: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    driver.find_element(By.ID, "logout").click()
    client_box = driver.find_element(By.ID, "client")
    client_box.clear()
    client_box.send_keys(client)
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


def severe(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e.get("level") == "SEVERE"]


async def test_dashboard_in_chromium(
    driver: Any, deployment: Deployment, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    url = deployment.url
    acme: Api = deployment.api(session, "acme")
    globex: Api = deployment.api(session, "globex")
    await globex.add("globex_secret_type", ["1"])

    # the operator's view: every tenant; jobs of a type without a handler wait
    open_as(driver, url, "", deployment.tokens["*admin"])
    wait_for(
        "the operator view", lambda: "operator view" in driver.find_element(By.ID, "status").text
    )
    await acme.add("resize", ["a", "b", "c"])
    wait_for("3 waiting resize jobs", lambda: cell(driver, "acme/resize", "waiting") == "3")
    assert cell(driver, "globex/globex_secret_type", "waiting") == "1"

    # a handler arrives: the jobs finish and the page follows
    handlers = Handlers(acme)
    await handlers.add("resize", "python", "def handler(payload, ctx):\n    return 200, 'ok'\n")
    await handlers.add(
        "bad", "python", "def handler(payload, ctx):\n    return 400, payload\n", maxAttempts=1
    )
    await acme.add("bad", [XSS])
    wait_for("3 done resize jobs", lambda: cell(driver, "acme/resize", "done_ok") == "3")
    assert cell(driver, "acme/resize", "waiting") == "0"
    wait_for("the failed job", lambda: cell(driver, "acme/bad", "done_failed") == "1")

    # the failure's result shows as the text it is, never as markup
    def result_text() -> str | None:
        cells = driver.find_elements(By.CSS_SELECTOR, "#failures td.result")
        return next((c.text for c in cells if "onerror" in c.text), None)

    assert wait_for("the failure's result", result_text) == XSS
    assert driver.find_elements(By.CSS_SELECTOR, "#failures img, #failures b") == []
    assert "pwned" not in driver.title and driver.title.startswith("queue-daemon")
    assert driver.find_element(By.ID, "error").text == ""

    # a failure clicked shows the job's runs
    row = next(
        r
        for r in driver.find_elements(By.CSS_SELECTOR, "#failures tr[data-job]")
        if "onerror" in r.text
    )
    row.click()

    def runs() -> list[str] | None:
        shown = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#job-runs td")]
        return shown or None

    shown = wait_for("the job's runs", runs)
    assert "failed" in shown and "400" in shown, shown
    assert "acme-bad" not in driver.find_element(By.ID, "job-title").text

    # the sampled throughput follows (a sample before and one after the jobs ended)
    def rate() -> float | None:
        text = cell(driver, "acme/resize", "per_s") or ""
        return float(text) if text.replace(".", "", 1).isdigit() and float(text) > 0 else None

    wait_for("a throughput", rate)
    sparkline = '#queues tr[data-queue="acme/resize"] svg polyline'
    wait_for("a sparkline", lambda: driver.find_elements(By.CSS_SELECTOR, sparkline))

    # the filter narrows the tables to one tenant's rows, and back
    driver.find_element(By.ID, "filter").send_keys("globex")
    wait_for("the filter", lambda: cell(driver, "acme/resize", "waiting") is None)
    assert cell(driver, "globex/globex_secret_type", "waiting") == "1"
    driver.find_element(By.ID, "filter").clear()
    driver.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
    wait_for("every row again", lambda: cell(driver, "acme/resize", "waiting") == "0")

    shot = tmp_path / "dashboard.png"
    assert driver.save_screenshot(str(shot))
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copy(shot, artifacts / "dashboard.png")

    console = driver.get_log("browser")
    assert severe(console) == [], console

    # a tenant's own token: its queues only; no other tenant's name anywhere
    assert not driver.find_element(By.ID, "schedules-section").is_displayed()  # operator view
    reply = await acme.request(
        "POST",
        "/acme/schedule/add/nightly",
        data='{"type": "report", "cron": "0 3 * * *", "tz": "Europe/Berlin", "payload": "p"}',
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 200, reply
    open_as(driver, url, "acme", deployment.tokens["acme"])
    wait_for("the tenant view", lambda: "tenant acme" in driver.find_element(By.ID, "status").text)
    wait_for("acme's queue", lambda: cell(driver, "acme/resize", "done_ok") == "3")
    # its schedules, each with its next three fire times
    next_times = wait_for(
        "the schedule's next fire times",
        lambda: driver.execute_script(
            "const td = document.querySelector("
            '  \'#schedules tr[data-schedule="nightly"] td[data-col="next"]\');'
            "return td ? td.textContent : null;"
        ),
    )
    assert len(next_times.split(" · ")) == 3, next_times
    page = driver.find_element(By.TAG_NAME, "body").text + driver.page_source
    assert "globex" not in page
    assert severe(driver.get_log("browser")) == []

    # a refused token shows in the page; the console has only the failed request
    open_as(driver, url, "", "not-a-token")
    wait_for("the 401", lambda: "401" in driver.find_element(By.ID, "error").text)
    left = [e for e in severe(driver.get_log("browser")) if "401" not in e.get("message", "")]
    assert left == [], left
    print(f"browser test took {time.monotonic() - started:.1f} s")


async def test_dashboard_buttons_rerun_cancel_pause_and_resume(
    driver: Any, deployment: Deployment, session: aiohttp.ClientSession
) -> None:
    from selenium.webdriver.common.by import By

    acme: Api = deployment.api(session, "acme")
    handlers = Handlers(acme)
    await handlers.add(
        "bad", "python", "def handler(payload, ctx):\n    return 400, payload\n", maxAttempts=1
    )
    await handlers.add(
        "sleep", "python", "import time\ndef handler(p, ctx):\n    time.sleep(60)\n", timeout=120
    )
    await handlers.add(
        "worse", "python", "def handler(p, ctx):\n    return 400, p\n", maxAttempts=1
    )
    [failed] = await acme.add("bad", ["<b>dead letter</b>"], params={"priority": "7"})
    [other] = await acme.add("worse", ["another"])
    open_as(driver, deployment.url, "acme", deployment.tokens["acme"])
    wait_for("the failed job", lambda: cell(driver, "acme/bad", "done_failed") == "1")
    wait_for("the other failure", lambda: cell(driver, "acme/worse", "done_failed") == "1")

    def click(css: str, text: str | None = None) -> bool:
        """Find and click in one step: the tables are drawn anew every 2 s, so an
        element found in one call may be gone by the next."""
        return bool(
            driver.execute_script(
                "const el = document.querySelector(arguments[0]);"
                "if (!el || (arguments[1] !== null && el.textContent !== arguments[1]))"
                "  return false;"
                "el.click(); return true;",
                css,
                text,
            )
        )

    def failures() -> set[str]:
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#failures tr[data-job]')]"
            "  .map(r => r.dataset.job);"
        )
        return set(rows or [])

    # a type's dead letters alone: its failed count lists them, "all types" undoes it
    wait_for("both failures", lambda: failures() == {failed, other})
    wait_for(
        "bad's failed count", lambda: click('#queues tr[data-queue="acme/bad"] td[data-failures]')
    )
    wait_for("bad's failures alone", lambda: failures() == {failed})
    assert driver.find_element(By.ID, "failures-of").text == "of acme/bad"
    wait_for("the all types button", lambda: click("#failures-all"))
    wait_for("both failures again", lambda: failures() == {failed, other})

    # a dead letter: its page shows payload, result and priority; rerun runs it again
    wait_for("the failure's row", lambda: click(f'#failures tr[data-job="{failed}"] td'))
    wait_for("the job's page", lambda: driver.find_element(By.ID, "job-rerun").is_displayed())
    assert driver.find_element(By.ID, "job-payload").text == "<b>dead letter</b>"
    assert driver.find_element(By.ID, "job-priority").text == "7"
    assert not driver.find_element(By.ID, "job-cancel").is_displayed()
    driver.find_element(By.ID, "job-rerun").click()

    async def ran_twice() -> bool:
        job = (await acme.get_job(failed)).json
        return job["state"] == "done" and len(job["runs"]) == 2

    await until_true("the rerun to run and fail again", ran_twice)

    # pause and resume a type from its row
    button = '#queues tr[data-queue="acme/bad"] button[data-action]'

    async def paused(value: bool) -> bool:
        return bool((await acme.stats()).json["types"]["bad"]["paused"] is value)

    wait_for("the pause button", lambda: click(button, "pause"))
    await until_true("the type paused", lambda: paused(True))
    wait_for("the paused state", lambda: "paused" in (cell(driver, "acme/bad", "state") or ""))
    wait_for("the resume button", lambda: click(button, "resume"))
    await until_true("the type resumed", lambda: paused(False))

    # a running job cancelled from its page
    [running] = await acme.add("sleep", ["x"])
    wait_for("the running job", lambda: click(f'#running tr[data-job="{running}"] td'))
    wait_for("the cancel button", lambda: driver.find_element(By.ID, "job-cancel").is_displayed())
    driver.find_element(By.ID, "job-cancel").click()

    async def cancelled() -> bool:
        return bool((await acme.get_job(running)).json["code"] == "cancelled")

    await until_true("the job cancelled", cancelled)
    wait_for("the rerun button", lambda: driver.find_element(By.ID, "job-rerun").is_displayed())
    assert driver.find_element(By.ID, "error").text == ""
    assert severe(driver.get_log("browser")) == []


async def until_true(what: str, probe: Callable[[], Awaitable[bool]]) -> None:
    """Poll the API with a deadline."""
    deadline = time.monotonic() + WITHIN
    while not await probe():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {WITHIN:.0f} s")
        await asyncio.sleep(0.1)
