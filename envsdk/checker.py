"""`check_env`: does an environment obey its contract? In the spirit of Gymnasium's checker.

It runs an environment directly (no server) and checks, in this order, the rules in `RULES`:
the shapes and types that ``reset`` and ``step`` return, that the process-wide ``random``
generator is left alone, that one seed gives one first observation — also when `concurrency`
sessions reset at the same time, which is how a trainer runs them and where shared random state
shows — that a seeded episode replays step for step, that steps after the end are refused and
that ``close`` may be called twice. The first broken rule raises `EnvCheckError` naming it;
otherwise a `CheckReport` lists what was checked and what could not be (with the reason).

Both environment shapes are covered: an `Env` class (local, ms-swift style; checked through
``asyncio.gather``) and an `Environment` class or zero-argument factory (server side; a sync one
is reset from threads). Steps are played with replies drawn, by a ``random.Random(seed)``, from
`DEFAULT_REPLIES` (or the caller's `replies`).

The ``envsdk check-env TARGET`` command is added to a CLI by `add_check_env_parser`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import math
import random
import sys
import threading
import typing
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from envsdk.env import Env, Environment, RolloutRequest
from envsdk.errors import EnvNotFoundError, EnvSDKError
from envsdk.policies.scripted import GENERIC_REPLIES
from envsdk.registry import PluginLoadError, envs, import_spec, load_plugins
from envsdk.types import Action, Observation, State

__all__ = [
    "RULES",
    "DEFAULT_REPLIES",
    "EnvCheckError",
    "CheckReport",
    "check_env",
    "check_env_async",
    "resolve_target",
    "add_check_env_parser",
    "run_check_env",
]

#: Every rule, by identifier, with the sentence a failure report starts from.
RULES: dict[str, str] = {
    "factory.returns": "the factory must return an Environment instance",
    "reset.returns": "reset must return the documented shape and types",
    "state.returns": "state must be a State instance",
    "no_global_random": "reset and step must not use the process-wide `random` generator",
    "reset.seed_determinism": "the same seed must give the same first observation",
    "reset.concurrent_seed_determinism": (
        "the same seed must give the same first observation when sessions reset concurrently"
    ),
    "step.returns": "step must return the documented shape and types",
    "step.seed_determinism": "the same seed and the same replies must give the same episode",
    "step.after_done_refused": "a step after the episode ended must be refused (raise)",
    "close.idempotent": "close must succeed when called twice",
}

#: Replies the checker plays when none are given: the generic random policy's.
DEFAULT_REPLIES: tuple[str, ...] = GENERIC_REPLIES

_EPISODE_ID = "check-env-episode"


class EnvCheckError(EnvSDKError):
    """An environment broke a rule. `rule` is its identifier (a key of `RULES`), `detail` says
    what was seen."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"[{rule}] {RULES[rule]}: {detail}")
        self.rule = rule
        self.detail = detail


@dataclass
class CheckReport:
    """What `check_env` verified: `passed` rules in order, `skipped` rules with the reason, and
    how many steps the checked episode took."""

    target: str
    shape: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    episode_steps: int = 0
    episode_done: bool = False

    def __str__(self) -> str:
        ended = "ended" if self.episode_done else "did not end"
        lines = [
            f"check-env {self.target} ({self.shape}): {len(self.passed)} rules passed,"
            f" {len(self.skipped)} skipped; the checked episode {ended} after {self.episode_steps} steps"
        ]
        lines += [f"  ok    {rule}: {RULES[rule]}" for rule in self.passed]
        lines += [f"  skip  {rule}: {why}" for rule, why in self.skipped.items()]
        return "\n".join(lines)


def _fail(rule: str, detail: str) -> typing.NoReturn:
    raise EnvCheckError(rule, detail)


class _GlobalRandomGuard:
    """Fails `no_global_random` when the process-wide generator moved during a call."""

    def __init__(self) -> None:
        self._state = random.getstate()

    def check(self, what: str) -> None:
        if random.getstate() != self._state:
            _fail(
                "no_global_random",
                f"{what} changed the state of the module-level `random` generator; give each"
                " instance its own random.Random(seed)",
            )



