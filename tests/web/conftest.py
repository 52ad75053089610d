"""One real Sudoku server on 127.0.0.1 for the whole web test package, and a headless Chromium
for the browser tests (skipped where Debian's chromium and chromium-driver are missing)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from envsdk.cli import main
from envsdk.testing import running_server

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

# The closed network makes Chromium hang on its background connections without these.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1150",
)


@pytest.fixture(scope="package")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=16)) as url:
        yield url


def headless_chromium() -> Iterator[Any]:
    """A headless Chromium WebDriver, quit afterwards; skips the test without chromium."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "headless browser test needs Debian's chromium and chromium-driver "
            "(apt-get install -y chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="envsdk-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        try:
            driver.set_page_load_timeout(20)
            driver.set_script_timeout(20)
            yield driver
        finally:
            driver.quit()


@pytest.fixture
def browser() -> Iterator[Any]:
    yield from headless_chromium()


def report_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``envsdk report`` prints when it refuses `args` (exit 2, no traceback)."""
    assert main(["report", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("envsdk report: error: ") and err.count("\n") == 1, err
    return err
