"""The /web routes: on by default, off by config, env or CLI flag; the Sudoku endpoints give
exactly what SudokuScheduler computes."""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from envsdk.cli import _add_serve, _build_app
from envsdk.games.sudoku import count_filled, parse_board, solve
from envsdk.rollout import make_requests
from envsdk.schedulers.sudoku import SudokuScheduler, sudoku_hints
from envsdk.server import ServerConfig, create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation
from envsdk.types import Action
from envsdk.web import text_field


def _echo_app(**overrides: Any) -> Any:
    return create_app(EchoEnvironment, EchoAction, EchoObservation, **overrides)


def test_web_page_and_its_assets_are_served_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVSDK_WEB", raising=False)
    with TestClient(_echo_app()) as client:
        page = client.get("/web")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert '/web/static/app.js' in page.text and '/web/static/style.css' in page.text
        script = client.get("/web/static/app.js")
        assert script.status_code == 200 and "new WebSocket" in script.text
        assert client.get("/web/static/style.css").status_code == 200
        info = client.get("/web/api/info").json()
        assert info["name"] == "EchoEnvironment"
        assert info["text_field"] == "message"
        assert info["reset_parameters"] is None  # EchoEnvironment.reset takes **kwargs


@pytest.mark.parametrize("how", ["config", "env"])
def test_web_page_can_be_switched_off(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "env":
        monkeypatch.setenv("ENVSDK_WEB", "0")
        app = _echo_app()
    else:
        monkeypatch.delenv("ENVSDK_WEB", raising=False)
        app = _echo_app(config=ServerConfig(web=False))
    with TestClient(app) as client:
        assert client.get("/web").status_code == 404
        assert client.get("/web/static/app.js").status_code == 404
        assert client.post("/web/api/sudoku/hints", json={"board": [[0] * 9] * 9}).status_code == 404
        assert client.get("/health").status_code == 200


def test_unreadable_envsdk_web_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVSDK_WEB", "maybe")
    with pytest.raises(ValueError, match="ENVSDK_WEB"):
        ServerConfig()


def test_serve_no_web_flag_builds_the_app_without_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVSDK_WEB", "1")  # restored after the test; --no-web overrides it
    parser = argparse.ArgumentParser()
    _add_serve(parser.add_subparsers())
    args = parser.parse_args(["serve", "envsdk.testing:EchoEnvironment", "--no-web"])
    with TestClient(_build_app(args)) as client:
        assert client.get("/web").status_code == 404
        assert client.get("/health").status_code == 200


def test_text_field_is_only_a_single_string_field() -> None:
    class TwoFields(Action):
        message: str
        count: int

    class NumberField(Action):
        value: int

    assert text_field(EchoAction) == "message"
    assert text_field(TwoFields) is None
    assert text_field(NumberField) is None


@pytest.mark.timeout(60)
def test_hints_endpoint_gives_the_schedulers_hints(sudoku_url: str) -> None:
    board = httpx.post(f"{sudoku_url}/reset", json={"seed": 11}, timeout=30).json()["observation"]["board"]
    tried = [(1, 1, 5), (2, 2, 3)]
    reply = httpx.post(f"{sudoku_url}/web/api/sudoku/hints", json={"board": board, "tried": tried}, timeout=10)
    assert reply.status_code == 200
    expected = sudoku_hints(board, tried)
    body = reply.json()
    assert body["text"] == expected.render()
    assert [tuple(m) for m in body["guaranteed"]] == list(expected.guaranteed)
    assert [tuple(m) for m in body["tried"]] == tried
    assert [(o["row"], o["col"], tuple(o["digits"])) for o in body["options"]] == list(expected.options)


@pytest.mark.timeout(30)
def test_sudoku_endpoints_refuse_a_board_that_is_not_9_by_9(sudoku_url: str) -> None:
    reply = httpx.post(f"{sudoku_url}/web/api/sudoku/hints", json={"board": [[0] * 9] * 8}, timeout=10)
    assert reply.status_code == 422
    assert "9 rows of 9" in reply.text


class _MixedSudokuPolicy:
    """Correct move, the same move again, a correct move, a wrong digit, a correct move, then a
    reply with no move: every branch of the reward."""

    def __init__(self) -> None:
        self.first = ""

    async def act(self, messages: list[dict[str, Any]]) -> str:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        board = parse_board(messages[-1]["content"])
        assert board is not None
        solution = solve(board)
        assert solution is not None
        empty = [(r, c) for r in range(9) for c in range(9) if board[r][c] == 0]
        r, c = empty[0]
        if turn == 1:  # repeat the first move (its cell is now filled)
            return self.first
        if turn == 3:
            wrong = next(d for d in range(1, 10) if d != solution[r][c])
            return f"[{r + 1} {c + 1} {wrong}]"
        if turn == 5:
            return "I give up"
        move = f"[{r + 1} {c + 1} {solution[r][c]}]"
        if turn == 0:
            self.first = move
        return move


@pytest.mark.timeout(60)
async def test_reward_endpoint_reproduces_the_schedulers_components(sudoku_url: str) -> None:
    scheduler = SudokuScheduler(max_turns=10)
    [trajectory] = await scheduler.run(make_requests("sudoku", 1, 5, sudoku_url), _MixedSudokuPolicy())
    assert trajectory.status == "done", trajectory.reason
    assert trajectory.rollout_infos["format_penalty"] == -1.0
    assert [s.components["repetition"] for s in trajectory.steps][:2] == [0.0, -2.0]

    initial = parse_board(trajectory.messages[1]["content"])
    assert initial is not None
    steps = [
        {
            "message": s.action["message"],
            "board": s.observation["board"],
            "verdict": s.observation["last_move"]["verdict"],
            "reason": s.observation["last_move"]["reason"],
            "reward": s.reward,
        }
        for s in trajectory.steps
    ]
    # The unparsable reply the scheduler never sent; the page would have sent it.
    steps.append({"message": "I give up", "board": steps[-1]["board"], "verdict": "bad_format", "reward": 0.0})
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.post(
            f"{sudoku_url}/web/api/sudoku/reward",
            json={"initial_board": initial, "initial_filled": count_filled(initial), "steps": steps},
        )
    assert reply.status_code == 200
    body = reply.json()
    assert body["per_step"] == [s.components for s in trajectory.steps]
    expected = {k: trajectory.rollout_infos[k] for k in body["components"]}
    assert body["components"] == pytest.approx(expected)
    assert body["components"]["total_reward"] == pytest.approx(trajectory.total_reward)
    assert "format_penalty -1" in body["note"]
    assert body["model_view"].startswith(f"Step {len(trajectory.steps)}. Progress: ")