def _check_concurrent_resets(differing: int, concurrency: int, seed: int, report: CheckReport) -> None:
    """The `reset.concurrent_seed_determinism` verdict, given how many concurrent resets differed."""
    if differing:
        _fail(
            "reset.concurrent_seed_determinism",
            f"{differing} of {concurrency} concurrent resets with seed {seed} gave a different first"
            " observation; shared random state (the module-level `random`, a class attribute) is"
            " the usual cause",
        )
    report.passed.append("reset.concurrent_seed_determinism")

async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _call(rule: str, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a sync or async environment method; an exception it raises breaks `rule`."""
    try:
        return await _maybe_await(fn(*args, **kwargs))
    except EnvCheckError:
        raise
    except Exception as exc:
        raise EnvCheckError(rule, f"{what} raised {type(exc).__name__}: {exc}") from exc


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------------------- Env (ms-swift style)


def _check_env_reset(out: Any) -> tuple[str, dict[str, Any], str | None]:
    if not (isinstance(out, tuple) and len(out) == 3):
        _fail("reset.returns", f"expected a tuple (observation, info, system_message), got {_describe(out)}")
    observation, info, system_message = out
    if not isinstance(observation, str):
        _fail("reset.returns", f"the observation must be a str, got {type(observation).__name__}")
    if not isinstance(info, dict):
        _fail("reset.returns", f"info must be a dict, got {type(info).__name__}")
    if system_message is not None and not isinstance(system_message, str):
        _fail("reset.returns", f"the system message must be a str or None, got {type(system_message).__name__}")
    return observation, info, system_message


def _check_env_step(out: Any) -> tuple[str, float, bool, dict[str, Any]]:
    if not (isinstance(out, tuple) and len(out) == 4):
        _fail("step.returns", f"expected a tuple (observation, reward, done, info), got {_describe(out)}")
    observation, reward, done, info = out
    if not isinstance(observation, str):
        _fail("step.returns", f"the observation must be a str, got {type(observation).__name__}")
    if not _is_number(reward):
        _fail("step.returns", f"the reward must be a finite int or float, got {_describe(reward)}")
    if not isinstance(done, bool):
        _fail("step.returns", f"done must be a bool, got {type(done).__name__}")
    if not isinstance(info, dict):
        _fail("step.returns", f"info must be a dict, got {type(info).__name__}")
    return observation, reward, done, info


async def _check_local_env(
    env_cls: type[Env], report: CheckReport, *, seed: int, concurrency: int, max_steps: int,
    replies: Sequence[str],
) -> None:
    env_config = {"seed": seed}

    def request() -> RolloutRequest:
        return RolloutRequest(
            messages=[{"role": "user", "content": "<check-env>"}],
            data_dict={"env_config": dict(env_config)},
            uuid=_EPISODE_ID,
        )

    env, twin = env_cls(dict(env_config)), env_cls(dict(env_config))
    guard = _GlobalRandomGuard()
    observation, info, system_message = _check_env_reset(await _call("reset.returns", "reset", env.reset, request()))
    report.passed.append("reset.returns")
    guard.check("reset")

    twin_observation, twin_info, twin_system = _check_env_reset(
        await _call("reset.returns", "reset", twin.reset, request())
    )
    if (twin_observation, twin_system) != (observation, system_message):
        _fail(
            "reset.seed_determinism",
            f"two instances reset with seed {seed} gave {_describe(observation)} and"
            f" {_describe(twin_observation)}",
        )
    if twin_info != info:
        _fail(
            "reset.seed_determinism",
            f"two instances reset with seed {seed} gave the infos {_describe(info)} and {_describe(twin_info)}",
        )
    report.passed.append("reset.seed_determinism")

    crowd = [env_cls(dict(env_config)) for _ in range(concurrency)]
    try:
        outs = await asyncio.gather(*(_call("reset.returns", "reset", e.reset, request()) for e in crowd))
    finally:
        await asyncio.gather(*(e.close() for e in crowd), return_exceptions=True)
    firsts = [_check_env_reset(out) for out in outs]
    differing = sum(1 for out in firsts if out != (observation, info, system_message))
    _check_concurrent_resets(differing, concurrency, seed, report)

    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    if system_message is not None:
        messages.append({"role": "system", "content": system_message})
    messages.append({"role": "user", "content": observation})
    done = False
    for _ in range(max_steps):
        messages.append({"role": "assistant", "content": rng.choice(replies)})
        guard = _GlobalRandomGuard()
        out = _check_env_step(await _call("step.returns", "step", env.step, [dict(m) for m in messages]))
        guard.check("step")
        twin_out = _check_env_step(await _call("step.returns", "step", twin.step, [dict(m) for m in messages]))
        if out[:3] != twin_out[:3]:
            _fail(
                "step.seed_determinism",
                f"at step {report.episode_steps + 1} two instances with seed {seed} answered"
                f" {_describe(out[:3])} and {_describe(twin_out[:3])} to the same conversation",
            )
        report.episode_steps += 1
        messages.append({"role": "user", "content": out[0]})
        done = out[2]
        if done:
            break
    report.passed += ["step.returns", "step.seed_determinism", "no_global_random"]
    report.episode_done = done

    if done:
        messages.append({"role": "assistant", "content": rng.choice(replies)})
        try:
            after = await env.step([dict(m) for m in messages])
        except Exception:
            report.passed.append("step.after_done_refused")
        else:
            _fail("step.after_done_refused", f"step after done returned {_describe(after)}")
    else:
        report.skipped["step.after_done_refused"] = f"no episode ended within {max_steps} steps"

    try:
        for instance in (env, twin):
            await instance.close()
            await instance.close()
    except Exception as exc:
        _fail("close.idempotent", f"the second close raised {type(exc).__name__}: {exc}")
    report.passed.append("close.idempotent")


# ------------------------------------------------------------------- Environment (server side)


def _step_types(env: Environment[Any, Any, Any]) -> tuple[type[Action] | None, type[Observation] | None]:
    """(action type, observation type) of an environment: the annotations of its ``step``
    (``def step(self, action: MyAction) -> MyObservation``, as the README writes it), else the
    arguments of ``Environment[MyAction, MyObservation, …]`` among its bases."""
    action: Any = None
    observation: Any = None
    try:
        hints = typing.get_type_hints(type(env).step)
    except Exception:  # unresolvable annotations: fall back to the generic arguments
        hints = {}
    action, observation = hints.get("action"), hints.get("return")
    for klass in type(env).__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Environment):
                args = typing.get_args(base)
                action = action if action is not None else (args[0] if args else None)
                observation = observation if observation is not None else (args[1] if len(args) > 1 else None)
    return (
        action if isinstance(action, type) and issubclass(action, Action) else None,
        observation if isinstance(observation, type) and issubclass(observation, Observation) else None,
    )


def _sample_action(action_type: type[Action], rng: random.Random, replies: Sequence[str]) -> Action | None:
    """An action whose required fields are drawn by `rng`; ``None`` when a field has a type the
    checker cannot invent values for."""
    values: dict[str, Any] = {}
    for name, info in action_type.model_fields.items():
        if not info.is_required():
            continue
        annotation = info.annotation
        if annotation is str:
            values[name] = rng.choice(replies)
        elif annotation is int:
            values[name] = rng.randint(0, 9)
        elif annotation is float:
            values[name] = rng.random()
        elif annotation is bool:
            values[name] = rng.random() < 0.5
        elif typing.get_origin(annotation) is list and typing.get_args(annotation)[:1] in ((dict,), (dict[str, Any],)):
            values[name] = [{"role": "assistant", "content": rng.choice(replies)}]
        else:
            return None
    return action_type(**values)


def _check_observation(rule: str, obs: Any, what: str) -> Observation:
    if not isinstance(obs, Observation):
        _fail(rule, f"{what} must return an Observation instance, got {_describe(obs)}")
    if obs.reward is not None and not (_is_number(obs.reward) or isinstance(obs.reward, bool)):
        _fail(rule, f"{what}: the reward must be a finite number or None, got {_describe(obs.reward)}")
    if not isinstance(obs.done, bool):
        _fail(rule, f"{what}: done must be a bool, got {_describe(obs.done)}")
    return obs


def _reset_in_threads(factory: Callable[[], Any], seed: int, concurrency: int) -> list[Any]:
    """Reset `concurrency` fresh sync environments from as many threads, released together."""
    barrier = threading.Barrier(concurrency)

    def one() -> Any:
        instance = factory()
        barrier.wait(timeout=30)
        try:
            return instance.reset(seed=seed, episode_id=_EPISODE_ID)
        finally:
            closing = instance.close()
            if inspect.iscoroutine(closing):  # a sync reset beside an async close
                asyncio.run(closing)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="check-env") as pool:
        return list(pool.map(lambda _: one(), range(concurrency)))


async def _check_server_environment(
    factory: Callable[[], Any], report: CheckReport, *, seed: int, concurrency: int, max_steps: int,
    replies: Sequence[str],
) -> None:
    env, twin = factory(), factory()
    for instance in (env, twin):
        if not isinstance(instance, Environment):
            _fail("factory.returns", f"got {_describe(instance)}")
    report.passed.append("factory.returns")

    guard = _GlobalRandomGuard()
    first = _check_observation(
        "reset.returns", await _call("reset.returns", "reset", env.reset, seed=seed, episode_id=_EPISODE_ID),
        "reset",
    )
    report.passed.append("reset.returns")
    guard.check("reset")
    if not isinstance(env.state, State):
        _fail("state.returns", f"got {_describe(env.state)}")
    report.passed.append("state.returns")

    twin_first = await _call("reset.returns", "reset", twin.reset, seed=seed, episode_id=_EPISODE_ID)
    if twin_first != first:
        _fail(
            "reset.seed_determinism",
            f"two instances reset with seed {seed} gave {_describe(first)} and {_describe(twin_first)}",
        )
    report.passed.append("reset.seed_determinism")

    if inspect.iscoroutinefunction(type(env).reset):
        crowd = [factory() for _ in range(concurrency)]
        try:
            outs = await asyncio.gather(*(e.reset(seed=seed, episode_id=_EPISODE_ID) for e in crowd))
        finally:
            for e in crowd:
                await _maybe_await(e.close())
    else:
        outs = await asyncio.to_thread(_reset_in_threads, factory, seed, concurrency)
    differing = sum(1 for out in outs if out != first)
    _check_concurrent_resets(differing, concurrency, seed, report)

    report.passed.append("no_global_random")  # reset checked above; steps are checked below

    action_type, observation_type = _step_types(env)
    rng = random.Random(seed)
    done = False
    played: list[Action] = []
    if action_type is None or _sample_action(action_type, random.Random(seed), replies) is None:
        reason = (
            "the action type is unknown (annotate `def step(self, action: MyAction) -> MyObservation`)"
            " or has fields the checker cannot fill"
        )
        for rule in ("step.returns", "step.seed_determinism", "step.after_done_refused"):
            report.skipped[rule] = reason
    else:
        for _ in range(max_steps):
            action = _sample_action(action_type, rng, replies)
            assert action is not None  # every field was fillable for the first sample
            played.append(action)
            guard = _GlobalRandomGuard()
            obs = _check_observation("step.returns", await _call("step.returns", "step", env.step, action), "step")
            guard.check("step")
            twin_obs = await _call("step.returns", "step", twin.step, action)
            if twin_obs != obs:
                _fail(
                    "step.seed_determinism",
                    f"at step {report.episode_steps + 1} two instances with seed {seed} answered"
                    f" {_describe(obs)} and {_describe(twin_obs)} to the same action",
                )
            report.episode_steps += 1
            done = obs.done
            if done:
                break
        report.passed += ["step.returns", "step.seed_determinism"]
        report.episode_done = done
        if not done:
            report.skipped["step.after_done_refused"] = f"no episode ended within {max_steps} steps"
        elif observation_type is None:
            report.skipped["step.after_done_refused"] = "the observation type is unknown (annotate step's return)"
        else:
            await _check_served_after_done(factory, action_type, observation_type, seed, played)
            report.passed.append("step.after_done_refused")

    try:
        for instance in (env, twin):
            await _maybe_await(instance.close())
            await _maybe_await(instance.close())
    except Exception as exc:
        _fail("close.idempotent", f"the second close raised {type(exc).__name__}: {exc}")
    report.passed.append("close.idempotent")


async def _check_served_after_done(
    factory: Callable[[], Any], action_type: type[Action], observation_type: type[Observation],
    seed: int, played: Sequence[Action],
) -> None:
    """Replay the ended episode through an envsdk server (in this process, no socket) and check
    that one more step is refused: an Environment need not refuse it itself, its server does."""
    from envsdk.client import EnvClient
    from envsdk.client.transports import InProcessTransport
    from envsdk.errors import EpisodeDoneError
    from envsdk.server import create_app

    app = create_app(factory, action_type, observation_type, max_concurrent_envs=1, web=False)
    async with InProcessTransport(app) as transport:
        async with EnvClient("http://check-env", transport=transport) as client:
            await client.reset(seed=seed, episode_id=_EPISODE_ID)
            for action in played:
                result = await client.step(action.model_dump(exclude={"metadata"}))
            if not result.done:
                _fail("step.seed_determinism", "replayed through a server, the episode did not end")
            try:
                after = await client.step(played[-1].model_dump(exclude={"metadata"}))
            except EpisodeDoneError:
                return
            _fail("step.after_done_refused", f"the served env answered {_describe(after)}")


# ------------------------------------------------------------------------------ entry points


def _name_of(target: Any) -> str:
    return getattr(target, "__qualname__", None) or type(target).__name__


async def check_env_async(
    target: Any,
    *,
    seed: int = 0,
    concurrency: int = 16,
    max_steps: int = 50,
    replies: Sequence[str] = DEFAULT_REPLIES,
) -> CheckReport:
    """`check_env` for callers already inside an event loop."""
    if isinstance(target, str):
        target = resolve_target(target)
    if concurrency < 2:
        raise ValueError(f"concurrency must be at least 2 to test concurrent seeding, got {concurrency}")
    if not replies:
        raise ValueError("replies must not be empty")
    if isinstance(target, type) and issubclass(target, Env):
        report = CheckReport(_name_of(target), "Env")
        await _check_local_env(
            target, report, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies
        )
    elif callable(target):
        report = CheckReport(_name_of(target), "Environment")
        await _check_server_environment(
            target, report, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies
        )
    else:
        raise TypeError(
            f"check_env expects an Env class, an Environment class or factory, or a name; got {target!r}"
        )
    return report


def check_env(
    target: Any,
    *,
    seed: int = 0,
    concurrency: int = 16,
    max_steps: int = 50,
    replies: Sequence[str] = DEFAULT_REPLIES,
) -> CheckReport:
    """Check that `target` obeys its environment contract; see the module docstring for the rules.

    `target` is an `Env` subclass, an `Environment` subclass or zero-argument factory, or a
    string for `resolve_target`. Raises `EnvCheckError` (its `rule` names the broken rule) or
    returns a `CheckReport`. Runs its own event loop: from async code use `check_env_async`.
    """
    return asyncio.run(
        check_env_async(target, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies)
    )


def resolve_target(spec: str) -> Any:
    """A registered env name, ``package.module:Class`` or ``path/to/file.py:Class`` -> the object.

    Raises `EnvNotFoundError` for an unknown name (listing the known ones), `ImportError` for an
    unknown module or attribute, `PluginLoadError` for a file that is missing or fails to import.
    """
    if spec in envs or ":" not in spec:
        return envs[spec]
    return import_spec(spec)


def add_check_env_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``check-env TARGET [--external-plugins FILE ...] [--seed S]`` to an argparse CLI.

    The sub-command's ``func`` default is `run_check_env`, which returns the exit code.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check-env",
        help="check that an environment obeys the reset/step/seed/close contract",
        description=(
            "Run an environment directly and check its contract: return shapes, seeding"
            " (also under concurrency), steps after done, idempotent close."
        ),
    )
    parser.add_argument("target", help="a registered env name, module:Class or path.py:Class")
    parser.add_argument(
        "--external-plugins", "--external_plugins", dest="external_plugins", nargs="+",
        action="extend", default=[], metavar="FILE", help="plugin files to import first",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed to check with (default 0)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent resets (default 16)")
    parser.add_argument("--max-steps", type=int, default=50, help="steps to play at most (default 50)")
    parser.set_defaults(func=run_check_env)
    return parser


def run_check_env(args: argparse.Namespace) -> int:
    """Run ``check-env`` from parsed arguments: 0 when every rule holds, 1 when one is broken,
    2 when the target could not be loaded."""
    try:
        load_plugins(args.external_plugins)
        target = resolve_target(args.target)
    except (EnvNotFoundError, PluginLoadError, ImportError) as exc:
        print(f"check-env: cannot load {args.target!r}: {exc}", file=sys.stderr)
        return 2
    try:
        report = check_env(target, seed=args.seed, concurrency=args.concurrency, max_steps=args.max_steps)
    except EnvCheckError as exc:
        print(f"check-env {args.target}: FAILED rule {exc.rule}: {RULES[exc.rule]}: {exc.detail}", file=sys.stderr)
        return 1
    print(report)
    return 0
