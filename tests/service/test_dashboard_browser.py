"""The dashboard in a real browser: headless Chromium from the distribution's packages, driven by
Playwright with its executable path pointed at it. Sees the job list, a rendered reward chart of a
finished run and its sample table, submits a job from the form and cancels it from the page, and
saves a screenshot (``RLFT_SCREENSHOT_DIR`` keeps a copy: the README's picture comes from here)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.service.conftest import job_config, write_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Playwright adds --headless and a fresh profile of its own; these keep Chromium off the (closed) network.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser_page(tmp_path):
    if CHROMIUM is None:
        if os.environ.get("RLFT_REQUIRE_BROWSER") == "1":
            pytest.fail("RLFT_REQUIRE_BROWSER=1 but chromium is not installed")
        pytest.skip("no chromium (apt-get install chromium; scripts/ci_services.sh does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield page, errors
        browser.close()


def test_dashboard_shows_jobs_charts_and_samples_and_its_buttons_work(server, workspace, browser_page, tmp_path):
    page, errors = browser_page
    c = server.client()
    path = write_config(workspace, "six.yaml", job_config(steps=6))
    done = c.submit(path)
    assert c.wait(done["job_id"], timeout=240)["status"] == "success"

    page.goto(server.url + "/")
    row = page.locator(f'.job-row[data-job-id="{done["job_id"]}"]')
    row.wait_for(timeout=30_000)
    assert row.get_attribute("data-status") == "success"
    row.click()
    chart = page.locator("#chart-reward.js-plotly-plot")
    chart.wait_for(timeout=30_000)
    assert chart.locator(".scatterlayer .trace").count() >= 1  # Plotly drew at least one line
    page.locator("#chart-kl.js-plotly-plot").wait_for(timeout=10_000)
    groups = page.locator("#samples table.sample-group")
    groups.first.wait_for(timeout=10_000)
    assert groups.count() >= 1 and groups.first.locator("tbody tr").count() == 4  # a whole group side by side
    page.wait_for_timeout(500)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 20_000
    if os.environ.get("RLFT_SCREENSHOT_DIR"):
        Path(os.environ["RLFT_SCREENSHOT_DIR"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(os.environ["RLFT_SCREENSHOT_DIR"]) / "dashboard.png")

    # submit from the form, then cancel from the page
    page.fill("#config-path", write_config(workspace, "long.yaml", job_config(steps=500)))
    page.click("#submit-btn")
    new = page.locator('.job-row:not([data-status="success"])')
    new.first.wait_for(timeout=30_000)
    new_id = new.first.get_attribute("data-job-id")
    page.locator(f'.job-row[data-job-id="{new_id}"]').click()
    page.wait_for_function(
        f"document.querySelector('.job-row[data-job-id=\"{new_id}\"]').dataset.status === 'running'", timeout=60_000
    )
    page.locator("#cancel-btn:not([disabled])").click(timeout=30_000)
    assert c.wait(new_id, timeout=120)["status"] == "cancelled"
    assert errors == []
