"""How a TextArena game ended, as a user of ``envsdk rollout`` reads it: the TextArena server
started as its README says (a real ``python -m servers.textarena`` process, configured by its
environment variables), played by the installed ``envsdk`` console script from a temporary
folder with policies a user would write there.

A won game is a success (pass@k counts it), a lost or drawn one is not, the record keeps the
game's verdict (its final observation and the episode's ``reason``), and a server launched for
TicTacToe or ConnectFour plays them against its built-in opponent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envsdk.testing import free_port, stop_process
from tests.cli.conftest import await_health, envsdk, user_env

pytestmark = pytest.mark.timeout(300)

#: Policies a user writes beside their run (``--policy policies.py:Name``); each reads only the
#: conversation, as a model does.
POLICIES = '''
import re
from envsdk.policies.base import Policy


def _texts(messages, role):
    return [m["content"] for m in messages if m["role"] == role]


class Bisect(Policy):
    """GuessTheNumber by bisection: the hint after each guess halves the range."""

    async def act(self, messages):
        low, high = map(int, re.search(r"between (\\d+) and (\\d+)", _texts(messages, "user")[0]).groups())
        guess = None
        for message in messages:
            if message["role"] == "assistant":
                guess = int(re.search(r"\\[(\\d+)\\]", message["content"]).group(1))
            elif guess is not None and "higher" in message["content"]:
                low = guess + 1
            elif guess is not None and "lower" in message["content"]:
                high = guess - 1
        return f"[{(low + high) // 2}]"


class NoMove(Policy):
    """Never names a move: TextArena ends the game at its second invalid move."""

    async def act(self, messages):
        return "I would rather not guess."


_LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def _winner(board):
    for a, b, c in _LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return None


def _score(board, me, them, mover):
    """Minimax value for `me` (+1 win, 0 draw, -1 loss) with `mover` to play."""
    won = _winner(board)
    if won is not None:
        return 1 if won == me else -1
    free = [i for i in range(9) if board[i] == " "]
    if not free:
        return 0
    scores = []
    for cell in free:
        board[cell] = mover
        scores.append(_score(board, me, them, them if mover == me else me))
        board[cell] = " "
    return max(scores) if mover == me else min(scores)


class TicTacToeMinimax(Policy):
    """Perfect TicTacToe from the latest board the game showed: never loses."""

    async def act(self, messages):
        text = "\\n".join(_texts(messages, "user"))
        me = re.search(r"you will be '([XO])'", text).group(1)
        them = "O" if me == "X" else "X"
        rows = text.rsplit("Current Board:", 1)[1].strip().split("\\n")[0:5:2]
        board = [c.strip() if c.strip() in ("X", "O") else " " for row in rows for c in row.split("|")]
        best = max(
            (i for i in range(9) if board[i] == " "),
            key=lambda i: (_score(board[:i] + [me] + board[i + 1:], me, them, them), -i),
        )
        return f"[{best}]"


class ConnectFourLeftmost(Policy):
    """Drops its disc in the leftmost column with room: the scripted opponent beats it."""

    async def act(self, messages):
        text = "\\n".join(_texts(messages, "user"))
        top = text.rsplit("Board state:", 1)[1].strip().split("\\n")[2].split()
        return f"[col {top.index('.')}]"
'''


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _line(stdout: str, start: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith(start))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "policies.py").write_text(POLICIES, encoding="utf-8")
    return tmp_path


Launch = Callable[..., str]


@pytest.fixture
def launch(folder: Path) -> Iterator[Launch]:
    """``launch(TEXTARENA_ENV_ID=…, …)`` starts the README's ``TEXTARENA_…=… python -m
    servers.textarena`` in the folder (one game worker, a free port) and returns its base URL
    once ``/health`` answers; every server is stopped at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def start(**variables: str) -> str:
        port = free_port()
        env = {**user_env(), "TEXTARENA_GAME_WORKERS": "1", "PORT": str(port), **variables}
        proc = subprocess.Popen([sys.executable, "-m", "servers.textarena"], cwd=folder, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        return await_health(proc, url)

    yield start
    for proc in procs:
        stop_process(proc)


def test_a_won_game_is_a_success_and_a_lost_one_is_not(folder: Path, launch: Launch) -> None:
    """GuessTheNumber by bisection wins every game (reward 1.0): before, every record said
    success null and pass@1 read 0.000; the verdict was in no record and the reason said only
    "environment signalled done"."""
    url = launch()
    won = envsdk("rollout", "--env", "TextArenaEnvironment", "--base-url", url, "--policy", "policies.py:Bisect",
                 "--episodes", "3", "--rollouts-per-example", "2", "--no-progress", "--out", "won.jsonl", cwd=folder)
    assert won.returncode == 0, won.stderr
    records = _records(folder / "won.jsonl")
    assert len(records) == 6
    for record in records:
        assert record["status"] == "done" and record["total_reward"] == 1.0
        assert record["success"] is True
        assert record["reason"] == "environment signalled done: Congratulations! You guessed the correct number."
        # The lean record keeps the observation the game ended with, which no message holds.
        final = record["final_observation"]
        assert final["metadata"]["success"] is True
        assert final["messages"][-1]["content"].rstrip().endswith(
            "[GAME] Congratulations! You guessed the correct number."
        )
        assert "Congratulations" not in json.dumps(record["messages"])
    assert _line(won.stdout, "success rate") == "success rate    100.0% (6/6)"
    assert {"pass@1=1.000", "pass@2=1.000"} <= set(_line(won.stdout, "pass@k").split())
    assert json.loads((folder / "won.eval.json").read_text())["pass_at_k"] == {"1": 1.0, "2": 1.0}

    lost = envsdk("rollout", "--env", "TextArenaEnvironment", "--base-url", url, "--policy", "policies.py:NoMove",
                  "--episodes", "2", "--rollouts-per-example", "2", "--no-progress", "--out", "lost.jsonl", cwd=folder)
    assert lost.returncode == 0, lost.stderr
    for record in _records(folder / "lost.jsonl"):
        assert record["status"] == "done" and record["turns"] == 2
        assert record["success"] is False
        assert record["reason"].startswith("environment signalled done: Invalid Move: Invalid move format.")
        assert record["final_observation"]["metadata"]["success"] is False
    assert _line(lost.stdout, "success rate") == "success rate    0.0% (0/4)"
    assert {"pass@1=0.000", "pass@2=0.000"} <= set(_line(lost.stdout, "pass@k").split())


#: What each verdict means for the agent (player 0): its reward and whether it is a success.
VERDICTS = {
    "Player 0 has won!": (1.0, True),
    "The game is a draw!": (0.0, False),
    "Player 1 wins by connecting four!": (-1.0, False),
}


@pytest.mark.parametrize(
    ("env_id", "policy", "plays"),
    [
        # Perfect play draws against the scripted opponent (it blocks every line) and beats the
        # random one.
        ("TicTacToe-v0", "TicTacToeMinimax", {"scripted": {"The game is a draw!"}, "random": {"Player 0 has won!"}}),
        # The scripted opponent wins when it can and blocks: stacking the leftmost column loses.
        ("ConnectFour-v0", "ConnectFourLeftmost", {"scripted": {"Player 1 wins by connecting four!"}}),
    ],
)
def test_a_server_launched_for_a_two_player_game_plays_it_against_its_opponent(
    folder: Path, launch: Launch, env_id: str, policy: str, plays: dict[str, set[str]]
) -> None:
    """``TEXTARENA_ENV_ID=TicTacToe-v0 TEXTARENA_NUM_PLAYERS=2 python -m servers.textarena``
    refused every ``opponent`` reset ("TicTacToe-v0 has no built-in opponent"): the launcher's
    start-up check imported the game's module afresh, and the game the server then made was of
    another class than the one its opponents were registered for. A win is a success; a draw,
    like a loss, is not."""
    url = launch(TEXTARENA_ENV_ID=env_id, TEXTARENA_NUM_PLAYERS="2")
    for opponent, verdicts in plays.items():
        out = f"{opponent}.jsonl"
        result = envsdk(
            "rollout", "--env", "TextArenaEnvironment", "--base-url", url, "--policy", f"policies.py:{policy}",
            "--episodes", "3", "--max-turns", "30", "--env-config", json.dumps({"reset_kwargs": {"opponent": opponent}}),
            "--no-progress", "--out", out, cwd=folder,
        )
        assert result.returncode == 0, result.stderr
        records = _records(folder / out)
        assert len(records) == 3
        for record in records:
            assert record["status"] == "done", record["reason"]
            verdict = record["reason"].removeprefix("environment signalled done: ")
            assert verdict in verdicts, record["reason"]
            assert (record["total_reward"], record["success"]) == VERDICTS[verdict]
            final = record["final_observation"]
            assert final["metadata"]["success"] is VERDICTS[verdict][1]
            assert final["messages"][-1]["content"].rstrip().endswith(f"[GAME] {verdict}")
        wins = sum(VERDICTS[v][1] for v in verdicts)
        assert _line(result.stdout, "success rate") == f"success rate    {wins * 100:.1f}% ({wins * 3}/3)"


def test_self_play_states_no_success_and_pass_at_k_reads_n_a(folder: Path, launch: Launch) -> None:
    """One session playing both sides of TicTacToe wins and loses every game at once: no record
    states success, so pass@k is n/a, not the 0.000 it read (every unstated record counted as a
    failure). The verdict and the reward are kept all the same."""
    url = launch(TEXTARENA_ENV_ID="TicTacToe-v0", TEXTARENA_NUM_PLAYERS="2")
    result = envsdk(
        "rollout", "--env", "TextArenaEnvironment", "--base-url", url, "--policy", "policies.py:TicTacToeMinimax",
        "--episodes", "2", "--rollouts-per-example", "2", "--max-turns", "30", "--no-progress", cwd=folder,
    )
    assert result.returncode == 0, result.stderr
    for record in _records(folder / "completions.jsonl"):
        assert record["status"] == "done" and record["success"] is None
        assert record["final_observation"]["metadata"]["success"] is None
        verdict = record["reason"].removeprefix("environment signalled done: ")
        assert verdict in ("Player 0 has won!", "Player 1 has won!", "The game is a draw!"), record["reason"]
    assert _line(result.stdout, "success rate") == "success rate    n/a (neither the env nor the scheduler states success)"
    assert _line(result.stdout, "pass@k") == "pass@k          n/a (no record states success)"
    summary = json.loads((folder / "completions.eval.json").read_text())
    assert summary["pass_at_k"] is None and summary["success_not_stated"] == 4
    assert all(group["pass_at_k"] is None for group in summary["groups"])
