"""Rollouts from the command line: ``envsdk rollout --env sudoku --policy oracle --episodes 64``.

`run_rollouts` runs N episodes (seeds S..S+N-1) of one environment with one policy;
`run_batches` runs dataset rows (`load_dataset`: ms-swift's ``messages`` + ``env_config``), one
batch per environment. Both write every trajectory to ``completions.jsonl`` as it finishes
(`envsdk.records`), show a progress bar, and return the trajectories with a `RolloutSummary`.
Without a base URL they start what they need themselves: the Sudoku, coding or Harbor server
in a background uvicorn on a free 127.0.0.1 port, or a local `Env` in-process. The command checks servers,
token, capacity and the inference endpoint first (`envsdk.preflight`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import functools
import gc
import inspect
import json
import math
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from envsdk._process import flush_out, print_out
from envsdk.env import RolloutRequest
from envsdk.errors import EnvNotFoundError
from envsdk.evaluate import EVAL_KEY, add_eval_arguments, check_rollouts, finish_run, plan_run, resolve_run_options
from envsdk.policies import POLICY_NAMES
from envsdk.records import (
    FORMAT_PENALTY_INFO, LockFileError, RecordForm, RecordsBusy, RecordsWritten, basis_labels, episode_components, finite_number, hold_records, part_basis, mean_and_std, number_text, quantile, read_jsonl, success_text,
)
from envsdk.schedulers import (
    GYMScheduler,
    MultiTurnScheduler,
    OpenEnvScheduler,
    Policy,
    SudokuScheduler,
    Trajectory,
    TrajectoryWriter,
)
from envsdk.schedulers.base import CUT_REPLIES_INFO, CUT_RULE_TEXT, CUT_RULES, DEFAULT_CUT_RULE, CutRule
from envsdk.schedulers.sudoku import DEFAULT_HINTS, HINT_LEVELS, check_hints

if TYPE_CHECKING:
    from envsdk.client.pool import EnvPool

__all__ = [
    "RolloutSummary",
    "RolloutReport",
    "summarize",
    "EpisodeFacts",
    "make_scheduler",
    "make_requests",
    "load_dataset",
    "DatasetError",
    "UsageError",
    "Batch",
    "check_env_name",
    "run_batches",
    "run_rollouts",
    "add_rollout_parser",
    "rollout_command",
    "main",
]

_T = TypeVar("_T")

SUDOKU = "sudoku"
CODING = "coding"
HARBOR = "harbor"
#: Envs whose server `run_batches` starts here when no base URL is given.
EMBEDDED = (SUDOKU, CODING, HARBOR)
#: The names a Harbor server goes by: ``--env harbor``, and the one its ``/metadata`` gives.
HARBOR_NAMES = (HARBOR, "HarborEnvironment")
#: Turns of a Harbor episode at most unless --max-turns says otherwise: the Harbor server's
#: default step limit, so that its limit (which runs the verifier) ends an episode first.
HARBOR_MAX_TURNS = 100
# One server's base URL, or several (a pool; a string may also name a pool or a replicas file).
BaseUrls = str | list[str]


# ---------------------------------------------------------------- summary


@dataclass(frozen=True)
class Stat:
    """Mean, median and p90 (nearest rank) of `n` values."""

    mean: float
    p50: float
    p90: float
    n: int = 0

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(mean_and_std(values)[0], quantile(values, 0.5), quantile(values, 0.9), len(values))


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
    #: Episodes whose success was stated (by the env or the scheduler); None: all of them.
    judged: int | None = None
    #: Episodes whose last completion the length limit cut, and the rule that dealt with them
    #: (``--cut-replies``; None where it is not known).
    cut: int = 0
    cut_rule: str | None = None
    #: The format penalties the cut episodes got under the ``penalty`` rule, each value once
    #: (an env's own: Sudoku −1.0, a local `Env` 0.0), stated beside the rule.
    cut_penalties: tuple[float, ...] = ()
    #: What each component's episode value is (`envsdk.records.basis_labels`: ``summed over 3 steps``).
    component_bases: dict[str, str] = field(default_factory=dict)
    #: Episodes recorded per server (base URL, secrets masked), and of those the errors.
    servers: dict[str, int] = field(default_factory=dict)
    server_errors: dict[str, int] = field(default_factory=dict)
    #: Episodes played again on another server after their own failed them: how many attempts
    #: each server lost so (base URL, secrets masked).
    replayed: dict[str, int] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        """Successes over the episodes whose success was stated; NaN when none was."""
        judged = self.episodes if self.judged is None else self.judged
        return self.successes / judged if judged else math.nan

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def render(self) -> str:
        """A plain-text table; ``n`` is how many episodes each row is computed over."""
        statuses = ", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items()))
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        lines = [
            f"{'episodes':<16}{self.episodes}",
            f"{'success rate':<16}{self._success_text()}",
            f"{'statuses':<16}{statuses}",
            f"{'steps':<16}{self.steps} in {self.elapsed_s:.2f} s ({self.steps_per_s:.1f} steps/s)",
            f"{'errors':<16}{errors}",
            f"{'cut replies':<16}{self._cut_text()}",
            *([f"{'servers':<16}{self._servers_text()}"] if len(self.servers) > 1 or self.replayed else []),
            "",
            f"{'':<16}{'mean':>10}{'p50':>10}{'p90':>10}{'n':>6}",
        ]
        rows = [("total_reward", self.total_reward), ("turns", self.turns)]
        for name, stat in rows:
            lines.append(f"{name:<16}{number_text(stat.mean):>10}{number_text(stat.p50):>10}{number_text(stat.p90):>10}{stat.n:>6}")
        if self.components:
            lines.append(f"reward components ({len(self.components)}), each episode's value:")
            for name, stat in sorted(self.components.items()):
                basis = self.component_bases.get(name, "per episode")
                lines.append(
                    f"  {name:<14}{number_text(stat.mean):>10}{number_text(stat.p50):>10}{number_text(stat.p90):>10}"
                    f"{stat.n:>6}  {basis}"
                )
        return "\n".join(lines)

    def _cut_text(self) -> str:
        rule = self.cut_rule
        said = f"--cut-replies {rule}: {CUT_RULE_TEXT[rule]}" if rule in CUT_RULE_TEXT else f"--cut-replies {rule}"
        if self.cut_penalties:
            said += ": " + " or ".join(map(number_text, self.cut_penalties))
        return f"{self.cut} of {self.episodes}" + (f" ({said})" if rule else "")

    def _servers_text(self) -> str:
        """Episodes per server, their errors, and the episodes played again elsewhere."""
        parts = []
        for url, count in self.servers.items():
            errors = self.server_errors.get(url, 0)
            parts.append(f"{url} {count}" + (f" ({errors} error{'s' if errors != 1 else ''})" if errors else ""))
        if self.replayed:
            lost = ", ".join(f"{url} {count}" for url, count in self.replayed.items())
            count = sum(self.replayed.values())
            parts.append(f"{count} episode{'s' if count != 1 else ''} played again after their server failed them ({lost})")
        return ", ".join(parts)

    def _success_text(self) -> str:
        return success_text(self.successes, self.episodes if self.judged is None else self.judged, self.episodes)


class EpisodeFacts(NamedTuple):
    """What a run's summary and its closing checks read of an episode, kept when the episode's
    trajectory is not (`run_batches` with ``release``)."""

    status: str
    reason: str | None
    error_kind: str | None
    success: bool | None
    total_reward: float
    components: dict[str, float]
    turns: int
    steps: int
    truncated: bool = False
    #: How each component's value is made from its step values (`envsdk.records.part_basis`).
    bases: dict[str, tuple[frozenset[str], int]] | None = None
    #: The format penalty a cut reply got under the ``penalty`` rule, else None.
    cut_penalty: float | None = None
    #: The server that played it (`Trajectory.server`), and those of the attempts lost before.
    server: str | None = None
    lost_on: tuple[str, ...] = ()

    @classmethod
    def of(cls, trajectory: Trajectory) -> EpisodeFacts:
        t = trajectory
        components = episode_components(t)
        bases = {name: part_basis(value, [s.components.get(name) for s in t.steps]) for name, value in components.items()}
        infos = t.rollout_infos
        penalised = t.truncated and infos.get(CUT_REPLIES_INFO) == "penalty"
        return cls(
            t.status, t.reason, t.error_kind, t.success, t.total_reward, components, t.turns, len(t.steps),
            t.truncated, bases, finite_number(infos.get(FORMAT_PENALTY_INFO)) if penalised else None,
            t.server, tuple(
                str(a.get("server")) for a in infos.get(LOST_ATTEMPTS_INFO) or () if isinstance(a, dict)
            ),
        )


def summarize(
    trajectories: Sequence[Trajectory | EpisodeFacts], elapsed_s: float, cut_rule: str | None = None
) -> RolloutSummary:
    """Success rate, reward and component statistics, turns, throughput, errors by kind, and
    the episodes whose last completion was cut (`cut_rule`: the ``--cut-replies`` rule).

    Components are the episode values a scheduler declared in
    ``rollout_infos["reward_parts"]`` (any rubric's named parts; Sudoku: its five parts),
    each over the episodes that have it (its ``n``).
    """
    facts = [t if isinstance(t, EpisodeFacts) else EpisodeFacts.of(t) for t in trajectories]
    components: dict[str, list[float]] = {}
    for episode in facts:
        for key, value in episode.components.items():
            components.setdefault(key, []).append(value)
    return RolloutSummary(
        episodes=len(facts),
        successes=sum(1 for f in facts if f.success is True),
        judged=sum(1 for f in facts if f.success is not None),
        statuses=dict(Counter(f.status for f in facts)),
        total_reward=Stat.of([f.total_reward for f in facts]),
        components={k: Stat.of(v) for k, v in components.items()},
        turns=Stat.of([float(f.turns) for f in facts]),
        steps=sum(f.steps for f in facts),
        elapsed_s=elapsed_s,
        errors=dict(Counter(f.error_kind or "unknown" for f in facts if f.status == "error")),
        cut=sum(1 for f in facts if f.truncated),
        cut_rule=cut_rule,
        cut_penalties=tuple(sorted({f.cut_penalty for f in facts if f.cut_penalty is not None})),
        servers=dict(Counter(f.server for f in facts if f.server is not None)),
        server_errors=dict(Counter(f.server for f in facts if f.server is not None and f.status == "error")),
        replayed=dict(Counter(url for f in facts for url in f.lost_on)),
        component_bases=basis_labels(
            {name: [f.bases[name] for f in facts if f.bases is not None and name in f.bases] for name in components}
        ),
    )


@dataclass
class RolloutReport:
    trajectories: list[Trajectory]
    summary: RolloutSummary
    #: Why the run stopped before its last episode (see `run_batches`), else None.
    stopped: str | None = None
    #: What was written to ``out`` (`TrajectoryWriter.written`), when there was one.
    written: RecordsWritten | None = None
    #: Each finished episode's facts, in the order they finished (whole even when the
    #: trajectories were released).
    facts: list[EpisodeFacts] = field(default_factory=list)
    #: Why a finished episode's record could not be written to ``out`` (a full disk, a file
    #: size limit): the run stopped there, and ``stopped`` says so too. That episode, whose
    #: record is not in the file, is not among the trajectories, facts or summary. Else None.
    unwritten: str | None = None


#: Error kinds that say an episode's server is gone or unreachable, not that the episode went wrong.
CONNECTION_ERRORS = frozenset({
    "ConnectError", "SessionLostError", "ServerShutdownError", "ConnectionError", "ConnectionRefusedError",
    "ConnectionResetError", "ConnectionClosed", "ConnectionClosedError", "ConnectionClosedOK",
    "NoServerAvailableError",
})
#: Episodes in a row ending in a `CONNECTION_ERRORS` error on one server after which a batch
#: played on that server alone stops (one of a pool: once every server of the pool did so).
STOP_AFTER_CONNECTION_ERRORS = 5
#: Times an episode that its server failed is played again on another server of its pool.
REPLAYS_AFTER_SERVER_FAILURE = 1
#: The ``rollout_infos`` key (and record ``infos`` key) listing the attempts of an episode that
#: were lost with their server before the one recorded.
LOST_ATTEMPTS_INFO = "lost_attempts"


# ---------------------------------------------------------------- runner


class DatasetError(ValueError):
    """A ``--dataset`` file is missing or holds a row that is not a dataset row."""


def load_dataset(path: str | Path, default_env: str | None = None) -> list[RolloutRequest]:
    """The rows of an ms-swift-style JSON-lines dataset: each an object with ``env_config``
    (``name``, else `default_env`; ``base_url``, ``seed``, … as the scheduler reads them) and
    optionally ``messages`` and a ``uuid``. Raises `DatasetError` naming the file and line."""
    rows: list[RolloutRequest] = []
    for where, row in read_jsonl(path, DatasetError):
        config = row.get("env_config") if isinstance(row, dict) else None
        if isinstance(config, dict) and "name" not in config and default_env is not None:
            # ms-swift's rows for one env's scheduler name no env (examples/swift/sudoku.jsonl).
            config = row["env_config"] = {"name": default_env, **config}
        if not isinstance(config, dict) or not isinstance(config.get("name"), str):
            raise DatasetError(
                f'{where}: a row needs "env_config": {{"name": ENV, ...}} (or give --env ENV for rows without a name)'
            )
        seed = config.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            # A seed that is not an integer would be passed on as is: a string seeds another map,
            # and each env would read 1.5 or true its own way.
            raise DatasetError(f'{where}: "seed" must be an integer, got {json.dumps(seed)}')
        messages = row.get("messages") or []
        if not isinstance(messages, list):
            raise DatasetError(f"{where}: 'messages' must be a list of chat messages")
        data = {k: v for k, v in row.items() if k not in ("messages", "uuid")}
        uuid = row.get("uuid")
        # A row without a uuid is named by its position, so a resumed run knows which rows it played.
        rows.append(RolloutRequest(messages=messages, data_dict=data, uuid=str(uuid) if uuid is not None else f"row-{len(rows)}"))
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return rows


#: ``env_config`` keys any row may carry: read by the runner and every scheduler.
ROW_KEYS = frozenset({"name", "seed", "base_url"})
#: ... and those of a row played on a server (`OpenEnvScheduler`'s; the server's own reset
#: options go in ``reset_kwargs``, which the server checks against its ``reset`` signature).
SERVER_ROW_KEYS = frozenset({"reset_kwargs", "system_message", "formatter"})
#: ... and those a Sudoku row may add (`SudokuScheduler`'s ``hints`` for that episode).
SUDOKU_ROW_KEYS = frozenset({"hints"})


def check_env_config(env: str, config: dict[str, Any], *, on_server: bool, where: str) -> None:
    """Raise `UsageError` naming the accepted keys when `config` holds a key nobody reads: not
    one of `ROW_KEYS`, nor `SERVER_ROW_KEYS` for a row played on a server (`on_server`), nor
    one of a local env's declared ``CONFIG_KEYS``. A local env that declares none is not checked."""
    if on_server:
        accepted = ROW_KEYS | SERVER_ROW_KEYS | (SUDOKU_ROW_KEYS if env == SUDOKU else frozenset())
        if env == SUDOKU and "hints" in config:
            try:
                check_hints(config["hints"])
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}") from None
    else:
        from envsdk.registry import envs

        declared = getattr(envs[env], "CONFIG_KEYS", None) if env in envs else None
        if declared is None:
            return
        accepted = ROW_KEYS | frozenset(declared)
    unknown = sorted(k for k in config if k not in accepted)
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], sorted(accepted), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    # A key close to an accepted one is a typo of it, not an option of the server's reset.
    server_hint = (
        '; options of the server\'s reset go in {"reset_kwargs": {...}}, e.g. '
        f'{{"reset_kwargs": {{{json.dumps(unknown[0])}: {json.dumps(config[unknown[0]])}}}}}'
        if on_server and not close else ""
    )
    raise UsageError(
        f"{where}: {env} reads no env_config key {', '.join(map(repr, unknown))}{hint}; accepted: "
        f"{', '.join(sorted(accepted))}{server_hint}"
    )


