"""``envsdk check-env`` on the TextArena session class, once per offline game: every rule holds
(return shapes, the process-wide generator left alone, seeds under 8 concurrent resets, seeded
episodes replayed step for step, idempotent close)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from envsdk.checker import RULES, check_env
from servers.textarena import TextArenaEnvironment
from servers.textarena.pool import GamePool
from tests.servers.textarena_games import OFFLINE_GAMES

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pool() -> Iterator[GamePool]:
    games = GamePool(workers=2)
    yield games
    games.shutdown()


@pytest.mark.parametrize("env_id", list(OFFLINE_GAMES))
def test_check_env_passes_every_rule(pool: GamePool, env_id: str) -> None:
    players, moves = OFFLINE_GAMES[env_id]
    factory = functools.partial(TextArenaEnvironment, env_id, num_players=players, game_pool=pool)
    report = check_env(factory, seed=3, concurrency=8, max_steps=200, replies=moves)
    assert set(report.passed) | set(report.skipped) == set(RULES)
    # Nothing skipped: the step after done is refused by the envsdk server the episode is
    # replayed through.
    assert report.skipped == {} and "step.after_done_refused" in report.passed, report.skipped
    assert report.episode_steps > 0
