"""Rollouts from the command line: ``envsdk rollout --env sudoku --policy oracle --episodes 64``.

`run_rollouts` runs N episodes (seeds S..S+N-1) of one environment with one policy, writes
every trajectory to ``completions.jsonl`` as it finishes, shows a progress bar, and returns the
trajectories with a `RolloutSummary`. Without a base URL it starts what it needs itself: the
Sudoku server in a background uvicorn on a free 127.0.0.1 port, or a local `Env` in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envsdk.env import RolloutRequest
from envsdk.errors import EnvNotFoundError
from envsdk.rewards.parts import REWARD_PARTS
from envsdk.schedulers import (
    GYMScheduler,
    MultiTurnScheduler,
    OpenEnvScheduler,
    Policy,
    SudokuScheduler,
    Trajectory,
    TrajectoryWriter,
)

__all__ = [
    "RolloutSummary",
    "RolloutReport",
    "summarize",
    "make_scheduler",
    "make_requests",
    "run_rollouts",
    "add_rollout_parser",
    "rollout_command",
    "main",
]

SUDOKU = "sudoku"
# One server's base URL, or several (a pool; a string may also name a pool or a replicas file).
BaseUrls = str | list[str]
_POLICIES = ("oracle", "random", "openai", "transformers")


# ---------------------------------------------------------------- summary


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of a non-empty sequence."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stat:
    mean: float
    p50: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            return cls(math.nan, math.nan, math.nan)
        return cls(sum(values) / len(values), _quantile(values, 0.5), _quantile(values, 0.9))


@dataclass(frozen=True)
class RolloutSummary:
    """Aggregates of a batch of trajectories (what the CLI prints)."""

    episodes: int
    successes: int
    statuses: dict[str, int]
    total_reward: Stat
    components: dict[str, Stat]
    turns: Stat
    steps: int
    elapsed_s: float
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def render(self) -> str:
        """A plain-text table."""
        statuses = ", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items()))
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        lines = [
            f"{'episodes':<16}{self.episodes}",
            f"{'success rate':<16}{self.success_rate:.1%} ({self.successes}/{self.episodes})",
            f"{'statuses':<16}{statuses}",
            f"{'steps':<16}{self.steps} in {self.elapsed_s:.2f} s ({self.steps_per_s:.1f} steps/s)",
            f"{'errors':<16}{errors}",
            "",
            f"{'':<16}{'mean':>10}{'p50':>10}{'p90':>10}",
        ]
        rows = [("total_reward", self.total_reward), *sorted(self.components.items()), ("turns", self.turns)]
        for name, stat in rows:
            lines.append(f"{name:<16}{stat.mean:>10.3f}{stat.p50:>10.3f}{stat.p90:>10.3f}")
        return "\n".join(lines)


def summarize(trajectories: Sequence[Trajectory], elapsed_s: float) -> RolloutSummary:
    """Success rate, reward and component statistics, turns, throughput and errors by kind.

    Components are the numeric scalars a scheduler put in ``rollout_infos`` and the episode's
    named reward parts (``rollout_infos["reward_parts"]``: any environment's rubric parts),
    averaged over the trajectories that have them.
    """
    components: dict[str, list[float]] = {}
    for traj in trajectories:
        parts = traj.rollout_infos.get(REWARD_PARTS)
        merged = {**traj.rollout_infos, **(parts if isinstance(parts, dict) else {})}
        for key, value in merged.items():
            if key != "total_reward" and isinstance(value, (int, float)) and not isinstance(value, bool):
                components.setdefault(key, []).append(float(value))
    return RolloutSummary(
        episodes=len(trajectories),
        successes=sum(1 for t in trajectories if t.success),
        statuses=dict(Counter(t.status for t in trajectories)),
        total_reward=Stat.of([t.total_reward for t in trajectories]),
        components={k: Stat.of(v) for k, v in components.items()},
        turns=Stat.of([float(t.turns) for t in trajectories]),
        steps=sum(len(t.steps) for t in trajectories),
        elapsed_s=elapsed_s,
        errors=dict(Counter(t.error_kind or "unknown" for t in trajectories if t.status == "error")),
    )


@dataclass
class RolloutReport:
    trajectories: list[Trajectory]
    summary: RolloutSummary


# ---------------------------------------------------------------- runner


def make_scheduler(
    env: str,
    *,
    base_url: BaseUrls | None = None,
    max_turns: int | None = None,
    concurrency: int = 8,
    max_completion_chars: int | None = None,
) -> MultiTurnScheduler:
    """The scheduler for `env`: Sudoku → `SudokuScheduler`; another name with a base URL →
    `OpenEnvScheduler`; else a registered local `Env` → `GYMScheduler` (raises
    `EnvNotFoundError`, listing the known names, when there is none)."""
    turns: dict[str, Any] = {"max_turns": max_turns} if max_turns is not None else {}
    if env == SUDOKU:
        return SudokuScheduler(
            max_concurrent_envs=concurrency, max_completion_chars=max_completion_chars, **turns
        )
    if base_url is not None:
        return OpenEnvScheduler(
            base_url=base_url, max_concurrent_envs=concurrency, max_completion_chars=max_completion_chars, **turns
        )
    from envsdk.registry import envs

    envs[env]  # fail now, with the list of names, rather than once per episode
    return GYMScheduler(env, max_completion_chars=max_completion_chars, **turns)


def make_requests(
    env: str, episodes: int, seed: int, base_url: BaseUrls | None = None, env_config: dict[str, Any] | None = None
) -> list[RolloutRequest]:
    """One row per episode, seeds ``seed .. seed + episodes - 1``; `env_config` (e.g.
    ``{"rubric": "shaped"}``) is copied into every row's ``env_config``."""
    rows = []
    for i in range(episodes):
        config: dict[str, Any] = {**(env_config or {}), "name": env, "seed": seed + i}
        if base_url is not None:
            config["base_url"] = base_url
        rows.append(RolloutRequest(messages=[], data_dict={"env_config": config}))
    return rows


@contextlib.contextmanager
def _embedded_server(env: str, base_url: BaseUrls | None, concurrency: int) -> Iterator[BaseUrls | None]:
    """The base URL to use: the given one, a Sudoku server started here, or None (local env)."""
    if base_url is not None or env != SUDOKU:
        yield base_url
        return
    from envsdk.testing import running_server
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=max(concurrency, 1))) as url:
        yield url


