"""The web page shows the reward parts an environment sends (``metadata.reward_components``),
in a real headless Chromium: on the Sudoku server with ``rubric="shaped"`` they equal the
components the page computes with the scheduler's code."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from envsdk.games.sudoku import solve
from envsdk.testing import running_server
from tests.web.conftest import CHROMEDRIVER, CHROMIUM, browser  # noqa: F401 - fixture
from tests.web.test_browser import _idle, _text

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None, reason="needs Debian's chromium and chromium-driver"
)


@pytest.fixture(scope="module")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=4)) as url:
        yield url


def _rows(driver: WebDriver, table: str, key: str) -> dict[str, str]:
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tr")
    return {str(r.get_attribute(f"data-{key}")): str(r.find_elements(By.TAG_NAME, "td")[1].text) for r in rows}


@pytest.mark.timeout(120)
def test_page_shows_the_servers_reward_parts_equal_to_its_components(sudoku_url: str, browser: WebDriver) -> None:  # noqa: F811
    seed = 9
    board = httpx.post(f"{sudoku_url}/reset", json={"seed": seed}, timeout=30).json()["observation"]["board"]
    solution = solve(board)
    assert solution is not None
    r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c] == 0)
    wait = WebDriverWait(browser, 20)
    browser.get(f"{sudoku_url}/web")
    wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
    browser.find_element(By.ID, "seed").send_keys(str(seed))
    kwargs = browser.find_element(By.ID, "kwargs")
    kwargs.clear()
    kwargs.send_keys('{"rubric": "shaped"}')
    browser.find_element(By.ID, "reset-btn").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#board td")) == 81 and _idle(d))
    assert not browser.find_element(By.ID, "parts-block").is_displayed()  # nothing scored at reset

    for move in (f"[{r + 1} {c + 1} {solution[r][c]}]", f"[{r + 1} {c + 1} {solution[r][c]}]"):  # good, then repeated
        action = browser.find_element(By.ID, "action-text")
        action.clear()
        action.send_keys(move)
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda d: _idle(d) and len(d.find_elements(By.CSS_SELECTOR, "#parts tr")) == 5)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#components tr")) >= 5)
    parts = _rows(browser, "parts", "part")
    assert list(parts) == ["empty_cell", "valid_move", "repetition", "progress", "correct"]
    # This step's values: the repeat hit a filled cell and cost 2 for the repetition.
    assert (parts["empty_cell"], parts["repetition"]) == ("-1", "-2")
    # The page's components (the scheduler's code, episode means) agree on the cumulative parts.
    components = _rows(browser, "components", "component")
    assert parts["progress"] == components["progress"] and parts["correct"] == components["correct"]
    assert _text(browser, "reward") == "0"
