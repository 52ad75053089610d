"""What both TRL adapters share: typed errors, the session count a run needs, dataset rows."""

from __future__ import annotations

import logging
import os
from typing import Any

from envsdk.errors import EnvSDKError
from envsdk.schedulers.base import MultiTurnScheduler, Trajectory

logger = logging.getLogger("envsdk.integrations.trl")

Message = dict[str, Any]


class EnvironmentCapacityError(EnvSDKError):
    """The environment server refused a session: it already holds ``MAX_CONCURRENT_ENVS``.

    ``needed`` is how many sessions this training run holds at once; the server must allow
    at least that many (plus whatever else uses it).
    """

    def __init__(self, message: str, *, needed: int, base_url: str | None) -> None:
        super().__init__(message)
        self.needed = needed
        self.base_url = base_url


class EpisodeError(EnvSDKError):
    """An episode could not start or continue (the scheduler recorded an error)."""


def _world_size() -> int:
    # accelerate/torchrun export WORLD_SIZE to every process; a plain `python train.py` has none.
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def required_env_sessions(args: Any, num_processes: int | None = None) -> int:
    """Sessions a GRPO run holds at once with ``environment_factory``: TRL resets one pooled
    instance per rollout of a generation batch before generating it, i.e.
    ``per_device_train_batch_size × steps_per_generation`` per process (or the eval batch, if
    larger), times the number of processes. `args` is a ``GRPOConfig`` (after its
    ``__post_init__``, which fills ``steps_per_generation``)."""
    processes = num_processes if num_processes is not None else _world_size()
    steps = int(getattr(args, "steps_per_generation", None) or 1)
    per_process = int(args.per_device_train_batch_size) * steps
    eval_batch = getattr(args, "per_device_eval_batch_size", None)
    if getattr(args, "eval_strategy", "no") not in ("no", None) and eval_batch:
        per_process = max(per_process, int(eval_batch))
    return per_process * processes


def _capacity_error(trajectory: Trajectory, scheduler: MultiTurnScheduler, needed: int, how: str) -> EnvironmentCapacityError:
    base_url = trajectory.env_config.get("base_url") or getattr(scheduler, "base_url", None)
    where = f"The environment server at {base_url}" if base_url else "The environment server"
    return EnvironmentCapacityError(
        f"{where} refused a new session because it is at its MAX_CONCURRENT_ENVS limit "
        f"({trajectory.reason}). This training run holds up to {needed} sessions at once ({how}). "
        f"Restart the server with MAX_CONCURRENT_ENVS={needed} or more (the MAX_CONCURRENT_ENVS "
        f"environment variable, or max_concurrent_envs= in create_app), or make the generation "
        f"batch smaller.",
        needed=needed,
        base_url=base_url,
    )


def _data_dict(row: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as a `RolloutRequest` data dict: every column but ``prompt``; a ``seed``
    column becomes ``env_config["seed"]`` unless the row has an ``env_config`` with a seed."""
    data = {k: v for k, v in row.items() if k != "prompt"}
    config = data.get("env_config")
    env_config = dict(config) if isinstance(config, dict) else {}
    if "seed" in data and data["seed"] is not None and "seed" not in env_config:
        env_config["seed"] = data["seed"]
    data["env_config"] = env_config
    return data

