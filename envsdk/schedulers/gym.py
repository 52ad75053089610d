"""`GYMScheduler`: local, in-process `Env`s chosen by name (ms-swift's GYM scheduler, fixed).

Compared with ms-swift: the env is closed on every end (ms-swift leaks it at ``max_turns``),
a completion cut by length is dealt with by the scheduler's ``cut_replies`` rule (by default not
stepped, and the episode's reward gets the format penalty), each step's ``info`` is kept, and an
env error ends only its own trajectory. The env reads the conversation with each assistant
message's reasoning apart (``reasoning_content``): its ``content`` is the reply alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from envsdk.env import Env
from envsdk.registry import Registry, envs
from envsdk.rewards.parts import REWARD_PARTS, components_from, episode_parts, evaluated
from envsdk.schedulers.base import DEFAULT_CUT_RULE, CutRule, MultiTurnScheduler, StepRecord, Trajectory, TurnResult

__all__ = ["GYMScheduler"]


@dataclass
class _GymEpisode:
    env: Env
    next_observation: str | None = None


class GYMScheduler(MultiTurnScheduler):
    """Runs `envsdk.env.Env` instances looked up in `registry` (default `envsdk.registry.envs`).

    The env's name is the row's ``env_config["name"]``, else ``gym_env``. Reset replaces the
    row's messages with ``[system?, user(observation)]``; every turn steps the env with the
    whole conversation; ``rollout_infos`` = ``{total_reward, step_rewards, step_infos,
    reset_info}``.

    A reply cut by the length limit scores 0.0 under the ``penalty`` rule (`format_penalty`):
    what an ``Env`` of this kind gives a reply it cannot read (FrozenLake's does), so a 0/1
    reward stays 0/1; give ``cut_penalty`` for an env that scores such a reply otherwise.
    """

    format_penalty: float = 0.0

    def __init__(
        self,
        gym_env: str | None = None,
        *,
        registry: Registry[Any] | None = None,
        max_turns: int = 10,
        max_completion_chars: int | None = None,
        cut_replies: CutRule = DEFAULT_CUT_RULE,
        cut_penalty: float | None = None,
    ) -> None:
        super().__init__(
            max_turns=max_turns, max_completion_chars=max_completion_chars, cut_replies=cut_replies,
            cut_penalty=cut_penalty,
        )
        self.gym_env = gym_env
        self.registry = registry if registry is not None else envs

    def _episode(self, trajectory: Trajectory) -> _GymEpisode:
        episode = trajectory.runtime
        if not isinstance(episode, _GymEpisode):
            raise RuntimeError(f"trajectory {trajectory.uuid} has no environment (not started)")
        return episode

    async def on_trajectory_start(self, trajectory: Trajectory) -> None:
        config = trajectory.env_config
        name = config.get("name", self.gym_env)
        if not name:
            raise ValueError("no env name: set env_config['name'] in the row or GYMScheduler(gym_env=...)")
        env_cls = self.registry[name]
        env = env_cls(config)
        trajectory.runtime = _GymEpisode(env=env)
        observation, info, system_message = await env.reset(trajectory.request)
        trajectory.reset_info = dict(info or {})
        messages: list[dict[str, Any]] = []
        if system_message:
            messages.append({"role": "system", "content": system_message})
        messages.append({"role": "user", "content": observation})
        trajectory.messages = messages

    async def on_turn_end(self, trajectory: Trajectory, response_text: str, turn: int) -> TurnResult:
        episode = self._episode(trajectory)
        started = time.perf_counter()
        observation, reward, done, info = await episode.env.step([dict(m) for m in trajectory.messages])
        duration = time.perf_counter() - started
        trajectory.steps.append(
            StepRecord(
                turn=turn,
                action=response_text,
                observation=observation,
                reward=float(reward),
                done=bool(done),
                info=dict(info or {}),
                components=evaluated(components_from(info)),
                duration_s=duration,
            )
        )
        trajectory.total_reward = sum(trajectory.step_rewards)
        episode.next_observation = observation
        infos: dict[str, Any] = {
            "total_reward": trajectory.total_reward,
            "step_rewards": trajectory.step_rewards,
            "step_infos": [s.info for s in trajectory.steps],
            "reset_info": trajectory.reset_info,
        }
        if any(s.components for s in trajectory.steps):
            infos[REWARD_PARTS] = episode_parts(s.components for s in trajectory.steps)
        return {"done": bool(done), "rollout_infos": infos}

    async def step(self, trajectory: Trajectory, turn_result: TurnResult, turn: int) -> None:
        episode = self._episode(trajectory)
        trajectory.messages.append({"role": "user", "content": episode.next_observation})

    async def on_trajectory_end(self, trajectory: Trajectory) -> None:
        episode = trajectory.runtime
        if isinstance(episode, _GymEpisode):
            await episode.env.close()