#: Schemes of an environment server's URL (HTTP, or its WebSocket endpoint).
URL_SCHEMES = ("http", "https", "ws", "wss")


def check_base_url(url: str) -> None:
    """Raise `UsageError` for a ``host:port`` given without its scheme (it would be taken for a
    pool name and fail once per episode), a URL of another scheme than `URL_SCHEMES`, or one
    that no connection can be made with (`websocket_url` says why: a bad port, an unclosed IPv6
    address, a password in it); a message never repeats a URL's password."""
    import re

    from envsdk.client.client import websocket_url
    from envsdk.errors import BaseUrlError, mask_secrets

    shown = mask_secrets(url)
    if re.fullmatch(r"[\w.-]+:\d+(/.*)?", url) or re.fullmatch(r"\[[0-9a-fA-F:]+\]:\d+(/.*)?", url):
        raise UsageError(f"--base-url {shown!r} has no scheme: use 'http://{shown}'")
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() not in URL_SCHEMES:
        raise UsageError(
            f"--base-url {shown!r}: an environment server's URL starts with "
            f"{', '.join(s + '://' for s in URL_SCHEMES)}"
        )
    if sep:
        try:
            websocket_url(url)
        except BaseUrlError as exc:
            raise UsageError(f"--base-url {exc.url!r} {exc.problem}") from None
    else:
        from envsdk.client.pool import is_pool_spec

        if not is_pool_spec(url):  # else every episode would end in an error on it
            raise UsageError(
                f"--base-url {shown!r} is neither a URL (http://host:port), a registered pool name nor a file of base URLs"
            )