async def run_rollouts(
    env: str,
    policy: Policy,
    *,
    episodes: int = 8,
    seed: int = 0,
    concurrency: int = 8,
    max_turns: int | None = None,
    base_url: BaseUrls | None = None,
    out: str | Path | None = None,
    progress: bool = True,
    scheduler: MultiTurnScheduler | None = None,
    env_config: dict[str, Any] | None = None,
) -> RolloutReport:
    """Run `episodes` episodes of `env` with `policy`, at most `concurrency` at once.

    Trajectories are written to `out` (JSON lines) as they finish. A failing episode is
    recorded (status ``error``), never raised.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(_embedded_server(env, base_url, concurrency))
        sched = scheduler or make_scheduler(env, base_url=url, max_turns=max_turns, concurrency=concurrency)
        writer = stack.enter_context(TrajectoryWriter(out)) if out is not None else None
        bar = None
        if progress:
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            bar = stack.enter_context(tqdm(total=episodes, desc=f"rollout {env}", unit="ep", file=sys.stderr))

        def finished(traj: Trajectory) -> None:
            if writer is not None:
                writer.write(traj)
            if bar is not None:
                bar.update(1)

        started = time.perf_counter()
        trajectories = await sched.run(
            make_requests(env, episodes, seed, url, env_config), policy, max_concurrency=concurrency, on_done=finished
        )
        elapsed = time.perf_counter() - started
    return RolloutReport(trajectories, summarize(trajectories, elapsed))


# ---------------------------------------------------------------- CLI


def add_rollout_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``rollout`` command to an argparse subparsers object; its ``func`` default is
    `rollout_command`."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rollout",
        help="run episodes of an environment with a policy and print a summary",
        description="Run N episodes (seeds S..S+N-1), write completions.jsonl, print a summary.",
    )
    parser.add_argument("--env", required=True, help="sudoku, frozen_lake, or a plugin's env name")
    parser.add_argument(
        "--base-url", nargs="+", default=None,
        help="server URL, or several (a pool: each episode goes to the least-loaded one), or a pool "
        "name or a --replicas-file; without it the env is started here",
    )
    parser.add_argument(
        "--policy",
        default="oracle",
        help=f"{', '.join(_POLICIES)}, or 'module:attribute' naming a policy class made with no arguments",
    )
    parser.add_argument("--model", default=None, help="model name (openai) or local path (transformers)")
    parser.add_argument("--api-base", default=None, help="OpenAI-compatible endpoint (policy openai)")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--env-config", type=_json_object, default=None, metavar="JSON",
        help='extra env_config for every episode, e.g. \'{"rubric": "shaped"}\' (FrozenLake\'s shaped rubric)',
    )
    parser.add_argument("--external-plugins", nargs="*", default=[], metavar="FILE")
    parser.add_argument("--out", default="completions.jsonl", help="JSON-lines file of trajectories")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=rollout_command)
    return parser


def _policy_from_args(args: argparse.Namespace) -> Policy:
    if ":" in args.policy:
        from envsdk.registry import import_object

        try:
            custom: Policy = import_object(args.policy)()
        except ImportError as exc:
            raise ValueError(f"cannot import policy {args.policy!r}: {exc}") from exc
        return custom
    from envsdk.policies import make_policy

    kwargs: dict[str, Any] = {}
    if args.model is not None:
        kwargs["model_path" if args.policy == "transformers" else "model"] = args.model
    if args.api_base is not None:
        kwargs["base_url"] = args.api_base
    policy: Policy = make_policy(args.policy, args.env, **kwargs)
    return policy


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def rollout_command(args: argparse.Namespace) -> int:
    """Run the ``rollout`` command; print the summary; exit status 0, or 2 on a usage error."""
    from envsdk.registry import load_plugins

    if args.external_plugins:
        load_plugins(args.external_plugins)
    try:
        policy = _policy_from_args(args)
        report = asyncio.run(
            run_rollouts(
                args.env,
                policy,
                episodes=args.episodes,
                seed=args.seed,
                concurrency=args.concurrency,
                max_turns=args.max_turns,
                base_url=args.base_url[0] if args.base_url and len(args.base_url) == 1 else args.base_url,
                out=args.out,
                progress=not args.no_progress,
                env_config=args.env_config,
            )
        )
    except (EnvNotFoundError, ValueError) as exc:
        print(f"envsdk rollout: error: {exc}", file=sys.stderr)
        return 2
    print(report.summary.render())
    if args.out:
        print(f"\ntrajectories written to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m envsdk.rollout …`` — the ``rollout`` command on its own."""
    parser = argparse.ArgumentParser(prog="envsdk")
    add_rollout_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rollout", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
