"""TRL's GRPOTrainer on the real Sudoku server through both adapters, on CPU with a tiny model."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("trl")

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from envsdk.integrations.trl import (
    SUDOKU_REWARD_COMPONENTS,
    EnvironmentCapacityError,
    env_reward_func,
    make_rollout_func,
    required_env_sessions,
    reward_component_funcs,
    sudoku_environment_factory,
    with_env_reward,
)
from envsdk.schedulers import SudokuScheduler
from envsdk.testing import running_server

from .steering import MOVES, steering_bias

STEPS = 3


def _config(out: Path, **overrides: Any) -> GRPOConfig:
    settings: dict[str, Any] = {
        "output_dir": str(out),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_steps": STEPS,
        "logging_steps": 1,
        "learning_rate": 1e-2,
        "save_strategy": "no",
        "seed": 0,
    }
    settings.update(overrides)
    return GRPOConfig(**settings)


def _snapshot(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed(model: Any, before: dict[str, torch.Tensor]) -> int:
    return sum(not torch.equal(before[name], p) for name, p in model.named_parameters())


def _active_sessions(url: str) -> int:
    return int(httpx.get(f"{url}/health", timeout=5).json()["active_sessions"])


def _logged(trainer: Any, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def _tool_tokenizer(model_dir: Path) -> Any:
    """The tiny tokenizer with TRL's Qwen3 chat template, which renders tools and tool calls."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    return tokenizer


def _tool_call(row: int, col: int, number: int) -> str:
    call = {"name": "place", "arguments": {"row": row, "col": col, "number": number}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@pytest.mark.timeout(240)
def test_environment_factory_trains_on_sudoku_rewards_and_releases_sessions(
    tiny_model_dir: Path, sudoku_url: str, tmp_path: Path
) -> None:
    tokenizer = _tool_tokenizer(tiny_model_dir)
    factory = sudoku_environment_factory(sudoku_url, max_turns=5)
    seen: list[list[float]] = []

    def recorded_env_reward(completions: list[Any], environments: list[Any], **kwargs: Any) -> list[float]:
        # Before TRL's own get_reward column: what the environments hold when rewards are computed.
        seen.append([env.trajectory.total_reward for env in environments])
        return [0.0] * len(completions)

    args = _config(
        tmp_path,
        max_completion_length=1024,
        max_tool_calling_iterations=3,
        generation_kwargs={"sequence_bias": steering_bias(tokenizer, [_tool_call(*m) for m in MOVES])},
        reward_weights=[0.0] * (1 + len(SUDOKU_REWARD_COMPONENTS)),
    )
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "Solve the Sudoku with the place tool."}], "seed": i} for i in range(8)]
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = _snapshot(model)
    with factory:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[recorded_env_reward, *reward_component_funcs()],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            environment_factory=factory,
            callbacks=[factory.callback()],
        )
        trainer.train()
        # get_reward released every session already: nothing waits for close().
        assert _active_sessions(sudoku_url) == 0

    env_column = _logged(trainer, "rewards/SudokuToolEnvironment/mean")
    assert len(env_column) == STEPS and len(seen) == STEPS
    for logged, totals in zip(env_column, seen):
        assert logged == pytest.approx(sum(totals) / len(totals), abs=1e-5)
    assert all(_logged(trainer, f"rewards/{name}/mean") for name in SUDOKU_REWARD_COMPONENTS)
    assert min(_logged(trainer, "tools/call_frequency")) >= 1.0
    played = [env.trajectory for env in factory._instances if env.trajectory is not None]
    assert played and all(t.steps for t in played)
    assert len({t.seed for t in played}) >= 1 and all(t.seed is not None for t in played)
    assert factory.instances == 4  # TRL's pool: one instance per rollout of the generation batch
    assert _changed(model, before) > 0


class _RecordingTrainer(GRPOTrainer):
    """GRPOTrainer that keeps what it computed per batch (the real trainer, nothing replaced)."""

    batches: list[dict[str, Any]]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        self.batches = [*getattr(self, "batches", []), output]
        return output


def _segments(ids: list[int], mask: list[int], value: int) -> list[list[int]]:
    runs: list[list[int]] = []
    current: list[int] = []
    for token, m in zip(ids, mask):
        if m == value:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


