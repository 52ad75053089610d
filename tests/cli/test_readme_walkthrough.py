"""The README's walk-through, as a reader does it: ``my_env.py`` written exactly as the README's
snippet shows (its ``...`` filled in), then the README's commands in an empty temporary folder
with no PYTHONPATH — check-env (every rule runs, none is skipped), serve, rollout with the
default policy, report — and the env played by hand on ``/web`` in headless Chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import REPO, ServeFn, envsdk
from tests.docs.blocks import commands, doc_block
from tests.web.conftest import headless_chromium


def _readme_commands() -> list[str]:
    """The commands of the README's walk-through (its block ``walkthrough``), without the
    ``&`` that puts the server in the background."""
    return [line.rstrip("&").strip() for line in commands(doc_block("README.md", "walkthrough"))]


@pytest.fixture
def browser() -> Iterator[object]:
    yield from headless_chromium()


@pytest.mark.timeout(300)
def test_the_readme_walkthrough_from_an_empty_folder(folder: Path, serve: ServeFn, browser: object) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    check, serve_line, rollout_line, report_line = _readme_commands()
    assert check == "envsdk check-env my_env:MyEnv"
    assert serve_line == "envsdk serve my_env:MyEnv --port 8000"
    assert rollout_line.startswith("envsdk rollout --env my_env --base-url http://127.0.0.1:8000")
    assert report_line == "envsdk report completions.jsonl"

    checked = envsdk(*check.split()[1:], cwd=folder)
    assert checked.returncode == 0, checked.stderr
    assert re.search(r": 10 rules passed, 0 skipped; the checked episode ended", checked.stdout), checked.stdout

    # Served on a free port rather than 8000: the rest of the line as the README writes it.
    url = serve(*serve_line.split()[2:-2], cwd=folder)
    rollout_args = rollout_line.replace("http://127.0.0.1:8000", url).split()[1:]
    rolled = envsdk(*rollout_args, "--no-progress", cwd=folder)
    assert rolled.returncode == 0, rolled.stderr
    records = [json.loads(line) for line in (folder / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 8 and {r["status"] for r in records} == {"done"} and {r["turns"] for r in records} == {3}
    assert sorted(r["seed"] for r in records) == list(range(8))  # written as they finish
    reported = envsdk(*report_line.split()[1:], cwd=folder)  # matplotlib: the test extra has it
    assert reported.returncode == 0, reported.stderr
    assert (folder / "completions_report" / "report.html").is_file()

    wait = WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,))
    text = lambda element_id: str(browser.find_element(By.ID, element_id).text)  # noqa: E731
    idle = lambda d: d.execute_script("return document.body.dataset.busy === '0'")  # noqa: E731
    browser.get(f"{url}/web")
    wait.until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
    assert text("env-name") == "MyEnv"
    assert not browser.find_element(By.ID, "variant-label").is_displayed()  # MyEnv has no env_id
    action = browser.find_element(By.ID, "action-text")
    assert action.get_attribute("placeholder") == "text for `message`"
    browser.find_element(By.ID, "seed").send_keys("5")
    browser.find_element(By.ID, "reset-btn").click()
    wait.until(lambda d: idle(d) and text("obs-view") == "say something (seed 5)")
    assert text("step-count") == "0"
    for n, word in enumerate(("hello", "again"), start=1):
        action.clear()
        action.send_keys(word)
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda d, n=n: idle(d) and text("step-count") == str(n))
        assert text("obs-view") == f"you said {word!r}"  # the observation's text, not raw JSON
        assert text("reward") == str(len(word))
    history = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#history li")]
    assert len(history) == 3
    assert "say something (seed 5)" in history[0] and "you said 'hello'" in history[1]
    assert httpx.get(url + "/health", timeout=5).json()["active_sessions"] == 1



def _user_turns(record: dict) -> list[tuple[str, str]]:
    """(user message, the assistant reply before it, or "" for the first) of one record."""
    turns, previous = [], ""
    for message in record["messages"]:
        if message["role"] == "assistant":
            previous = message["content"]
        elif message["role"] == "user":
            turns.append((message["content"], previous))
    return turns


def _rollout_lines(prefix: str) -> list[str]:
    """The commands of docs/rollouts.md's first block that start with `prefix`."""
    return [line for line in commands(doc_block("docs/rollouts.md", "rollouts")) if line.startswith(prefix)]


