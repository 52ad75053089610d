"""The web page in a real headless Chromium against a real Sudoku server: reset with a seed,
play a correct and a wrong move, read the board, verdict, reward, components and live figures
off the page. A screenshot goes to ``test-artifacts/web/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from envsdk.games.sudoku import count_filled, solve
from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation, running_server
from tests.server.envs import GuessAction, GuessObservation, NumberGuessEnv

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"


def _text(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def _cell(driver: WebDriver, row: int, col: int) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, f'#board td[data-row="{row}"][data-col="{col}"]').text)


def _page_board(driver: WebDriver) -> list[list[int]]:
    return [[int(_cell(driver, r, c) or 0) for c in range(1, 10)] for r in range(1, 10)]


def _component(driver: WebDriver, name: str) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'#components tr[data-component="{name}"]')
    return str(row.find_elements(By.TAG_NAME, "td")[1].text)


def _idle(driver: WebDriver) -> bool:
    return bool(driver.execute_script("return document.body.dataset.busy === '0'"))


@pytest.mark.timeout(120)
def test_page_plays_a_sudoku_move_and_shows_board_verdict_and_reward(sudoku_url: str, browser: WebDriver) -> None:
    seed = 7
    # The same seed gives the same board (the server's contract); read it without the page.
    board = httpx.post(f"{sudoku_url}/reset", json={"seed": seed}, timeout=30).json()["observation"]["board"]
    solution = solve(board)
    assert solution is not None
    empty = [(r, c) for r in range(9) for c in range(9) if board[r][c] == 0]
    (r1, c1), (r2, c2) = empty[0], empty[1]
    # The panel redraws the board while the wait polls it: a cell found just before is stale.
    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))

    browser.get(f"{sudoku_url}/web")
    wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
    assert _text(browser, "env-name") == "SudokuEnvironment"

    browser.find_element(By.ID, "seed").send_keys(str(seed))
    browser.find_element(By.ID, "reset-btn").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#board td")) == 81 and _idle(d))
    assert _page_board(browser) == board
    assert "GUARANTEED MOVES" in _text(browser, "hints")
    assert "Current Sudoku board" in _text(browser, "model-view")

    # A correct move: the cell shows the digit, the verdict is valid, components as scheduled.
    digit = solution[r1][c1]
    action = browser.find_element(By.ID, "action-text")
    action.send_keys(f"[{r1 + 1} {c1 + 1} {digit}]")
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda d: _cell(d, r1 + 1, c1 + 1) == str(digit) and _idle(d) and _text(d, "verdict") != "–")
    assert _text(browser, "verdict").startswith(f"valid [{r1 + 1} {c1 + 1} {digit}]")
    assert _text(browser, "reward") == "0"
    assert _text(browser, "done") == "false"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#components tr")) >= 5)
    progress = 1 / (81 - count_filled(board))
    assert _component(browser, "empty_cell") == "1"
    assert _component(browser, "valid_move") == "1"
    assert _component(browser, "repetition") == "0"
    assert _component(browser, "progress") == f"{progress:.3f}"
    assert _component(browser, "correct") == "0"
    assert _component(browser, "total_reward") == f"{2 + progress:.3f}"
    assert "MOVES REJECTED" not in _text(browser, "hints")  # an accepted move is on the board, not listed

    # A wrong digit: refused, the cell stays empty, the verdict carries the game's reason.
    wrong = next(d for d in range(1, 10) if d != solution[r2][c2])
    action.clear()
    action.send_keys(f"[{r2 + 1} {c2 + 1} {wrong}]")
    browser.find_element(By.ID, "step-btn").click()
    wait.until(lambda d: _text(d, "verdict").startswith("invalid") and _idle(d))
    assert _cell(browser, r2 + 1, c2 + 1) == ""
    assert "violates Sudoku rules" in _text(browser, "verdict")
    wait.until(lambda d: f"MOVES REJECTED (do not repeat): [{r2 + 1} {c2 + 1} {wrong}]" in _text(d, "hints"))
    assert _component(browser, "valid_move") == f"{(1 - 0.5) / 2:.3f}"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#history li")) == 3

    # Live figures from /health and /metrics: this page's session is open, two steps were played.
    wait.until(lambda d: _text(d, "stat-active") == "1" and int(_text(d, "stat-steps") or 0) >= 2)
    assert _text(browser, "stat-connection") == "open"

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "sudoku_page.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.timeout(90)
def test_page_shows_the_servers_typed_error_for_a_bad_reset(sudoku_url: str, browser: WebDriver) -> None:
    browser.get(f"{sudoku_url}/web")
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
    kwargs = browser.find_element(By.ID, "kwargs")
    kwargs.clear()
    kwargs.send_keys('{"observation_form": "sideways"}')
    browser.find_element(By.ID, "reset-btn").click()
    wait.until(lambda d: d.find_element(By.ID, "error").is_displayed() and _idle(d))
    assert "observation_form" in _text(browser, "error")
    assert browser.find_element(By.ID, "step-btn").get_attribute("disabled") is not None


@pytest.mark.timeout(90)
def test_page_drives_a_generic_env_behind_a_token(browser: WebDriver) -> None:
    app = create_app(EchoEnvironment, EchoAction, EchoObservation, token="s3cret")
    with running_server(app) as url:
        assert httpx.get(f"{url}/web").status_code == 401
        browser.get(f"{url}/web?token=s3cret")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        browser.find_element(By.ID, "reset-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "done") == "false")
        browser.find_element(By.ID, "action-text").send_keys("hello")
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "reward") == "0.500")
        assert not browser.find_elements(By.ID, "board")  # no Sudoku panel for another env
        assert _text(browser, "step-count") == "1"
        assert '"echoed_message": "hello"' in _text(browser, "obs-view")
        # Not Sudoku: the model reads the observation's text (its only string field), as a scheduler gives it.
        assert browser.find_element(By.ID, "model-view").get_attribute("textContent") == "hello"
        wait.until(lambda d: _text(d, "stat-steps") == "1")


def test_page_shows_a_tool_picker_and_calls_a_tool_of_a_tool_env(browser: WebDriver) -> None:
    from selenium.webdriver.support.ui import Select

    from examples.ledger_tools import create_ledger_app

    with running_server(create_ledger_app()) as url:
        browser.get(f"{url}/web")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        assert browser.find_element(By.ID, "tools-panel").is_displayed()
        picker = Select(browser.find_element(By.ID, "tool-select"))
        assert [o.text for o in picker.options] == ["deposit", "withdraw", "balance"]
        browser.find_element(By.ID, "seed").send_keys("3")
        browser.find_element(By.ID, "reset-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "done") == "false")
        start = json.loads(browser.find_element(By.ID, "obs-json").get_attribute("textContent") or "{}")["observation"]["balance"]
        amount = browser.find_element(By.CSS_SELECTOR, "#tool-form [data-arg='amount']")
        assert amount.get_attribute("type") == "number"
        amount.send_keys("7")
        browser.find_element(By.ID, "tool-call-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "tool-result") == str(start + 7))
        picker.select_by_visible_text("withdraw")
        browser.find_element(By.CSS_SELECTOR, "#tool-form [data-arg='amount']").send_keys("999")
        browser.find_element(By.ID, "tool-call-btn").click()
        wait.until(lambda d: _idle(d) and "cannot withdraw" in _text(d, "tool-result"))
        # The reward lives in the env's state: reaching the target shows 1, not a step's 0.
        target = json.loads(browser.find_element(By.ID, "obs-json").get_attribute("textContent") or "{}")["observation"]["target"]
        gap = target - (start + 7)
        if gap:
            picker.select_by_visible_text("deposit" if gap > 0 else "withdraw")
            browser.find_element(By.CSS_SELECTOR, "#tool-form [data-arg='amount']").send_keys(str(abs(gap)))
            browser.find_element(By.ID, "tool-call-btn").click()
        else:
            picker.select_by_visible_text("balance")
            browser.find_element(By.ID, "tool-call-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "reward") == "1")


@pytest.mark.timeout(90)
def test_page_builds_an_action_form_from_a_typed_action(browser: WebDriver) -> None:
    with running_server(create_app(NumberGuessEnv, GuessAction, GuessObservation)) as url:
        browser.get(f"{url}/web")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        browser.find_element(By.ID, "reset-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "done") == "false")
        # One number input for `guess: int`, not a bare {} JSON box.
        assert not browser.find_element(By.ID, "action-json").is_displayed()
        guess = browser.find_element(By.CSS_SELECTOR, "#action-form [data-arg='guess']")
        assert guess.is_displayed() and guess.get_attribute("type") == "number"
        guess.send_keys("7")
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda d: _idle(d) and _text(d, "step-count") == "1")
        assert browser.find_element(By.ID, "model-view").get_attribute("textContent") == "you said 7"


@pytest.mark.timeout(120)
def test_page_shows_what_the_scheduler_gives_the_model_for_a_textarena_game(browser: WebDriver) -> None:
    import asyncio

    from envsdk.env import RolloutRequest
    from envsdk.schedulers import OpenEnvScheduler
    from servers.textarena.app import create_textarena_app
    from servers.textarena.pool import GamePool

    class Guess:
        async def act(self, messages: list[dict[str, Any]]) -> str:
            return "[3]"

    pool = GamePool(workers=1)
    try:
        with running_server(create_textarena_app("GuessTheNumber-v0", game_pool=pool)) as url:
            row = RolloutRequest(data_dict={"env_config": {"base_url": url, "seed": 5}})
            [traj] = asyncio.run(OpenEnvScheduler(max_turns=1).run([row], Guess()))
            given = [m["content"] for m in traj.messages if m["role"] == "user"]
            browser.get(f"{url}/web")
            wait = WebDriverWait(browser, 20)
            wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
            browser.find_element(By.ID, "seed").send_keys("5")
            browser.find_element(By.ID, "reset-btn").click()
            wait.until(lambda d: _idle(d) and _text(d, "done") == "false")
            shown = [browser.find_element(By.ID, "model-view").get_attribute("textContent")]
            browser.find_element(By.ID, "action-text").send_keys("[3]")
            browser.find_element(By.ID, "step-btn").click()
            wait.until(lambda d: _idle(d) and _text(d, "step-count") == "1")
            shown.append(browser.find_element(By.ID, "model-view").get_attribute("textContent"))
    finally:
        pool.shutdown()
    # Character for character: the page asks the server's copy of the scheduler's function.
    assert shown == given and len(given) == 2