@pytest.mark.timeout(240)
def test_rollout_func_trains_with_environment_tokens_masked(
    tiny_model_dir: Path, sudoku_url: str, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollout = make_rollout_func(SudokuScheduler(base_url=sudoku_url, max_turns=3), seed=100)
    outputs: list[dict[str, Any]] = []
    trajectories: list[Any] = []

    def recording_rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = rollout(prompts, trainer)
        outputs.append({k: list(v) if isinstance(v, list) else v for k, v in out.items()})
        trajectories.append(rollout.last_trajectories)
        return out

    received: list[list[float | None]] = []

    def recorded(completions: list[Any], env_reward: list[float | None], **kwargs: Any) -> list[float]:
        received.append(list(env_reward))
        return [0.0] * len(completions)

    funcs, weights = with_env_reward([recorded, *reward_component_funcs()], [0.0] * 6, env_weight=1.0)
    max_completion = 1024
    args = _config(
        tmp_path,
        max_completion_length=max_completion,
        reward_weights=weights,
        generation_kwargs={"sequence_bias": steering_bias(tokenizer, [f"[{r} {c} {n}]" for r, c, n in MOVES])},
    )
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Play Sudoku."}]}] * 8)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = _snapshot(model)
    trainer = _RecordingTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=recording_rollout,
    )
    trainer.train()

    assert len(outputs) == STEPS and _active_sessions(sudoku_url) == 0
    multi_turn = 0
    group_seeds: list[int] = []
    for out, trajs, batch in zip(outputs, trajectories, trainer.batches):
        # Environment rewards reached the reward functions, the env column and its log.
        totals = [t.total_reward for t in trajs]
        assert out["env_reward"] == pytest.approx(totals)
        for name in SUDOKU_REWARD_COMPONENTS:
            assert out[name] == pytest.approx([t.rollout_infos[name] for t in trajs])
        # A batch here is one group (4 rollouts of one prompt): it shares one board.
        seeds = [t.seed for t in trajs]
        assert seeds == [seeds[0]] * 4
        group_seeds.append(seeds[0])
        tool_mask = batch["tool_mask"]
        for row, traj in enumerate(trajs):
            ids, mask = out["completion_ids"][row], out["env_mask"][row]
            assert len(ids) == len(mask) <= max_completion
            # The trainer received env_mask as its loss mask (padding with 1 is cut off by completion_mask).
            assert tool_mask[row, : len(mask)].tolist() == mask
            replies = [m["content"] for m in traj.messages if m["role"] == "assistant"]
            observations = [m["content"] for m in traj.messages[2:] if m["role"] == "user"]
            model_runs = [tokenizer.decode(run, skip_special_tokens=True) for run in _segments(ids, mask, 1)]
            env_runs = [tokenizer.decode(run, skip_special_tokens=True) for run in _segments(ids, mask, 0)]
            assert model_runs == replies[: len(model_runs)]
            if len(model_runs) < len(replies):  # the next observation did not fit the completion budget
                assert traj.status == "length" and replies[len(model_runs) :] == [""]
            # Zeros exactly where the environment spoke: between two replies, the observation, templated.
            assert len(env_runs) == len(model_runs) - 1
            for text, observation in zip(env_runs, observations):
                assert text.strip() == f"user\n{observation}\nassistant".strip()
            multi_turn += len(env_runs) > 0
    assert multi_turn > 0
    assert len(set(group_seeds)) == STEPS  # every group gets its own board
    assert received == [out["env_reward"] for out in outputs]
    logged = _logged(trainer, "rewards/env_reward_func/mean")
    assert logged == pytest.approx([sum(r) / len(r) for r in received], abs=1e-5)  # type: ignore[arg-type]
    assert _changed(model, before) > 0


@pytest.mark.timeout(60)
def test_full_server_stops_training_with_the_max_concurrent_envs_needed(tiny_model_dir: Path, tmp_path: Path) -> None:
    from servers.sudoku.app import create_sudoku_app

    tokenizer = _tool_tokenizer(tiny_model_dir)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "Play."}], "seed": i} for i in range(8)])
    args = _config(tmp_path, max_steps=1, max_completion_length=32)
    assert required_env_sessions(args) == 4
    with running_server(create_sudoku_app(max_concurrent_envs=2)) as url:
        factory = sudoku_environment_factory(url)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            environment_factory=factory,
        )
        started = time.monotonic()
        with factory, pytest.raises(EnvironmentCapacityError) as caught:
            trainer.train()
        assert time.monotonic() - started < 30
        assert caught.value.needed == 4
        assert "MAX_CONCURRENT_ENVS=4" in str(caught.value) and url in str(caught.value)
        assert _active_sessions(url) == 0  # the two sessions that did open were released


def test_with_env_reward_puts_the_environment_column_last() -> None:
    def other(completions: list[Any], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    funcs, weights = with_env_reward([other], [0.5], env_weight=2.0)
    assert funcs == [other, env_reward_func] and weights == [0.5, 2.0]
    assert with_env_reward() == ([env_reward_func], [1.0])
    with pytest.raises(ValueError, match="1 reward_funcs"):
        with_env_reward([other], [1.0, 2.0])
    assert env_reward_func(["a", "b"], env_reward=[1.5, None]) == [1.5, None]
    with pytest.raises(ValueError, match="environment_factory"):
        env_reward_func(["a"])
    assert math.isnan(sudoku_environment_factory("http://127.0.0.1:9")().get_reward())


@pytest.mark.timeout(30)
def test_openenv_environment_factory_plays_and_releases_its_session() -> None:
    from envsdk.integrations.trl import openenv_environment_factory
    from envsdk.server import create_app
    from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

    with running_server(create_app(EchoEnvironment, EchoAction, EchoObservation, max_concurrent_envs=4)) as url:
        factory = openenv_environment_factory(url, max_turns=2)
        env = factory()
        assert "ready" in (env.reset(prompt=[{"role": "user", "content": "go"}], seed=3) or "")
        assert _active_sessions(url) == 1
        assert env.act('{"message": "hello"}') == "hello"  # the observation's text, as the model reads it
        assert "over" in env.act("abcd")  # max_turns=2 reached: the episode ended and closed
        assert _active_sessions(url) == 0
        assert env.get_reward() == pytest.approx(0.5 + 0.4)
        env.reset(seed=4)
        factory.close()  # an episode TRL left open is released by close()
        assert _active_sessions(url) == 0


def test_local_environment_factory_runs_a_local_env_by_name() -> None:
    from envsdk.envs.frozen_lake import FrozenLakeGame, shortest_path
    from envsdk.integrations.trl import local_environment_factory

    env = local_environment_factory("frozen_lake", max_turns=20)()
    first = env.reset(env_config={"seed": 5, "size": 4})
    assert first and "P" in first and "G" in first
    game = FrozenLakeGame.generate(size=4, p=0.8, seed=5)
    path = shortest_path(game.grid, game.start, game.goal)
    assert path
    text = ""
    for direction in path:
        text = env.act(f"<action>{direction}</action>")
    assert "over" in text
    assert env.get_reward() == 1.0