@pytest.mark.timeout(400)
def test_what_the_model_reads_in_the_readmes_rollouts_is_the_envs_text(folder: Path, serve: ServeFn) -> None:
    """The README's rollouts of its own env, of the tool example and of the example dataset:
    every user message the model received is the env's text, exactly (no JSON dump)."""
    import asyncio
    import shutil

    from envsdk.env import RolloutRequest
    from envsdk.envs.frozen_lake import FrozenLakeEnv

    # The README's env, served and rolled out as its walk-through says.
    rollout_line = _readme_commands()[2]
    url = serve("my_env:MyEnv", cwd=folder)
    rolled = envsdk(*rollout_line.replace("http://127.0.0.1:8000", url).split()[1:], "--no-progress", cwd=folder)
    assert rolled.returncode == 0, rolled.stderr
    records = [json.loads(line) for line in (folder / "completions.jsonl").read_text(encoding="utf-8").splitlines()]
    for record in records:
        turns = _user_turns(record)
        assert turns[0] == (f"say something (seed {record['seed']})", "")
        assert len(turns) == 3 and all(text == f"you said {reply!r}" for text, reply in turns[1:]), turns

    # The tool example, served as the README says, played with tool calls.
    shutil.copy(REPO / "examples" / "ledger_tools.py", folder / "ledger_tools.py")
    assert "python examples/ledger_tools.py --port 8000" in (REPO / "README.md").read_text(encoding="utf-8")
    ledger = serve(cwd=folder, module="ledger_tools")
    tools = envsdk("rollout", "--env", "ledger", "--base-url", ledger, "--episodes", "2", "--max-turns", "3",
                   "--out", "tools.jsonl", "--no-progress", cwd=folder)
    assert tools.returncode == 0, tools.stderr
    for record in (json.loads(line) for line in (folder / "tools.jsonl").read_text(encoding="utf-8").splitlines()):
        rng = __import__("random").Random(record["seed"])
        start, target = rng.randint(0, 20) * 5, rng.randint(0, 20) * 5
        turns = _user_turns(record)
        assert turns[0] == (f"The ledger holds {start}. Bring it to exactly {target} with the deposit and withdraw tools.", "")
        assert "<tools>" in record["messages"][0]["content"] and '"deposit"' in record["messages"][0]["content"]
        for text, reply in turns[1:]:
            assert reply.startswith("<tool_call>"), reply
            # The tool's value, as text, in the <tool_response> block a Qwen template renders a tool turn in.
            assert re.fullmatch(r"<tool_response>\n(-?\d+|error: .+)\n</tool_response>", text), text

    # The documented dataset line, from a folder holding the examples.
    shutil.copytree(REPO / "examples" / "data", folder / "examples" / "data")
    line = next(l for l in _rollout_lines("envsdk rollout --dataset examples/data/frozen_lake"))
    data = envsdk(*line.split()[1:], "--out", "rows.jsonl", "--no-progress", cwd=folder)
    assert data.returncode == 0, data.stderr
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 128
    for record in rows[:16]:
        env = FrozenLakeEnv({"seed": record["seed"]})
        request = RolloutRequest(data_dict={"env_config": {"name": "frozen_lake", "seed": record["seed"]}})
        first, _, _ = asyncio.run(env.reset(request))
        turns = _user_turns(record)
        assert turns[0] == (first, "") and "<placeholder>" not in json.dumps(record["messages"])
        assert not any(text.lstrip().startswith("{") for text, _ in turns), turns
