"""SudokuScheduler end to end against real Sudoku servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from envsdk.env import RolloutRequest
from envsdk.policies import SudokuOraclePolicy
from envsdk.schedulers import SudokuScheduler, Trajectory

from .policies import Output, SolutionScript, last_board, play_both_ways

pytestmark = pytest.mark.timeout(60)


def _rows(url: str, seeds: list[int], **reset_kwargs: Any) -> list[RolloutRequest]:
    config: dict[str, Any] = {"base_url": url}
    if reset_kwargs:
        config["reset_kwargs"] = reset_kwargs
    return [RolloutRequest(data_dict={"env_config": {**config, "seed": s}}) for s in seeds]


async def _one(url: str, policy: Any, seed: int = 5, max_turns: int = 100, **reset_kwargs: Any) -> Trajectory:
    [traj] = await SudokuScheduler(max_turns=max_turns).run(_rows(url, [seed], **reset_kwargs), policy)
    return traj


async def test_oracle_solves_every_episode_with_a_perfect_score(sudoku_url: str) -> None:
    trajs = await SudokuScheduler().run(_rows(sudoku_url, list(range(8))), SudokuOraclePolicy())
    for traj in trajs:
        assert traj.status == "done" and traj.success and traj.reason == "solved", traj.reason
        assert traj.reset_info["observation_form"] == "structured"
        assert traj.reset_info["observation_form_requested"] == "compact"
        # Compact frames carry only the new text, not the rules again.
        assert "Rules and Instructions" not in json.dumps(traj.steps[0].observation)
        infos = traj.rollout_infos
        assert infos["correct"] == 1.0 and infos["valid_move"] == 1.0 and infos["empty_cell"] == 1.0
        assert infos["repetition"] == 0.0 and infos["progress"] == 1.0
        assert traj.total_reward == pytest.approx(4.0)
        # The record says what total_reward is: the shaped total, while step_rewards sum to 1.
        record = traj.to_dict()
        assert sum(record["step_rewards"]) == pytest.approx(1.0)
        assert record["infos"]["total_reward_is"].startswith("shaped: mean(empty_cell)")
        assert traj.steps[-1].components["total"] == pytest.approx(4.0)
        assert traj.turns == len(traj.steps) == infos["cells_filled"] >= 20  # Sudoku-v0: ~60 clues


async def test_a_subclass_reads_moves_and_builds_actions_its_own_way(sudoku_url: str) -> None:
    """`parse_move` and `parse_action` overrides decide the move scored and the action sent."""
    sent: list[str] = []

    class Shifted(SudokuScheduler):
        def parse_move(self, text: str) -> tuple[int, int, int] | None:
            r, c, n = (int(x) for x in text.strip("<>").split(","))
            return r, c, n

        def parse_action(self, text: str) -> dict[str, Any]:
            sent.append(text)
            r, c, n = self.parse_move(text) or (0, 0, 0)
            return {"message": f"[{r} {c} {n}]"}

    oracle = SudokuOraclePolicy()

    class Commas:
        async def act(self, messages: list[dict[str, Any]]) -> str:
            return "<" + ",".join((await oracle.act(messages)).strip("[]").split()) + ">"

    [traj] = await Shifted(max_turns=3).run(_rows(sudoku_url, [5]), Commas())
    assert traj.status == "max_turns" and len(sent) == 3, traj.reason
    assert [s.info["verdict"] for s in traj.steps] == ["valid"] * 3
    assert [s.action["message"] for s in traj.steps] == ["[" + t.strip("<>").replace(",", " ") + "]" for t in sent]


async def test_messages_show_board_progress_and_hints(sudoku_url: str) -> None:
    [traj] = await SudokuScheduler(max_turns=3, hints="all").run(_rows(sudoku_url, [5]), SudokuOraclePolicy())
    assert traj.status == "max_turns"
    first, later = traj.messages[1]["content"], traj.messages[3]["content"]
    assert traj.messages[0]["role"] == "system" and "[row column number]" in traj.messages[0]["content"]
    assert "GUARANTEED MOVES (only one option):" in first and "Step" not in first
    assert later.startswith("Step 1. Progress: 1 cells filled.")
    # The oracle's moves are all accepted: none is listed as rejected.
    assert "MOVES REJECTED" not in later and "GUARANTEED MOVES" in later
    assert last_board([traj.messages[3]]) != last_board([traj.messages[1]])


async def test_by_default_no_move_of_the_solution_is_shown(sudoku_url: str) -> None:
    traj = await _one(sudoku_url, SudokuOraclePolicy(), max_turns=3)
    assert traj.rollout_infos["hints"] == "rejected"
    for message in traj.messages[1:]:
        assert "GUARANTEED MOVES" not in message["content"] and "Other options" not in message["content"]


async def test_repeating_one_move_costs_doubling_penalties(sudoku_url: str) -> None:
    policy = SolutionScript(["good"] + ["first"] * 5)
    traj = await _one(sudoku_url, policy, max_turns=6, error_allowance=10)
    assert traj.status == "max_turns"
    reps = [s.components["repetition"] for s in traj.steps]
    assert reps == [0.0, -2.0, -4.0, -8.0, -10.0, -10.0]
    assert [s.components["valid_move"] for s in traj.steps] == [1.0] + [-0.5] * 5
    assert [s.components["empty_cell"] for s in traj.steps] == [1.0] + [-1.0] * 5
    assert traj.rollout_infos["repetition"] == pytest.approx(sum(reps) / 6)


async def test_default_allowance_ends_on_second_consecutive_invalid_move(sudoku_url: str) -> None:
    traj = await _one(sudoku_url, SolutionScript(["good", "filled", "filled"]))
    assert traj.status == "done" and not traj.success
    assert len(traj.steps) == 3 and traj.steps[-1].done
    assert traj.reason is not None and traj.reason.startswith("game lost: invalid move")
    assert traj.steps[-1].info["verdict"] == "invalid"
    assert 0 < traj.rollout_infos["correct"] < 1  # TextArena's fraction on a loss


async def test_unparseable_reply_costs_one_and_ends_the_episode(sudoku_url: str) -> None:
    good = await _one(sudoku_url, SolutionScript(["good"]), max_turns=1)
    traj = await _one(sudoku_url, SolutionScript(["good", "junk", "good"]))
    assert traj.status == "done" and traj.turns == 2 and len(traj.steps) == 1
    assert traj.rollout_infos["unparseable_reply"] is True and traj.rollout_infos["format_penalty"] == -1.0
    assert traj.total_reward == pytest.approx(good.total_reward - 1.0)
    assert "unparseable" in (traj.reason or "")
    first_turn_junk = await _one(sudoku_url, SolutionScript(["junk"]))
    assert first_turn_junk.total_reward == -1.0 and first_turn_junk.steps == []


@pytest.mark.timeout(90)
async def test_64_episodes_stopped_at_max_turns_leave_no_sessions(sudoku_url: str) -> None:
    trajs = await SudokuScheduler(max_turns=2, max_concurrent_envs=8).run(
        _rows(sudoku_url, list(range(100, 164))), SudokuOraclePolicy(), max_concurrency=64
    )
    assert [t.status for t in trajs] == ["max_turns"] * 64
    async with httpx.AsyncClient() as http:
        for _ in range(100):  # the server frees a slot when it sees the close frame
            health = (await http.get(f"{sudoku_url}/health")).json()
            if health["active_sessions"] == 0:
                break
            await asyncio.sleep(0.02)
    assert health["active_sessions"] == 0


SCRIPTS = [
    ["good", "filled", "good", "good", "filled", "filled"],  # ends on two consecutive invalid moves
    ["good", "good", "filled", "good", "junk"],  # ends on an unparseable reply
]


@pytest.mark.parametrize("script", SCRIPTS, ids=["lost", "unparseable"])
async def test_text_fallback_gives_the_same_rewards_as_structured_fields(
    sudoku_url: str, openenv_sudoku_url: str, script: list[str]
) -> None:
    structured = await _one(sudoku_url, SolutionScript(script), seed=11)
    text = await _one(openenv_sudoku_url, SolutionScript(script), seed=11)
    assert structured.reset_info["observation_form"] == "structured"
    assert text.reset_info["observation_form"] == "text"
    assert text.reset_info["observation_form_requested"] is None  # a plain OpenEnv server
    assert [s.action for s in text.steps] == [s.action for s in structured.steps]
    assert [s.components for s in text.steps] == [s.components for s in structured.steps]
    assert text.total_reward == pytest.approx(structured.total_reward)
    assert (text.status, text.success) == (structured.status, structured.success)


async def test_text_fallback_oracle_scores_four(openenv_sudoku_url: str) -> None:
    traj = await _one(openenv_sudoku_url, SudokuOraclePolicy(), seed=3)
    assert traj.status == "done" and traj.success and traj.total_reward == pytest.approx(4.0)


class _Then:
    """The oracle for `turns` replies, then `last` (a reply, an `Output`, or an exception raised)."""

    def __init__(self, turns: int, last: Any) -> None:
        self.oracle, self.turns, self.last = SudokuOraclePolicy(), turns, last

    async def act(self, messages: list[dict[str, Any]]) -> Any:
        if sum(m["role"] == "assistant" for m in messages) < self.turns:
            return await self.oracle.act(messages)
        if isinstance(self.last, Exception):
            raise self.last
        return self.last


@pytest.mark.parametrize(
    ("policy", "max_turns", "status"),
    [
        (SudokuOraclePolicy(), 100, "done"),  # solved
        (SudokuOraclePolicy(), 3, "max_turns"),
        (_Then(2, Output("[1 1", "length")), 100, "length"),
        (_Then(2, RuntimeError("policy failed")), 100, "error"),
        (_Then(2, "no move at all"), 100, "done"),  # unparseable: its own infos
        (_Then(1, "[1 1 1]"), 100, "done"),  # repeated until the error allowance ends the game
    ],
    ids=["solved", "max_turns", "length", "error", "unparseable", "lost"],
)
async def test_infos_given_once_at_the_end_equal_infos_given_every_turn(
    sudoku_url: str, policy: Any, max_turns: int, status: str
) -> None:
    """`envsdk rollout` lets the Sudoku scheduler give its rollout infos once, as an episode
    ends (each turn's infos were drawn from the whole episode so far): whatever ended the
    episode, its record is the one a scheduler giving them every turn writes."""
    records, results = await play_both_ways(SudokuScheduler, _rows(sudoku_url, [5]), policy, status, max_turns=max_turns)
    assert records[0] == records[1]
    assert records[1]["infos"]["moves_tried"] and "step_rewards" in records[1]
    every_turn, at_the_end = results
    assert all("rollout_infos" in r for r in every_turn)
    assert all("rollout_infos" not in r for r in at_the_end if not r["done"])
    assert len(at_the_end) >= 2 and "rollout_infos" not in at_the_end[0]