def check_env_name(env: str, base_url: BaseUrls | None) -> None:
    """Raise `EnvNotFoundError` (with the closest known names) when `env` can be neither served
    here nor reached: not Sudoku, no base URL, and not a registered local env."""
    from envsdk.registry import envs

    if env in EMBEDDED or base_url is not None or env in envs or env in _SERVED_HERE:
        return
    known = sorted({*EMBEDDED, *envs})
    close = difflib.get_close_matches(env, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise EnvNotFoundError(
        f"unknown environment {env!r}.{hint} Known here: {', '.join(known)}; a server's env needs"
        " --base-url, a plugin's --external-plugins FILE (or an installed package's `envsdk.envs`"
        " entry point)"
    )


def make_scheduler(
    env: str,
    *,
    base_url: BaseUrls | None = None,
    max_turns: int | None = None,
    concurrency: int = 8,
    max_completion_chars: int | None = None,
    scheduler: str | None = None,
    formatter: str | None = None,
    tool_format: str | None = None,
) -> MultiTurnScheduler:
    """The scheduler for `env`: the registered scheduler named `scheduler` when given; else
    Sudoku → `SudokuScheduler`; another name with a base URL → a `GYMScheduler` playing it as
    `RemoteEnv` when the server is a served local `Env` (`envsdk.adapters.serves_chat`), a
    `ToolScheduler` when it lists tools (`envsdk.schedulers.tools.serves_tools`), else
    `OpenEnvScheduler`; else a registered local `Env` → `GYMScheduler` (raises
    `EnvNotFoundError`, listing the known names, when there is none). `formatter` (a name in
    `envsdk.formats.formatters`) is how a server's observations become the model's text.
    `tool_format` (``native`` or ``text``) is the form a `ToolScheduler` plays a tool server in
    (default: the policy's); a `ValueError` for a scheduler that plays no tools.

    A named scheduler is built with the keyword arguments its constructor accepts among
    ``max_turns``, ``max_completion_chars``, ``max_concurrent_envs``, ``base_url``, ``gym_env``
    and ``formatter``."""
    built = _make_scheduler(
        env, base_url=base_url, max_turns=max_turns, concurrency=concurrency, max_completion_chars=max_completion_chars,
        scheduler=scheduler, formatter=formatter,
    )
    if tool_format is not None:
        from envsdk.schedulers.tools import TOOL_FORMATS, ToolScheduler

        if not isinstance(built, ToolScheduler):
            raise ValueError(
                f"--tool-format {tool_format}: {env} is not played with tool calls ({type(built).__name__}; a tool "
                "environment's server lists its tools over /mcp): leave --tool-format out"
            )
        built.tool_format = next(f for f in TOOL_FORMATS if f == tool_format)
    return built


def _make_scheduler(
    env: str,
    *,
    base_url: BaseUrls | None,
    max_turns: int | None,
    concurrency: int,
    max_completion_chars: int | None,
    scheduler: str | None,
    formatter: str | None,
) -> MultiTurnScheduler:
    if max_turns is None and env in HARBOR_NAMES:
        max_turns = HARBOR_MAX_TURNS
    turns: dict[str, Any] = {"max_turns": max_turns} if max_turns is not None else {}
    shown: dict[str, Any] = {"formatter": formatter} if formatter is not None else {}
    if scheduler is not None:
        from envsdk.registry import schedulers

        cls = schedulers[scheduler]
        offered: dict[str, Any] = {
            **turns, **shown, "max_completion_chars": max_completion_chars, "max_concurrent_envs": concurrency,
            "base_url": base_url, "gym_env": env,
        }
        params = inspect.signature(cls).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            accepted = {k: v for k, v in offered.items() if k in ("max_turns", "max_completion_chars", "formatter")}
        else:
            accepted = {k: v for k, v in offered.items() if k in params}
        built: MultiTurnScheduler = cls(**accepted)
        return built
    if env == SUDOKU:
        return SudokuScheduler(
            max_concurrent_envs=concurrency, max_completion_chars=max_completion_chars, **turns, **shown
        )
    if env == CODING:
        from envsdk.schedulers.coding import CodingScheduler

        return CodingScheduler(
            base_url=base_url, max_concurrent_envs=concurrency, max_completion_chars=max_completion_chars, **turns,
            **shown,
        )
    if base_url is not None:
        from envsdk.adapters import RemoteEnv, serves_chat
        from envsdk.registry import Registry
        from envsdk.schedulers.tools import ToolScheduler, serves_tools

        from envsdk.preflight import first_answering

        first = first_answering(base_url)  # not a member that is down: it says nothing
        is_url = first.startswith(("http", "ws"))
        if is_url and not shown and serves_chat(first):
            # A local Env served by `envsdk serve`: its action is the conversation, which
            # RemoteEnv passes through, so the env sees exactly what it would in-process.
            served: Registry[Any] = Registry("env")
            served[env] = RemoteEnv
            return GYMScheduler(env, registry=served, max_completion_chars=max_completion_chars, **turns)
        # A tool server played as a text env would never see a tool call: ask it (its /mcp).
        remote = ToolScheduler if is_url and serves_tools(first) else OpenEnvScheduler
        return remote(
            base_url=base_url, max_concurrent_envs=concurrency, max_completion_chars=max_completion_chars, **turns,
            **shown,
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
def _embedded_server(
    env: str, base_url: BaseUrls | None, concurrency: int, harbor_tasks: str | Path | None = None
) -> Iterator[BaseUrls | None]:
    """The base URL to use: the given one, a server started here (Sudoku, coding, Harbor's
    serving the task folders `harbor_tasks`, or an `Environment` class named with ``--env
    module:Class``), or None (a local env, played in-process)."""
    if base_url is not None or (env not in EMBEDDED and env not in _SERVED_HERE):
        yield base_url
        return
    from envsdk.testing import running_server

    capacity = max(concurrency, 1)
    stop_after = contextlib.ExitStack()
    if env in _SERVED_HERE:
        from envsdk.env import step_types
        from envsdk.server import create_app

        action, observation = step_types(_SERVED_HERE[env])
        if not isinstance(action, type) or not isinstance(observation, type):
            raise UsageError(
                f"--env {env}: cannot tell its action/observation types from step's annotations: serve it "
                "(envsdk serve MODULE:CLASS --action ... --observation ...) and pass --base-url"
            )
        app = create_app(_SERVED_HERE[env], action, observation, max_concurrent_envs=capacity, web=False)
    elif env == CODING:
        from servers.coding.app import create_coding_app

        app = create_coding_app(max_concurrent_envs=capacity, warm=capacity)
    elif env == HARBOR:
        app = _harbor_app(harbor_tasks, capacity)
    else:
        from servers.sudoku.app import BoardPool, create_sudoku_app

        # The run's own board workers, stopped with its server: the process-wide pool's would
        # still be starting a replacement worker as the interpreter exits.
        boards = BoardPool()
        stop_after.callback(boards.shutdown)
        app = create_sudoku_app(max_concurrent_envs=capacity, board_pool=boards)
    with stop_after, running_server(app) as url:
        yield url


def _harbor_app(tasks: str | Path | None, capacity: int) -> Any:
    """The Harbor server's app for the task folders `tasks` (every task's image built first,
    cached by content); `UsageError` when there are none, or no container engine can run them."""
    if tasks is None:
        raise UsageError(f"--env harbor plays Harbor task folders here: give {_HARBOR_TASKS_HINT}")
    from envsdk.sandbox import SandboxError
    from servers.harbor.app import create_harbor_app

    print(
        f"envsdk rollout: starting a Harbor server for {tasks} (each task's image is built the first time)",
        file=sys.stderr,
    )
    try:
        return create_harbor_app(tasks, max_concurrent_envs=capacity)
    except SandboxError as exc:
        raise UsageError(f"--env harbor: cannot run the tasks of {tasks} here: {_one_line(exc)}") from None


#: How to give Harbor's tasks, in the messages that ask for them.
_HARBOR_TASKS_HINT = (
    "--tasks DIR (a folder of Harbor task folders, or one task folder; the repository's are in "
    "servers/harbor/tasks), or --base-url of a running `python -m servers.harbor --tasks DIR`"
)


async def _enter_off_loop(stack: contextlib.AsyncExitStack, manager: contextlib.AbstractContextManager[_T]) -> _T:
    """Enter a blocking context manager (a server starting) in a worker thread, and have `stack`
    exit it in one (the server stopping). Cancelled while the thread is still entering, it waits
    for the thread and exits the manager before giving up: a server that started anyway is
    stopped, not left running."""
    entering = asyncio.ensure_future(asyncio.to_thread(manager.__enter__))
    try:
        value = await asyncio.shield(entering)
    except asyncio.CancelledError:
        await asyncio.wait([entering])
        if not entering.cancelled() and entering.exception() is None:
            await asyncio.to_thread(manager.__exit__, None, None, None)
        raise

    async def leave(
        exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        return bool(await asyncio.to_thread(manager.__exit__, exc_type, exc, tb))

    stack.push_async_exit(leave)
    return value


@dataclass
class Batch:
    """Rows that one scheduler runs with one policy (`harbor_tasks`: the task folders the
    Harbor server started for them serves, when they play ``harbor`` without a base URL)."""

    env: str
    requests: list[RolloutRequest]
    policy: Policy
    base_url: BaseUrls | None = None
    harbor_tasks: str | Path | None = None


async def run_batches(
    batches: Sequence[Batch],
    *,
    concurrency: int = 8,
    max_turns: int | None = None,
    out: str | Path | None = None,
    record: RecordForm = "lean",
    progress: bool = True,
    scheduler: str | MultiTurnScheduler | None = None,
    finished: list[Trajectory] | None = None,
    append: bool = False,
    stop_after_connection_errors: int | None = STOP_AFTER_CONNECTION_ERRORS,
    formatter: str | None = None,
    release: bool = False,
    facts: list[EpisodeFacts] | None = None,
    tool_format: str | None = None,
    on_replace: Callable[[], None] | None = None,
    cut_replies: CutRule | None = None,
    cut_penalty: float | None = None,
) -> RolloutReport:
    """Run every batch at once (each at most `concurrency` episodes at a time); trajectories
    come back in row order, batch after batch.

    A Sudoku batch without a base URL gets a server started here for the run. Trajectories are
    written to `out` (`record` form) and appended to `finished` as they end, so a caller that is
    interrupted still has them (appended to `out` with `append`, else `out` is rewritten; with
    `on_replace`, only once an episode ends without an error: `TrajectoryWriter`); their
    `EpisodeFacts` are appended to `facts` the same way (with `out`, once their records are
    written). A failing episode is recorded (status ``error``), never raised.

    `cut_replies` and `cut_penalty` set what a reply cut by the length limit gets on the
    schedulers made here (`envsdk.schedulers.base.CutRule`); a `scheduler` given as an object
    keeps its own. The summary counts the cut replies and names the rule.

    With `release` (and `out`), each trajectory keeps only how it ended once its record is
    written: its messages, steps, rollout infos, reset info and scheduler handle are dropped, so
    a run's memory does not grow with its episodes (a Sudoku episode kept whole is 200-300 KB).
    With the lean `record` form, the schedulers made here from envsdk's own classes also keep no
    step's observation but the last one's while an episode plays
    (`MultiTurnScheduler.keep_observations`). The report's summary and facts are the same
    either way.

    Failures are counted per server. An episode of a pool (several servers) that its server
    failed (its connection lost, or a deadline missed on a server the pool has ejected since:
    `envsdk.client.pool.EnvPool`) is played again from its reset on another server of the pool,
    up to `REPLAYS_AFTER_SERVER_FAILURE` times, when the pool still has one that answers; only
    the last attempt is recorded (``infos["lost_attempts"]`` lists those before it), so no
    episode is recorded twice, and one still failed is recorded once as an error, which
    ``--resume`` plays again. Episodes run through a `scheduler` given as an object are not
    played again (its methods are the caller's).

    A batch stops when no server can play it: for one server, when `stop_after_connection_errors`
    of its episodes in a row lost it (`CONNECTION_ERRORS`: it died, or cannot be reached); for a
    pool, when an episode lost its server and every server of the pool is down, or each lost that
    many episodes in a row. The episodes it had left are not started (other batches play on): the
    report then holds the finished trajectories and says why in ``stopped``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    total = sum(len(b.requests) for b in batches)
    if total < 1:
        raise ValueError("nothing to run: no episodes")
    done_list = finished if finished is not None else []
    done_facts = facts if facts is not None else []
    async with contextlib.AsyncExitStack() as stack:
        writer = stack.enter_context(TrajectoryWriter(out, record, append=append, on_replace=on_replace)) if out is not None else None
        bar = None
        if progress and sys.stderr is not None:  # started with stderr closed (``2>&-``): no bar
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            names = "+".join(dict.fromkeys(b.env for b in batches))
            bar = stack.enter_context(tqdm(total=total, desc=f"rollout {names}", unit="ep", file=sys.stderr))

        tasks: list[asyncio.Future[list[Trajectory]]] = []
        streaks: Counter[str | None] = Counter()  # per server: its episodes in a row that lost it
        stopped: list[str] = []
        unwritten: list[str] = []

        def on_done(traj: Trajectory, sched: MultiTurnScheduler, index: int) -> None:
            if writer is not None:
                # An episode whose record is not in the file is not counted: `--resume` plays it again.
                if unwritten:
                    return
                try:
                    writer.write(traj)
                except OSError as exc:
                    # Playing on would lose every later record too, while saying it wrote them.
                    unwritten.append(f"its record could not be written to {out}: {exc.strerror or exc}")
                    stopped.append(f"an episode's record could not be written ({exc.strerror or exc})")
                    for task in tasks:
                        task.cancel()
                    return
            done_list.append(traj)
            done_facts.append(EpisodeFacts.of(traj))
            if writer is not None and release:
                _release(traj)
            if bar is not None:
                bar.update(1)
            why = _no_server_can_play(traj, sched, streaks, stop_after_connection_errors)
            if why is not None and tasks[index].cancel():
                stopped.append(why)

        runs = []
        cut_rules: dict[str, None] = {}  # the rules of the batches' schedulers, in order
        for index, batch in enumerate(batches):
            # Starting a server and asking one what it serves block for seconds: in worker
            # threads, so that the caller's event loop (a trainer's) keeps running meanwhile.
            url = await _enter_off_loop(stack, _embedded_server(batch.env, batch.base_url, concurrency, batch.harbor_tasks))
            if url is not None and batch.base_url is None:
                for request in batch.requests:
                    request.data_dict.setdefault("env_config", {})["base_url"] = url
            sched = (
                scheduler
                if isinstance(scheduler, MultiTurnScheduler)
                else await asyncio.to_thread(
                    make_scheduler, batch.env, base_url=url, max_turns=max_turns, concurrency=concurrency,
                    scheduler=scheduler, formatter=formatter, tool_format=tool_format,
                )
            )
            if sched is not scheduler and cut_replies is not None:
                sched.cut_replies = cut_replies
                sched.cut_penalty = cut_penalty
            cut_rules.setdefault(sched.cut_replies)
            if sched is not scheduler and type(sched).__module__.startswith("envsdk."):
                # Nobody here reads a trajectory before it ends: its infos are wanted once.
                # A scheduler class of the user's own (a plugin's) may read them: kept as it is.
                sched.infos_each_turn = False
                if isinstance(sched, OpenEnvScheduler) and sched.max_concurrent_envs >= concurrency:
                    # Run once, `concurrency` at a time: its limit on steps in flight cannot bind.
                    sched.limit_steps = False
                if writer is not None and release and record == "lean":
                    # Its lean records hold no per-step observation, and nobody sees a trajectory
                    # after its record: no step need keep its observation while the episode plays.
                    sched.keep_observations = False
            if sched is not scheduler:
                _replay_lost_episodes(sched)
            runs.append(sched.run(
                batch.requests, batch.policy, max_concurrency=concurrency,
                on_done=functools.partial(on_done, sched=sched, index=index),
            ))
        cut_rule = "/".join(cut_rules) or None
        started = time.perf_counter()
        tasks.extend(asyncio.ensure_future(run) for run in runs)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - started
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not (stopped and isinstance(outcome, asyncio.CancelledError)):
            raise outcome
    written = writer.written if writer is not None else None
    if stopped:
        return RolloutReport(
            list(done_list), summarize(done_facts, elapsed, cut_rule), stopped[0], written, list(done_facts),
            unwritten[0] if unwritten else None,
        )
    trajectories = [t for result in outcomes if isinstance(result, list) for t in result]
    # Every trajectory passes `on_done`, unless a scheduler's own `run` skipped it.
    ended = list(done_facts) if len(done_facts) == len(trajectories) else [EpisodeFacts.of(t) for t in trajectories]
    return RolloutReport(trajectories, summarize(ended, elapsed, cut_rule), written=written, facts=ended)


def _pool_of(trajectory: Trajectory, scheduler: MultiTurnScheduler) -> EnvPool | None:
    """The pool the trajectory's episode is placed by, when its base URL (its row's, else its
    scheduler's) names several servers; None for one server or an env played here."""
    from envsdk.client.pool import is_pool_spec, shared_pool

    spec = trajectory.env_config.get("base_url") or getattr(scheduler, "base_url", None)
    if spec is None or not is_pool_spec(spec):
        return None
    try:
        return shared_pool(spec)
    except (ValueError, EnvNotFoundError):  # the scheduler found it so too: its episode says why
        return None


def _played_on(trajectory: Trajectory) -> str | None:
    """The base URL the episode was placed on, as its pool knows it (secrets not masked)."""
    base_url = getattr(trajectory.runtime, "base_url", None)
    return base_url if isinstance(base_url, str) else None


def _failed_by_server(trajectory: Trajectory, pool: EnvPool) -> bool:
    """Whether the episode ended because of its server rather than of what it played: its
    connection was lost, or it missed a deadline on a server its pool has ejected since."""
    server = _played_on(trajectory)
    if trajectory.status != "error" or server is None:
        return False
    return trajectory.error_kind in CONNECTION_ERRORS or (
        trajectory.error_kind == "EnvTimeoutError" and pool.is_ejected(server)
    )


def _replay_lost_episodes(scheduler: MultiTurnScheduler) -> None:
    """Make `scheduler` (one made for this run) play an episode again from its reset, on
    another server of its pool, when its server failed it (`run_batches`)."""
    play = scheduler.run_trajectory

    async def run_trajectory(trajectory: Trajectory, policy: Policy) -> Trajectory:
        lost: list[dict[str, Any]] = []
        while True:
            await play(trajectory, policy)
            if trajectory.status != "error" or len(lost) >= REPLAYS_AFTER_SERVER_FAILURE:
                break
            pool = _pool_of(trajectory, scheduler)
            if pool is None or not _failed_by_server(trajectory, pool) or not pool.can_play() or len(pool.base_urls()) < 2:
                break
            lost.append({"server": trajectory.server, "error_kind": trajectory.error_kind, "reason": trajectory.reason})
            trajectory.start_over()
        if lost:
            trajectory.rollout_infos[LOST_ATTEMPTS_INFO] = lost
        return trajectory

    scheduler.run_trajectory = run_trajectory  # type: ignore[method-assign]


def _no_server_can_play(
    trajectory: Trajectory, scheduler: MultiTurnScheduler, streaks: Counter[str | None], limit: int | None
) -> str | None:
    """Count the finished episode against its server (`streaks`: per server, its episodes in a
    row that lost it) and say why its batch stops, if no server can play it any more."""
    server = _played_on(trajectory)
    lost = trajectory.status == "error" and trajectory.error_kind in CONNECTION_ERRORS
    streaks[server] = streaks[server] + 1 if lost else 0
    if not lost or not limit:
        return None
    pool = _pool_of(trajectory, scheduler)
    reason = _kind_and_reason(trajectory.error_kind, trajectory.reason)
    if pool is None:
        if streaks[server] < limit:
            return None
        return f"{streaks[server]} episodes in a row lost the connection to their server ({reason})"
    urls = pool.base_urls()
    if pool.can_play() and not all(streaks[url] >= limit for url in urls):
        return None
    return f"no server of its pool could play any more: all {len(urls)} are down or lost their episodes ({reason})"


def _release(trajectory: Trajectory) -> None:
    """Drop what a written trajectory holds beyond how it ended (see `run_batches`)."""
    trajectory.messages = []
    trajectory.steps = []
    trajectory.rollout_infos = {}
    trajectory.reset_info = {}
    trajectory.runtime = None


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
    record: RecordForm = "lean",
    progress: bool = True,
    scheduler: str | MultiTurnScheduler | None = None,
    finished: list[Trajectory] | None = None,
    env_config: dict[str, Any] | None = None,
    cut_replies: CutRule | None = None,
    cut_penalty: float | None = None,
    harbor_tasks: str | Path | None = None,
) -> RolloutReport:
    """Run `episodes` episodes of `env` (seeds `seed`…, `env_config` added to every row's) with
    `policy`, at most `concurrency` at once; see `run_batches`. `cut_replies` and `cut_penalty`:
    what a reply cut by the length limit gets (`envsdk.schedulers.base.CutRule`; default: the
    scheduler's own, ``penalty`` unless it was made otherwise). `harbor_tasks`: the task
    folders of ``harbor`` played without a base URL (seed i plays the i-th by name)."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    batch = Batch(env, make_requests(env, episodes, seed, base_url, env_config), policy, base_url, harbor_tasks)
    return await run_batches(
        [batch], concurrency=concurrency, max_turns=max_turns, out=out, record=record,
        progress=progress, scheduler=scheduler, finished=finished, cut_replies=cut_replies, cut_penalty=cut_penalty,
    )


# ---------------------------------------------------------------- CLI


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` with each option's default, as ``(default: X)``, where it has one (not None,
    False or empty) and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default in (None, False, [], argparse.SUPPRESS)
            or "default" in text.lower()
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


DEFAULT_EPISODES = 8
_GIVEN = "{}_given"  # the namespace attribute saying an option was given on the command line


class _StoreGiven(argparse.Action):
    """``store``, noting on the namespace that the option was given (`_GIVEN`): an option at
    its default value may still have been asked for."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, _GIVEN.format(self.dest), True)


class _StoreTrueGiven(argparse._StoreTrueAction):
    """``store_true``, noting on the namespace that the flag was given (`_GIVEN`)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, _GIVEN.format(self.dest), True)


def add_rollout_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``rollout`` command to an argparse subparsers object; its ``func`` default is
    `rollout_command`."""
    from envsdk.registry import schedulers

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rollout",
        formatter_class=DefaultsHelpFormatter,
        help="run episodes of an environment with a policy and print a summary",
        description="Run N episodes (seeds S..S+N-1) or a dataset's rows, write completions.jsonl, "
        "print a summary. Exit status: 0 when at least one episode ran, 1 when none did, 2 on a "
        "usage error, 130 when interrupted.",
    )
    parser.add_argument(
        "--env", default=None,
        help="sudoku, frozen_lake, a plugin's env name, or module:Class / file.py:Class (an Env, or an "
        "Environment served here for the run)",
    )
    parser.add_argument(
        "--dataset", default=None, metavar="ROWS.jsonl",
        help="ms-swift-style rows ({'messages': [...], 'env_config': {'name', 'seed', 'base_url', ...}}): "
        "one episode per row, each with its own env, seed and server (replaces --env/--episodes/--seed)",
    )
    parser.add_argument(
        "--base-url", nargs="+", default=None,
        help="server URL, or several (a pool: each episode goes to the least-loaded one), or a pool "
        "name or a --replicas-file; without it the env is started here",
    )
    parser.add_argument(
        "--tasks", default=None, metavar="DIR",
        help="harbor: a folder of Harbor task folders, or one task folder, served here for the run (without "
        "--base-url); the oracle plays their solution/solve.sh (with --base-url, give the folder the server serves). "
        "Every task plays once unless --episodes or --limit says how many",
    )
    parser.add_argument(
        "--policy",
        default="auto",
        help=f"{', '.join(POLICY_NAMES)} (the do-nothing agent), or 'module:Class' / 'file.py:Class' naming a "
        "policy made with no arguments (default auto: the oracle for sudoku, frozen_lake, coding and harbor with "
        "--tasks, random replies otherwise)",
    )
    parser.add_argument(
        "--scheduler", default=None,
        help=f"a registered scheduler: {', '.join(sorted(schedulers))}, or one a plugin registers (default: "
        "sudoku for sudoku, openenv for a server, gym for a local env)",
    )
    parser.add_argument(
        "--formatter", default=None, metavar="NAME",
        help="how a server's observations become the model's text: text (the observation's text, only a "
        "transcript's new part per turn), json (ms-swift's JSON dump), or one registered in "
        "envsdk.formats.formatters (default: text)",
    )
    parser.add_argument(
        "--sudoku-hints", choices=HINT_LEVELS, default=None,
        help="what Sudoku's messages show beside the board: none; rejected (the moves the game rejected so far); "
        "all (also GUARANTEED MOVES and other candidates, ms-swift's hints: moves of the solution, which make the "
        f"reward easier to earn than the game) (default: {DEFAULT_HINTS}; a row's env_config \"hints\" wins)",
    )
    parser.add_argument(
        "--tool-format", choices=("native", "text"), default=None,
        help="how a tool environment is played: native (tools= and tool_calls, results as tool messages) or text "
        "(tools listed in the system message, <tool_call> blocks, results in <tool_response> blocks); default: "
        "native for a policy that supports tools (openai, transformers), text otherwise",
    )
    parser.add_argument(
        "--model", default=None, action=_StoreGiven, help="model name (openai) or local path (transformers)"
    )
    parser.add_argument(
        "--api-base", default=None, action=_StoreGiven,
        help="OpenAI-compatible endpoint for --policy openai, e.g. http://127.0.0.1:8001/v1 (default: $OPENAI_BASE_URL)",
    )
    parser.add_argument(
        "--temperature", type=float, default=None, action=_StoreGiven,
        help="sampling temperature for --policy openai or transformers, 0 to 2 (openai), 0 greedy (default: 1.0)",
    )
    parser.add_argument(
        "--top-p", type=float, default=None, action=_StoreGiven,
        help="nucleus sampling for --policy openai or transformers (default: 1.0)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, action=_StoreGiven,
        help="most tokens in one reply, for --policy openai or transformers (default: 512)",
    )
    parser.add_argument(
        "--greedy", action=_StoreTrueGiven,
        help="greedy decoding (temperature 0) for --policy openai or transformers",
    )
    parser.add_argument(
        "--sampling-args", type=_json_object, default=None, action=_StoreGiven, metavar="JSON",
        help="decoding settings as one JSON object, merged over the flags above, as vf-eval's: temperature, top_p, "
        "max_tokens, seed (the model's sampling seed; null: unseeded), and any other key a request body field "
        "(openai, e.g. top_k) or a generate() argument (transformers, e.g. repetition_penalty)",
    )
    parser.add_argument(
        "--chat-template-kwargs", type=_json_object, default=None, action=_StoreGiven, metavar="JSON",
        help='arguments of the chat template for --policy openai or transformers, e.g. \'{"enable_thinking": false}\'',
    )
    parser.add_argument(
        "--api-key", default=None, action=_StoreGiven,
        help="bearer key of the --api-base endpoint (default: $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--episodes", type=int, default=DEFAULT_EPISODES, action=_StoreGiven,
        help="number of episodes",
    )
    parser.add_argument(
        "-n", "--limit", type=int, default=None, metavar="N",
        help="play only the first N examples: the first N rows of --dataset (with --env, N episodes, as --episodes N)",
    )
    parser.add_argument(
        "--print-samples", type=int, default=0, metavar="N",
        help="after the summary, print the first N episodes (by example) as the model read them, as `envsdk show` does",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="episodes played at once")
    parser.add_argument(
        "--max-turns", type=int, default=None,
        help="turns per episode at most (default: the scheduler's; coding: 1, a single attempt with no test feedback; "
        f"harbor: {HARBOR_MAX_TURNS}, the Harbor server's step limit)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode (the next ones count up)")
    parser.add_argument(
        "--env-config", type=_json_object, default=None, metavar="JSON",
        help='extra env_config for every episode, e.g. \'{"rubric": "shaped"}\' (FrozenLake\'s shaped rubric); '
        'a server\'s reset options go in \'{"reset_kwargs": {...}}\'; unknown keys are refused',
    )
    parser.add_argument(
        "--external-plugins", "--external_plugins", dest="external_plugins", nargs="+", action="extend",
        default=[], metavar="FILE", help="plugin files to import first (they register envs, schedulers)",
    )
    parser.add_argument("--out", default="completions.jsonl", help="JSON-lines file of trajectories")
    parser.add_argument(
        "--record", choices=("lean", "full"), default="lean",
        help="lean: no per-step structured observations (the model's view is in messages); full: with them",
    )
    parser.add_argument(
        "--cut-replies", choices=CUT_RULES, default=DEFAULT_CUT_RULE,
        help="a reply cut by the length limit: env (sent to the env like any reply, its reasoning split off; a "
        "cut inside the reasoning is an empty reply), penalty (not sent: the episode ends with the format "
        "penalty, Sudoku's reply with no move), mask (not sent: the episode ends, flagged to be left out of "
        "training); the episode ends there under each, and its record says truncated: true",
    )
    parser.add_argument(
        "--cut-penalty", type=float, default=None, metavar="REWARD",
        help="what --cut-replies penalty adds to a cut episode's reward (default: the scheduler's format penalty: "
        "-1.0, the coding env's 0.0)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_eval_arguments(parser)
    parser.set_defaults(func=rollout_command)
    return parser


#: The decoding options, read by both model-backed policies.
_DECODING_OPTIONS = ("temperature", "top_p", "max_tokens", "greedy", "sampling_args", "chat_template_kwargs")
#: The options each policy reads beyond --policy; any other policy reads none of them.
_POLICY_OPTIONS = {
    "openai": ("model", "api_base", "api_key", *_DECODING_OPTIONS),
    "transformers": ("model", *_DECODING_OPTIONS),
}
_SAMPLING_OPTIONS = ("model", "api_base", "api_key", *_DECODING_OPTIONS)


def _check_policy_options(args: argparse.Namespace) -> None:
    """Refuse an option the chosen policy does not read (``--temperature 5`` with the oracle):
    it would change nothing, yet the run file would record it as the run's. One that comes from
    a run file (written before this was refused, and kept by its run's resume) is said and left."""
    read = _POLICY_OPTIONS.get(args.policy, ())
    for dest in _SAMPLING_OPTIONS:
        if getattr(args, dest, None) in (None, False) or dest in read:
            continue
        option = dest.replace("_", "-")
        users = " or ".join(name for name, options in _POLICY_OPTIONS.items() if dest in options)
        if getattr(args, _GIVEN.format(dest), False):
            raise UsageError(f"--{option} is read only by --policy {users}; --policy {args.policy} does not use it: leave it out")
        print(
            f"envsdk rollout: warning: the run file's {option} is read only by --policy {users}; "
            f"--policy {args.policy} does not use it",
            file=sys.stderr,
        )


def _custom_policy(spec: str) -> Policy:
    """The policy ``module:Class`` names, made with no arguments; `UsageError` for one that
    cannot be made so, or that has no ``async def act(messages)`` (refused here, not once per
    episode as an error record each)."""
    from envsdk.registry import import_spec

    target = import_spec(spec)
    if not isinstance(target, type) and callable(getattr(target, "act_ex", getattr(target, "act", None))):
        custom: Any = target  # a policy object the module made
    elif callable(target):  # a class, or a function that makes one
        try:
            inspect.signature(target).bind()
        except TypeError as exc:
            name = getattr(target, "__name__", spec)
            raise UsageError(
                f"--policy {spec}: a policy is made with no arguments, and {name}() cannot be ({_one_line(exc)})"
            ) from None
        except ValueError:  # no signature to read (a builtin): let the call say
            pass
        custom = target()
    else:
        raise UsageError(
            f"--policy {spec}: expected a policy class (with `async def act(messages)`) or such an object, "
            f"got {type(target).__name__}"
        )
    act = getattr(custom, "act_ex", None)
    if not callable(act):
        act = getattr(custom, "act", None)
    if not callable(act):
        raise UsageError(
            f"--policy {spec}: expected a policy (an object with `async def act(messages)`), "
            f"got {type(custom).__name__}"
        )
    if not (inspect.iscoroutinefunction(act) or inspect.iscoroutinefunction(type(act).__call__)):
        name = getattr(act, "__name__", "act")
        raise UsageError(
            f"--policy {spec}: its {name} is a plain function; a policy's replies are awaited: write it "
            f"as `async def {name}(messages)`"
        )
    return cast(Policy, custom)


def _policy_for(args: argparse.Namespace, env: str, harbor_tasks: Sequence[Any] | None = None) -> Policy:
    """The policy --policy names for `env` (`harbor_tasks`: the tasks --tasks holds, whose
    solutions Harbor's oracle plays)."""
    if ":" in args.policy:
        return _custom_policy(args.policy)
    from envsdk.policies import RandomPolicy, SamplingError, make_policy

    kwargs: dict[str, Any] = {}
    if env in HARBOR_NAMES and args.policy in ("oracle", "auto"):
        if harbor_tasks is None and args.policy == "oracle":
            raise UsageError(
                "--policy oracle on harbor plays each task's solution/solve.sh: give --tasks DIR (the folder of task "
                "folders the server serves)"
            )
        kwargs["tasks"] = harbor_tasks
    if args.policy in ("openai", "transformers"):
        kwargs.update(
            temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, greedy=args.greedy,
            sampling_args=args.sampling_args, chat_template_kwargs=args.chat_template_kwargs,
        )
        if args.policy == "transformers":
            # In this process a seed costs nothing: the run's --seed seeds the model's sampling too
            # (a server is sent one only when --sampling-args gives it: it slows vLLM's sampler).
            kwargs["seed"] = args.seed
    if args.policy == "openai":
        api_base = args.api_base or os.environ.get("OPENAI_BASE_URL")
        if not api_base or not args.model:
            raise UsageError(
                "--policy openai needs --api-base URL (an OpenAI-compatible endpoint such as "
                "`vllm serve`'s http://127.0.0.1:8000/v1, or $OPENAI_BASE_URL) and --model NAME"
            )
        return make_policy("openai", env, base_url=api_base, model=args.model, api_key=args.api_key, **kwargs)
    if args.policy == "transformers":
        if not args.model:
            raise UsageError("--policy transformers needs --model PATH (a local model folder or hub id)")
        kwargs["model_path"] = args.model
        try:
            loaded: Policy = make_policy(args.policy, env, **kwargs)
        except SamplingError:
            raise  # said before the model loads, in its own words
        except (OSError, ValueError) as exc:
            # transformers' own message runs to many lines (and a traceback through the hub client).
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise UsageError(
                f"--model {args.model}: cannot load it ({first.strip()}): give a local folder holding a model "
                "(config.json and weights) or a hub id that is in the local cache (HF_HUB_OFFLINE=1 allows no download)"
            ) from None
        return loaded
    policy: Policy = make_policy(args.policy, env, **kwargs)
    if isinstance(policy, RandomPolicy):
        # Random replies (--policy random, or auto for an env no oracle knows) repeat with the run:
        # each episode's are drawn from a generator seeded by --seed, its example and rollout index.
        policy = RandomPolicy(env, seed=args.seed)
    return policy


class UsageError(ValueError):
    """The command line asks for something that cannot run; the message says what to change."""


#: Schedulers that play environment servers only: a local env's rows need a base URL with them.
_SERVER_SCHEDULERS = ("openenv", "tools")
#: `Environment` classes named ``module:Class`` with ``--env``, served here for the run.
_SERVED_HERE: dict[str, type] = {}


def _env_name(spec: str) -> str:
    """The env name for ``--env``: a registry name as is; ``module:Class`` / ``file.py:Class``
    registered under that spelling (an `Env`) or served here for the run (an `Environment`)."""
    if ":" not in spec or spec.startswith(("http://", "https://")):
        return spec
    from envsdk.env import Env, Environment
    from envsdk.registry import envs, import_spec

    target = import_spec(spec)
    if isinstance(target, type) and issubclass(target, Env):
        envs[spec] = target
    elif isinstance(target, type) and issubclass(target, Environment):
        _SERVED_HERE[spec] = target
    else:
        raise UsageError(f"--env {spec}: expected an Env or Environment subclass, got {target!r}")
    return spec


def _on_server(env: str, base_url: BaseUrls | None) -> bool:
    return base_url is not None or env in EMBEDDED or env in _SERVED_HERE


def _check_rows(env: str, config: dict[str, Any], args: argparse.Namespace, where: str) -> None:
    on_server = _on_server(env, config.get("base_url"))
    # An option's own mistake: named by the row it was found in, not by an --env-config not given.
    said = "" if where == "--env-config" else f"{where}: "
    if args.scheduler in _SERVER_SCHEDULERS and not on_server:
        raise UsageError(
            f"{said}--scheduler {args.scheduler} plays environment servers, but {env} has no "
            f"base URL: give --base-url URL (or env_config.base_url), or drop --scheduler to play {env} here"
        )
    if args.formatter is not None and not on_server:
        raise UsageError(
            f"{said}--formatter renders a server's observations, and {env} is a local Env whose "
            "observations are its own text: drop --formatter (or serve it and pass --base-url)"
        )
    if getattr(args, "tool_format", None) is not None:
        _check_tool_server(env, config.get("base_url"), f"{said}--tool-format {args.tool_format}")
    if args.scheduler is None or args.scheduler in ("gym", "openenv", "sudoku", "tools"):
        check_env_config(env, config, on_server=on_server, where=where)


def _check_tool_server(env: str, base_url: Any, option: str) -> None:
    """Refuse `option` (``--tool-format …``) for an env that is not a tool server: a local env,
    an env started here (but Harbor's, a tool server), or a server whose ``/mcp`` lists no tools. A pool name is left to the
    run, which refuses it there."""
    from envsdk.schedulers.tools import serves_tools

    from envsdk.preflight import first_answering

    first = first_answering(base_url) if base_url else None
    if first is None and env in HARBOR_NAMES:
        return  # the Harbor server started for the run serves its tools over MCP
    if first is None or (first.startswith(URL_SCHEMES) and not serves_tools(first)):
        raise UsageError(
            f"{option}: it plays a tool environment's server (one whose /mcp lists tools), and {env} is not one: "
            "leave --tool-format out"
        )


def _check_local_config(batch: Batch, where: str) -> None:
    """Raise `UsageError` when a local env refuses its batch's first ``env_config`` (a value of
    the wrong type, ``{"size": "big"}``): many envs read their config only at reset, so it is
    reset once here, rather than every episode failing the same way. Only rows with keys beyond
    `ROW_KEYS` are tried; a failure other than a `ValueError`/`TypeError` is left to the run."""
    from envsdk.registry import envs

    request = batch.requests[0]
    if batch.env not in envs or _on_server(batch.env, batch.base_url) or not set(request.env_config) - ROW_KEYS:
        return

    async def reset_once() -> None:
        env = envs[batch.env](request.env_config)
        try:
            await env.reset(request)
        finally:
            closing = env.close()
            if inspect.isawaitable(closing):
                await closing

    try:
        asyncio.run(reset_once())
    except Exception as exc:  # noqa: BLE001 - the env's own code: any failure but these is the run's
        if not isinstance(exc, (ValueError, TypeError)):
            return
        given = {k: v for k, v in request.env_config.items() if k not in ROW_KEYS}
        raise UsageError(
            f"{where}: {batch.env} refuses its config {json.dumps(given, default=str)}: {_one_line(exc)}"
        ) from None


def _check_cut_options(args: argparse.Namespace) -> None:
    """Refuse a --cut-penalty that no cut reply would get (the rule is not ``penalty``) or that
    is not a finite number."""
    penalty = getattr(args, "cut_penalty", None)
    if penalty is None:
        return
    if args.cut_replies != "penalty":
        raise UsageError(
            f"--cut-penalty is what --cut-replies penalty adds; --cut-replies {args.cut_replies} adds nothing: "
            "leave --cut-penalty out, or give --cut-replies penalty"
        )
    if not math.isfinite(penalty):
        raise UsageError(f"--cut-penalty must be a finite number, got {penalty}")


def _batches_from_args(args: argparse.Namespace) -> list[Batch]:
    if args.base_url is not None and not args.base_url:  # `base-url = []` in a run file
        raise UsageError("--base-url names no server: give at least one URL, or leave it out")
    for url in args.base_url or []:
        check_base_url(url)
    # Here, before --out is held, cut (--overwrite) or its run file written: not where the value
    # is used, once the records of the run it replaces or continues are gone or changed.
    for flag, value in (("--concurrency", args.concurrency), ("--max-turns", args.max_turns),
                        ("--max-tokens", args.max_tokens), ("--limit", args.limit)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if getattr(args, "print_samples", 0) < 0:
        raise UsageError(f"--print-samples must be >= 0, got {args.print_samples}")
    _check_cut_options(args)
    _check_policy_options(args)
    if args.formatter is not None:
        from envsdk.formats import formatters

        if args.formatter not in formatters:
            raise UsageError(f"--formatter {args.formatter!r} is not registered; known: {', '.join(sorted(formatters))}")
    base_url: BaseUrls | None = (
        args.base_url[0] if args.base_url and len(args.base_url) == 1 else args.base_url
    )
    policies: dict[str, Policy] = {}
    harbor = _read_harbor_tasks(args.tasks)

    def policy(env: str) -> Policy:
        if env not in policies:
            policies[env] = _policy_for(args, env, harbor.tasks if harbor is not None else None)
            if getattr(args, "tool_format", None) == "native" and not getattr(policies[env], "supports_tools", False):
                raise UsageError(
                    f"--tool-format native needs a policy that calls tools natively (openai, transformers); "
                    f"--policy {args.policy} does not: use --tool-format text, or leave it out"
                )
        return policies[env]

    default_env = _env_name(args.env) if args.env is not None else None
    if args.dataset is not None:
        # Given on the command line, or a run file's other than the default (a file written
        # before run files left it out of dataset runs holds the default).
        if getattr(args, _GIVEN.format("episodes"), False) or args.episodes != DEFAULT_EPISODES:
            raise UsageError(
                f"--episodes {args.episodes} with --dataset {args.dataset}: a dataset plays one episode per row "
                "(--rollouts-per-example R plays R): leave --episodes out, or give a file of the rows to play"
            )
        args.episodes = None  # not played, so not written to the run file either
        rows = load_dataset(args.dataset, default_env)
        if args.limit is not None:
            rows = rows[: args.limit]
        groups: dict[tuple[str, bool], list[RolloutRequest]] = {}
        for line, row in enumerate(rows, start=1):
            config = row.env_config
            if config.get("base_url") is None and base_url is not None:
                row.data_dict["env_config"] = config = {**config, "base_url": base_url}
            check_env_name(config["name"], config.get("base_url"))
            _check_rows(config["name"], config, args, f"{args.dataset} line {line}")
            groups.setdefault((config["name"], "base_url" in config), []).append(row)
        if (CODING, False) in groups:
            _coding_task_ids(f"{args.dataset}: the coding env")  # its server starts here: refused now, not then
        if (HARBOR, False) in groups and harbor is None:
            raise UsageError(f"{args.dataset}: its harbor rows have no base_url: give {_HARBOR_TASKS_HINT}")
        if harbor is not None and not any(env in HARBOR_NAMES for env, _ in groups):
            raise UsageError(f"--tasks names Harbor task folders, and {args.dataset} has no harbor row: leave it out")
        batches = [
            Batch(env, group, policy(env), group[0].env_config.get("base_url") if remote else None, args.tasks)
            for (env, remote), group in groups.items()
        ]
        if args.scheduler in (None, "gym"):
            for batch in batches:
                _check_local_config(batch, f"{args.dataset} row {batch.requests[0].uuid}")
        return batches
    if default_env is None and isinstance(base_url, str):
        from envsdk.preflight import served_env_name

        # One server's env is the one it serves: its /metadata names it.
        default_env = served_env_name(base_url)
    if default_env is None:
        raise UsageError(
            "give --env NAME (or --dataset ROWS.jsonl)"
            + (
                f"; the server at {base_url} names no env in its /metadata (or did not answer)"
                if isinstance(base_url, str) and base_url.startswith(URL_SCHEMES) else ""
            )
        )
    harbor_names: list[str] | None = None
    if default_env in HARBOR_NAMES:
        if base_url is None and harbor is None:
            raise UsageError(f"--env harbor plays Harbor task folders: give {_HARBOR_TASKS_HINT}")
        harbor_names = _served_harbor_names(base_url) if base_url is not None else harbor.names if harbor is not None else None
        if harbor_names and args.limit is None and not _episodes_stated(args):
            args.episodes = len(harbor_names)  # every task once
    elif harbor is not None:
        raise UsageError(f"--tasks names Harbor task folders, and --env {default_env} is not harbor: leave it out")
    if args.limit is not None:
        if getattr(args, _GIVEN.format("episodes"), False) and args.episodes != args.limit:
            raise UsageError(f"--limit {args.limit} and --episodes {args.episodes} both say how many episodes to play: give one")
        args.episodes = args.limit
    if args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    check_rollouts(f"--episodes {args.episodes}", args.episodes, getattr(args, "rollouts_per_example", 1))
    check_env_name(default_env, base_url)
    for key, option in (("seed", "--seed N (episode i plays seed N + i)"), ("name", "--env NAME")):
        if key in (args.env_config or {}):
            raise UsageError(f"--env-config: {key!r} is set for every episode by {option}; give that instead")
    given = {"base_url": base_url} if base_url is not None else {}
    _check_rows(default_env, {**(args.env_config or {}), "name": default_env, **given}, args, "--env-config")
    requests = make_requests(default_env, args.episodes, args.seed, base_url, args.env_config)
    if default_env == CODING:
        _name_coding_examples(requests, args.episodes)
    elif harbor_names:
        _name_examples(
            requests, args.episodes, harbor_names, key="task", what="Harbor task",
            collection=f"there are {len(harbor_names)}",
        )
    batch = Batch(default_env, requests, policy(default_env), base_url, args.tasks)
    if args.scheduler in (None, "gym"):
        _check_local_config(batch, "--env-config")
    return [batch]


def _coding_task_ids(where: str) -> list[str]:
    """HumanEval's task ids in the order the coding server numbers its problems; `UsageError`
    (naming the ``coding`` extra) when the task set cannot be read here."""
    from envsdk.games.humaneval import TaskSetError, humaneval

    try:
        return [problem.task_id for problem in humaneval()]
    except TaskSetError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _name_coding_examples(requests: Sequence[RolloutRequest], episodes: int) -> None:
    """Ask the coding server for each row's problem by task id, and name the row's example by it
    (``HumanEval/7``, in records, summaries and pass@k groups): see `_name_examples`."""
    task_ids = _coding_task_ids("--env coding")
    _name_examples(
        requests, episodes, task_ids, key="task_id", what="HumanEval problem", collection=f"HumanEval has {len(task_ids)}"
    )


def _name_examples(
    requests: Sequence[RolloutRequest], episodes: int, ids: Sequence[str], *, key: str, what: str, collection: str
) -> None:
    """Ask the server for each row's task by its id (reset option `key`), and name the row's
    example by it, in records, summaries and pass@k groups. A row plays the task its seed
    numbers (the server's ``ids[seed % len(ids)]``), unless ``--env-config``'s ``reset_kwargs``
    (the same in every row) pins `key` or ``seed``.

    Raises `UsageError` when the rows would play a task twice: pass@k would count each repeat as
    another example, where ``--rollouts-per-example`` samples one example again. `what` names a
    task in that message, `collection` says how many there are."""
    pinned: dict[str, Any] = {}
    for request in requests:
        config = request.data_dict["env_config"]
        pinned = config.get("reset_kwargs", {})
        if not isinstance(pinned, dict):
            raise UsageError(f"--env-config: reset_kwargs must be a JSON object, got {json.dumps(pinned)}")
        task = pinned.get(key)
        if task is None:
            seed = pinned.get("seed", config["seed"])
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise UsageError(f"--env-config: reset_kwargs seed must be an integer, got {json.dumps(seed)}")
            task = ids[seed % len(ids)]
        config["reset_kwargs"] = {**pinned, key: task}
        request.data_dict[EVAL_KEY] = {"example": str(task)}
    distinct = len({request.data_dict[EVAL_KEY]["example"] for request in requests})
    if distinct < episodes:
        pin = next((name for name in (key, "seed") if name in pinned), None)
        why = (
            f"--env-config's reset_kwargs pins {pin} {pinned[pin]!r}" if pin is not None
            else f"{collection}: the seeds past them wrap around"
        )
        raise UsageError(
            f"--episodes {episodes} would play only {distinct} distinct {what}(s) ({why}), and pass@k "
            f"would count each repeat as another example: give --episodes {distinct} at most, and "
            f"--rollouts-per-example R for R samples of each {what.split()[-1]}"
        )


class _HarborTasks(NamedTuple):
    """What --tasks holds: the tasks that can be read (for the oracle), and every task's name in
    the Harbor server's numbering (sorted, the broken ones included)."""

    tasks: list[Any]
    names: list[str]


def _read_harbor_tasks(folder: str | None) -> _HarborTasks | None:
    """The task folders --tasks names (no container needed); None without --tasks; `UsageError`
    for a folder that holds no task."""
    if folder is None:
        return None
    from servers.harbor.tasks import TaskFolderError, scan_tasks

    try:
        tasks, errors = scan_tasks(folder)
    except TaskFolderError as exc:
        raise UsageError(f"--tasks {exc}") from None
    return _HarborTasks(tasks, sorted([task.name for task in tasks] + [error.task for error in errors]))


def _served_harbor_names(base_url: BaseUrls) -> list[str] | None:
    """The names of the tasks a Harbor server serves, in its numbering (its ``/health``: ready
    and broken ones, sorted); None when it does not say (not a Harbor server, or a pool name)."""
    from envsdk.schedulers.openenv import server_json

    first = base_url if isinstance(base_url, str) else base_url[0]
    if not first.startswith(URL_SCHEMES):
        return None
    try:
        health = server_json(first, "/health")
    except (OSError, ValueError):
        return None  # the pre-flight check says why
    served = health.get("harbor") if isinstance(health, dict) else None
    if not isinstance(served, dict):
        return None
    names = [*served.get("ready", []), *(served.get("broken") or {})]
    return sorted({name for name in names if isinstance(name, str)}) or None


def _episodes_stated(args: argparse.Namespace) -> bool:
    """Whether the run's number of episodes was stated: on the command line, or in the --config
    file or the run file of the run it resumes (a run file holds the number its run played)."""
    if getattr(args, _GIVEN.format("episodes"), False):
        return True
    from envsdk.runfile import RunFileError, read_run_file, run_file_path

    files = [Path(args.config)] if args.config else []
    if args.resume and args.out:
        files.append(run_file_path(args.out))
    for file in files:
        with contextlib.suppress(RunFileError):
            if file.is_file() and "episodes" in read_run_file(file):
                return True
    return False


def _sample_of(args: argparse.Namespace, batches: Sequence[Batch]) -> str | None:
    """What one rollout is as a pass@k sample, when the run plays only the coding env with its
    own scheduler (`envsdk.schedulers.coding.sample_text`): the summary states pass@k with it.
    None for any other run."""
    if args.scheduler not in (None, "coding") or any(batch.env != CODING for batch in batches):
        return None
    from envsdk.schedulers.coding import DEFAULT_MAX_TURNS, sample_text

    return sample_text(args.max_turns or DEFAULT_MAX_TURNS)


def _preflight(args: argparse.Namespace, batches: Sequence[Batch]) -> None:
    from envsdk.preflight import check_env_servers, check_inference

    # A list of base URLs is one pool, checked as the pool plays it: a member that does not
    # answer is warned about and skipped, the run is refused only when none answers.
    def entry(spec: Any) -> str | tuple[str, ...] | None:
        if isinstance(spec, list) and spec and all(isinstance(url, str) for url in spec):
            return spec[0] if len(spec) == 1 else tuple(spec)
        return spec if isinstance(spec, str) else None

    entries: dict[str | tuple[str, ...], None] = {}
    names: dict[str | tuple[str, ...], str] = {}
    for batch in batches:
        for request in batch.requests:
            key = entry(request.env_config.get("base_url"))
            if key is None:
                continue
            entries.setdefault(key)
            # Only the runner's own choice of scheduler: a plugin's may play servers under other names.
            if args.scheduler is None and batch.env not in ("remote", *_SERVED_HERE):
                names.setdefault(key, batch.env)
    check_env_servers(
        [list(e) if isinstance(e, tuple) else e for e in entries], args.concurrency, names,
        warn=lambda line: print(f"envsdk rollout: warning: {line}", file=sys.stderr),
    )
    if args.policy == "openai":
        check_inference(args.api_base or os.environ.get("OPENAI_BASE_URL") or "", args.model, args.api_key)


def _print_samples(args: argparse.Namespace) -> None:
    """``--print-samples N``: the first N episodes of --out, by example, as `envsdk show` prints them."""
    count = getattr(args, "print_samples", 0)
    if not count or not args.out:
        return
    from envsdk.evaluate import EvalError
    from envsdk.show import render_records, select_records

    try:
        records = select_records(args.out, limit=count)
    except EvalError as exc:
        print(f"envsdk rollout: warning: cannot print samples: {_one_line(exc)}", file=sys.stderr)
        return
    print_out(f"\n{len(records)} episode(s) as the model read them (`envsdk show {args.out}` shows them all):\n")
    print_out(render_records(records))


def _give_sudoku_hints(args: argparse.Namespace, batches: Sequence[Batch]) -> None:
    """``--sudoku-hints``: the hint level of every Sudoku row that names none; `UsageError` when
    the run plays no Sudoku (the option would change nothing). Not given, a Sudoku run's is the
    default, set in `args` so that its run file records what it played, as for any option."""
    level = getattr(args, "sudoku_hints", None)
    sudoku = [batch for batch in batches if batch.env == SUDOKU and args.scheduler in (None, SUDOKU)]
    if level is None:
        if sudoku:
            args.sudoku_hints = DEFAULT_HINTS
        return
    if not sudoku:
        raise UsageError(f"--sudoku-hints {level}: the run plays no Sudoku (--env sudoku): leave it out")
    for batch in sudoku:
        for request in batch.requests:
            request.data_dict.setdefault("env_config", {}).setdefault("hints", level)


def _type_random_replies(batches: Sequence[Batch]) -> None:
    """Give a batch's random replies its action's JSON schema (its server's ``/schema``, or the
    action type of an `Environment` served here), so that a typed action (an int to guess) gets
    replies it accepts rather than text it refuses. A server that does not say keeps the text
    replies."""
    from envsdk.policies import RandomPolicy
    from envsdk.schedulers.openenv import server_json

    for batch in batches:
        policy = batch.policy
        if type(policy) is not RandomPolicy or policy.action_schema is not None:
            continue
        schema: Any = None
        if batch.env in _SERVED_HERE:
            from envsdk.env import step_types

            action = step_types(_SERVED_HERE[batch.env])[0]
            schema = action.model_json_schema() if isinstance(action, type) and hasattr(action, "model_json_schema") else None
        else:
            spec = batch.base_url[0] if isinstance(batch.base_url, list) and batch.base_url else batch.base_url
            if isinstance(spec, str) and spec.startswith(URL_SCHEMES):
                with contextlib.suppress(OSError, ValueError):
                    answer = server_json(spec, "/schema")
                    schema = answer.get("action") if isinstance(answer, dict) else None
        if isinstance(schema, dict):
            batch.policy = RandomPolicy(policy.env_name, seed=policy.seed, action_schema=schema)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    except RecursionError:  # arrays or objects nested deeper than the parser goes
        raise argparse.ArgumentTypeError("not JSON this envsdk reads (nested too deep)") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _kind_and_reason(kind: str | None, reason: object) -> str:
    """``"Kind: reason"`` on one line, the kind said once: a reason often starts with it already."""
    text = " ".join(str(reason).split())
    return text if kind is None or text.startswith(f"{kind}:") else f"{kind}: {text}"


def _no_episode_ran(episodes: Sequence[EpisodeFacts]) -> str | None:
    """One line saying why nothing ran, when every episode ended in an error."""
    if not episodes or any(e.status != "error" for e in episodes):
        return None
    kinds = Counter(e.error_kind or "unknown" for e in episodes)
    kind, count = kinds.most_common(1)[0]
    example = _kind_and_reason(kind, next(e.reason for e in episodes if (e.error_kind or "unknown") == kind))
    hint = _WHAT_TO_DO.get(kind)
    steps = sum(e.steps for e in episodes)
    head = f"every episode ended in an error ({steps} steps ran)" if steps else "no episode ran"
    return (
        f"{head}: all {len(episodes)} ended in an error ({count} x {example})"
        + (f"; {hint}" if hint else "")
    )


#: What to do about the errors that stop every episode, by error kind.
_WHAT_TO_DO = {
    "ConnectError": "is the environment server running (--base-url)?",
    "CapacityError": "the server is full: lower --concurrency or restart it with a larger MAX_CONCURRENT_ENVS",
    "AuthenticationError": "set ENVSDK_TOKEN to the server's token",
    "InferenceConnectionError": "is the inference server running at --api-base?",
}


def rollout_command(args: argparse.Namespace) -> int:
    """Run the ``rollout`` command; print the summary. Exit status: 0 when at least one episode
    ran (whatever its reward), 1 when none did or the pre-flight check failed, 2 on a usage
    error or an --out that another process is writing, 130 on Ctrl-C and 143 on SIGTERM (after
    a summary of the episodes that finished)."""
    with _signals_stop_the_run(getattr(args, "own_process", False)) as stop, contextlib.ExitStack() as hold:
        return _rollout_command(args, hold, stop)


class _Stop:
    """How a run was stopped, if it was: by SIGTERM (`terminated`) or else by Ctrl-C; and, while
    its episodes play, the event loop and task that a stop cancels."""

    terminated = False
    #: Whether episodes had started to play.
    playing = False
    #: Signals received so far.
    signals = 0
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None
    #: Whether the event loop runs (from `asyncio.run`'s start to its end, its teardown included).
    in_loop = False
    #: Whether the command has returned.
    finished = False

    @property
    def word(self) -> str:
        return "terminated" if self.terminated else "interrupted"

    @property
    def status(self) -> int:
        return 128 + (signal.SIGTERM if self.terminated else signal.SIGINT)

    def run(self, main: Coroutine[Any, Any, _T]) -> _T:
        """``asyncio.run(main)``, cancelled by this stop's signals from the event loop itself.

        Raises KeyboardInterrupt when a signal cancelled it."""

        async def cancellable() -> _T:
            self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
            if self.signals:  # a signal came while the loop started
                main.close()
                raise asyncio.CancelledError
            return await main

        self.in_loop = True
        try:
            return asyncio.run(cancellable())
        except asyncio.CancelledError:
            if not self.signals:
                raise
            raise KeyboardInterrupt from None
        finally:
            self.in_loop, self.loop, self.task = False, None, None

    def on_signal(self, signum: int, frame: Any) -> None:
        """The first signal stops the run: while the loop runs, by cancelling its main task from
        the loop (a cancel from the handler itself can land in the middle of the loop's own
        bookkeeping), before it by raising KeyboardInterrupt, and after the command returned not
        at all (the process is ending). A second one is only noted: the stop that closes the
        episodes' sessions and the embedded server goes on (a second raise had cut it short and
        hung the process at exit). A third ends the process at once, for a stop that waits on
        something hung; the records written stay, and --resume takes it from there."""
        self.signals += 1
        if self.signals == 1:
            self.terminated = signum == signal.SIGTERM
            if self.finished:
                return
            if not self.in_loop:
                raise KeyboardInterrupt
            loop, task = self.loop, self.task
            if loop is not None and task is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(task.cancel)
        elif self.signals == 2:
            _note("envsdk rollout: already stopping (signal once more to end at once)")
        else:
            _note(f"envsdk rollout: {self.word}: ended at once")
            os._exit(self.status)


def _note(line: str) -> None:
    """Say `line` on stderr from a signal handler: not with print(), as the handler may run in the
    middle of a write to the same stream, and not at all where stderr is gone (a closed pipe):
    a raise here would land in the middle of the stop."""
    with contextlib.suppress(OSError):
        os.write(2, f"\n{line}\n".encode())


@contextlib.contextmanager
def _signals_stop_the_run(own_process: bool) -> Iterator[_Stop]:
    """While the run is its process's own: Ctrl-C (unless the process ignores it, as under
    `nohup`) and SIGTERM, which job schedulers (Slurm, Kubernetes) and `kill` send before they
    kill, stop it (the episodes in flight are cancelled, the finished ones summed up, --out let
    go) instead of ending the process where it stands (see `_Stop.on_signal`). The handlers stay
    for the rest of the process, whose exit (the interpreter joining the game workers) the
    default action would otherwise cut with a kill."""
    stop = _Stop()
    if not own_process or threading.current_thread() is not threading.main_thread():
        yield stop
        return
    handled = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        handled.append(signal.SIGINT)
    for signum in handled:
        signal.signal(signum, stop.on_signal)
    try:
        yield stop
    finally:
        stop.finished = True


def _rollout_command(args: argparse.Namespace, hold: contextlib.ExitStack, stop: _Stop) -> int:
    try:
        return _play(args, hold, stop)
    except KeyboardInterrupt:
        with contextlib.suppress(BrokenPipeError):
            print(f"envsdk rollout: {stop.word}{'' if stop.playing else ' before any episode started'}", file=sys.stderr)
        return stop.status


def _cannot_write(args: argparse.Namespace, exc: OSError) -> int:
    """Say that a file beside --out (the run file) cannot be written: a folder that cannot be
    made is a usage error. Returns the exit status."""
    where = f"cannot write --out {args.out} there" if getattr(args, "out", None) else "cannot use a file"
    named = f": {exc.filename}" if exc.filename else ""
    print(f"envsdk rollout: error: {where}: {exc.strerror}{named}", file=sys.stderr)
    return 2


def _begin(args: argparse.Namespace, begin: Callable[[], None]) -> int | None:
    """Run the plan's `repair` or `start`; the exit status when it failed, said in one line."""
    try:
        begin()
    except OSError as exc:
        return _cannot_write(args, exc)
    except ValueError as exc:  # the repairs read the records put aside before: a line not UTF-8
        print(f"envsdk rollout: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    return None


def _play(args: argparse.Namespace, hold: contextlib.ExitStack, stop: _Stop) -> int:
    from envsdk.preflight import PreflightError
    from envsdk.registry import PluginLoadError, load_plugins

    try:
        args = resolve_run_options(args)
        if args.external_plugins:
            load_plugins(args.external_plugins)
        batches = _batches_from_args(args)
        _give_sudoku_hints(args, batches)
        if args.out:
            # From reading what a resumed run has to writing its summary, --out is this run's alone.
            hold.enter_context(hold_records(args.out))
        plan = plan_run(args, batches, _sample_of(args, batches))
    except RecordsBusy as exc:
        print(f"envsdk rollout: error: --out {exc} (a run that was stopped continues with --resume)", file=sys.stderr)
        return 2
    except LockFileError as exc:
        print(f"envsdk rollout: error: --out {exc}", file=sys.stderr)
        return 2
    except (EnvNotFoundError, PluginLoadError, ImportError, ValueError) as exc:
        print(f"envsdk rollout: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        return _cannot_write(args, exc)
    if plan.to_play == 0:
        # Nothing to play, but a line torn off a record of a pair played twice is cut.
        failed = _begin(args, plan.repair)
        if failed is not None:
            return failed
        print_out(f"nothing left to play: all {plan.planned} rollouts of run {plan.run_id} have a record")
        summary = finish_run(args.out)
        if summary is not None:
            print_out(summary.render())
        return 0
    try:
        _preflight(args, batches)
    except PreflightError as exc:
        print(f"envsdk rollout: error: {exc}", file=sys.stderr)
        return 1
    _type_random_replies(batches)
    if not plan.replaces:  # else started by the writer, once an episode has ended without an error
        failed = _begin(args, plan.start)
        if failed is not None:
            return failed
    with_messages = sum(1 for b in batches for r in b.requests if r.messages)
    if with_messages:
        print(
            f"note: the `messages` of {with_messages} rows are not sent: each episode's prompt is its "
            "environment's reset observation (as ms-swift's gym scheduling does)",
            file=sys.stderr,
        )
    finished: list[EpisodeFacts] = []

    def kept() -> str:
        """What is said when the run was to replace an earlier run's records and has not."""
        if not plan.replaces or plan.started:
            return ""
        how = "ended without an error" if finished else "ended"
        return (f"envsdk rollout: --out {args.out} keeps the earlier run's records, as they were: no episode of this "
                f"run {how} (--overwrite replaces them once one ends without an error)")

    if getattr(args, "own_process", False):
        _set_up_collector()
    started = time.perf_counter()
    stop.playing = True
    try:
        report = stop.run(
            run_batches(
                batches, concurrency=args.concurrency, max_turns=args.max_turns, out=args.out,
                record=args.record, progress=not args.no_progress, scheduler=args.scheduler, facts=finished,
                append=plan.append, formatter=args.formatter, release=bool(args.out), tool_format=args.tool_format,
                on_replace=plan.start if plan.replaces else None, cut_replies=args.cut_replies,
                cut_penalty=args.cut_penalty,
            )
        )
    except (EnvNotFoundError, ValueError) as exc:
        print(f"envsdk rollout: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out cannot be opened (a folder in its way, a read-only disk)
        return _cannot_write(args, exc)
    except KeyboardInterrupt:
        total = sum(len(b.requests) for b in batches)
        # Said even where stdout or stderr is a closed pipe (`| head`, a logger gone): the
        # status is the stop's, not a write error's.
        with contextlib.suppress(BrokenPipeError):
            print(f"\n{stop.word}: {len(finished)} of {total} episodes finished", file=sys.stderr)
            if kept():
                print(kept(), file=sys.stderr)
            elif args.out and not finished:
                # The run file (and an earlier attempt's records) stay: --resume continues the run.
                print(f"`envsdk rollout --resume --out {args.out}` plays the rest", file=sys.stderr)
        if finished:
            print_out(_policy_line(args, batches))
            print_out(summarize(finished, time.perf_counter() - started, args.cut_replies).render())
            if args.out and not kept():
                rest = "plays the rest" if len(finished) < total else "writes the run's summary files"
                print_out(f"\ntheir trajectories are in {args.out}; `envsdk rollout --resume --out {args.out}` {rest}")
        flush_out()
        return stop.status
    # From here on a reader that went away (`| head`) leaves the run's end and status as they are.
    print_out(_policy_line(args, batches))
    print_out(report.summary.render())
    if report.unwritten is not None:
        print(
            f"envsdk rollout: error: stopped: an episode finished but {report.unwritten}; "
            + (kept().removeprefix("envsdk rollout: ") if kept() else "the records written before it stay, and "
               f"`envsdk rollout --resume --out {args.out}` plays the rest once it can write there"),
            file=sys.stderr,
        )
        return 1
    if kept():
        print(kept(), file=sys.stderr)
        groups = None
    else:
        groups = finish_run(args.out, report.written)
    # A table of one-rollout groups says nothing the summary above did not (every such group
    # has zero variance); it is printed once there are groups or earlier attempts to sum up.
    if groups is not None and (getattr(args, "rollouts_per_example", 1) > 1 or plan.attempt > 1):
        print_out(f"\nrun {plan.run_id}, attempt {plan.attempt} (all attempts' records):\n{groups.render()}")
    elif groups is not None and (groups.sample is not None or groups.pass_at_1_stderr is not None):
        # pass@1 equals the success rate above, but only these lines say what a sample was and
        # how far the rate may be from the model's.
        error = groups.stderr_line()
        print_out(f"\n{groups.pass_line()}" + (f"\n{error}" if error else ""))
    if args.out and not kept():
        print_out(f"\ntrajectories written to {args.out}")
        _print_samples(args)
    if report.stopped is not None:
        steps = sum(f.steps for f in report.facts)
        print(
            f"envsdk rollout: error: stopped after {report.stopped}; {steps} steps ran in "
            f"{len(report.facts)} episodes before; is the environment server still running?",
            file=sys.stderr,
        )
        return 1
    failure = _no_episode_ran(report.facts)
    if failure is not None:
        print(f"envsdk rollout: error: {failure}", file=sys.stderr)
        return 1
    return 0


#: The collector's first-generation threshold in the `envsdk` program's own process (CPython's
#: default is 700). An episode in flight keeps every message and step it made, so
#: with dozens in flight the collector ran a young pass every few turns and walked them again
#: and again: about 150 passes per 128 Sudoku episodes, 1.2-1.7 ms of the rollout process's CPU
#: per episode; with 20,000, 4 passes and 0.3 ms (``python -m bench.eval_overhead`` applies the
#: same to every loop it measures).
GEN0_THRESHOLD = 20_000


def _set_up_collector() -> None:
    """Take what is alive before the episodes (modules, the policy and its model, the planned run:
    all kept until the run ends) out of the cyclic collector's walks, and let the young
    generation grow to `GEN0_THRESHOLD` objects before it is walked. With dozens of episodes in
    flight the collector runs full passes often, and each one walked that whole heap again
    (`python -m bench.eval_overhead` with and without ``--no-freeze`` measures it). Done only
    when the process is the `envsdk` program's own: a caller of `envsdk.cli.main` keeps its
    collector as it is."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])


def _policy_line(args: argparse.Namespace, batches: Sequence[Batch]) -> str:
    """The summary's first line: the policy, its model and the decoding settings it applies."""
    from envsdk.policies.sampling import settings_text

    line = f"{'policy':<16}{args.policy}" + (f", model {args.model}" if args.model else "")
    settings = getattr(batches[0].policy, "sampling_settings", None) if batches else None
    return f"{line}: {settings_text(settings)}" if isinstance(settings, dict) else line


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m envsdk.rollout …`` — the ``rollout`` command on its own."""
    parser = argparse.ArgumentParser(prog="envsdk")
    add_rollout_parser(parser.add_subparsers(dest="command", required=True))
    command_line = ["rollout", *(argv if argv is not None else sys.argv[1:])]
    args = parser.parse_args(command_line)
    args.command_line = command_line
    # Run as a program, the process is the command's own (its signals, its collector).
    args.own_process = argv is None
    code = int(args.func(args))
    flush_out()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
