"""`check_env`: does an environment obey its contract? In the spirit of Gymnasium's checker.

It runs an environment directly (no server) and checks, in this order, the rules in `RULES`:
the shapes and types that ``reset`` and ``step`` return, that the process-wide ``random``
generator is left alone, that one seed gives one first observation — also when `concurrency`
sessions reset at the same time, which is how a trainer runs them and where shared random state
shows — that a seeded episode replays step for step, that steps after the end are refused and
that ``close`` may be called twice. A broken rule does not stop the check where the rules after
it can still be judged (a wrong reset or step shape, or a factory that makes no environment,
does): every broken rule is found, and `EnvCheckError` names the first with the report of them
all (``envsdk check-env`` prints one line for each); otherwise a `CheckReport` lists what was
checked, what could not be (with the reason) and the
`WARNINGS` that apply: nothing broken, but a rollout would likely go wrong (no text reply
becomes the env's action; another seed changes nothing the env shows; threads left running).

It judges instead of dying. Every env call has a deadline (`call_timeout`, 30 s by default): a
call that does not return in time breaks its rule. Anything a call raises breaks its rule,
``SystemExit`` included. The check runs in a thread of its own, watched from the caller's, so a
call that blocks the event loop or ignores cancellation is reported all the same (and left
running in that daemon thread). ``envsdk check-env`` always ends with a verdict: exit code 0
(passed), 1 (a rule broken, or a warning under ``--strict``) or 2 (the target or an option
could not be used), and it does not wait for threads the environment left behind.

Both environment shapes are covered: an `Env` class (local, ms-swift style; checked through
``asyncio.gather``) and an `Environment` class or zero-argument factory (server side; a sync one
is reset from threads). An `Env` is played with replies drawn, by a ``random.Random(seed)``,
from `DEFAULT_REPLIES` (or the caller's `replies`). An `Environment` is played with the actions a
rollout would send for those replies (`envsdk.formats.parse_reply` with the action's schema), or
with the caller's `actions`; when no reply makes a valid action, with invented field values.
Replies (or actions) that reach the env's seeded logic are what lets the seeding rules see an env
that ignores its seed: the generic replies may never get past its input check.

The ``envsdk check-env TARGET`` command is added to a CLI by `add_check_env_parser`; with
``--hacks`` it runs the reward-hack probe (`envsdk.hack_probe`) against a code env instead.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import json
import math
import os
import random
import sys
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from envsdk._process import print_out
from envsdk.env import Env, Environment, RolloutRequest, is_openenv_environment, overrides_async
from envsdk.errors import EnvSDKError
from envsdk.formats import ReplyParseError, parse_reply
from envsdk.hack_probe.runner import DEFAULT_CONCURRENCY as DEFAULT_HACK_CONCURRENCY
from envsdk.hack_probe.runner import HACK_ONLY, add_hack_arguments, run_hack_probe
from envsdk.protocol import validation_errors, validation_message
from envsdk.policies.scripted import GENERIC_REPLIES
from envsdk.registry import envs, import_spec, load_plugins
from envsdk.rewards.parts import TIMINGS
from envsdk.schema_values import random_value
from envsdk.types import Action, Observation, State


__all__ = [
    "RULES",
    "WARNINGS",
    "DEFAULT_REPLIES",
    "DEFAULT_CALL_TIMEOUT_S",
    "MAX_CONCURRENCY",
    "EnvCheckError",
    "CheckOptionError",
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
    "tools.list": "a tool environment must list its tools (MCP tools/list)",
    "tools.reserved_names": "no tool may be named reset, step, state or close",
    "tools.schemas": "every tool's input schema must be a JSON object schema",
    "tools.call": "a tool must answer a call with arguments its schema allows, with a JSON result",
}

#: What the checker warns about, by identifier: nothing broken, but a rollout would likely go
#: wrong. ``check-env --strict`` fails on any of them.
WARNINGS: dict[str, str] = {
    "action.from_reply": "a rollout's text reply should become a valid action",
    "seed.changes_nothing": "another seed should change what the environment shows",
    "close.threads": "no thread the environment started should outlive close",
}

#: Replies the checker plays when none are given: the generic random policy's.
DEFAULT_REPLIES: tuple[str, ...] = GENERIC_REPLIES

#: The default deadline of one env call, in seconds (``--call-timeout``).
DEFAULT_CALL_TIMEOUT_S = 30.0

_EPISODE_ID = "check-env-episode"
# How long past a call's deadline the watchdog waits before it gives the call up: the deadline's
# own cancellation answers first whenever the event loop is free.
_WATCHDOG_GRACE_S = 1.0
# Exception messages and values quoted in a verdict are cut to this many characters.
_QUOTE_CHARS = 300


class EnvCheckError(EnvSDKError):
    """An environment broke a rule. `rule` is its identifier (a key of `RULES`), `detail` says
    what was seen; `report`, when the check went on past it, holds every rule broken
    (``report.failed``) and what held."""

    def __init__(self, rule: str, detail: str, report: CheckReport | None = None) -> None:
        super().__init__(f"[{rule}] {RULES[rule]}: {detail}")
        self.rule = rule
        self.detail = detail
        self.report = report

    @property
    def failures(self) -> dict[str, str]:
        """Every broken rule with what was seen, in the order found (this one alone without a report)."""
        return dict(self.report.failed) if self.report is not None and self.report.failed else {self.rule: self.detail}


class CheckOptionError(ValueError):
    """An option of the check that cannot be used (a count out of its bounds) or does not fit the
    environment (an `actions` entry its action type refuses, actions for an `Env`); the message
    names the option and what it needs."""


@dataclass
class CheckReport:
    """What `check_env` verified: `passed` rules in order, `skipped` rules with the reason,
    `warnings` (keys of `WARNINGS`) with what was seen, and how many steps the checked episode
    took."""

    target: str
    shape: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: dict[str, str] = field(default_factory=dict)
    #: Rules broken, with what was seen, in the order found.
    failed: dict[str, str] = field(default_factory=dict)
    episode_steps: int = 0
    episode_done: bool = False

    def __str__(self) -> str:
        ended = "ended" if self.episode_done else "did not end"
        lines = [
            f"check-env {self.target} ({self.shape}): {len(self.passed)} rules passed,"
            f" {len(self.skipped)} skipped; the checked episode {ended} after {_count(self.episode_steps, 'step')};"
            f" {_count(len(self.warnings), 'warning')}"
        ]
        lines += [f"  ok    {rule}: {RULES[rule]}" for rule in self.passed]
        lines += [f"  skip  {rule}: {why}" for rule, why in self.skipped.items()]
        lines += [f"  warn  {name}: {WARNINGS[name]}: {seen}" for name, seen in self.warnings.items()]
        return "\n".join(lines)


def _fail(rule: str, detail: str) -> typing.NoReturn:
    raise EnvCheckError(rule, detail)


@contextlib.contextmanager
def _judged(report: CheckReport) -> typing.Iterator[None]:
    """Run a block whose rules the rest of the check does not depend on: a rule it breaks is
    noted in ``report.failed`` (the first verdict per rule) and the check goes on after it."""
    try:
        yield
    except EnvCheckError as exc:
        report.failed.setdefault(exc.rule, exc.detail)


def _held(report: CheckReport, *rules: str) -> None:
    """Note `rules` as passed, but those already broken."""
    report.passed += [rule for rule in rules if rule not in report.failed]


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

# ------------------------------------------------------------------------ deadlines


@dataclass
class _Pending:
    """One env call (or group of calls) in progress: the rule it answers to and its deadline."""

    rule: str
    what: str
    timeout: float
    deadline: float


class _Watch:
    """The env calls in progress, read by the thread that waits for the check: a call that
    blocks the event loop (or ignores cancellation) cannot be stopped from inside the loop, so
    that thread gives it up once its deadline has passed."""

    def __init__(self, call_timeout: float) -> None:
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []

    def begin(self, rule: str, what: str, timeout: float) -> _Pending:
        pending = _Pending(rule, what, timeout, time.monotonic() + timeout)
        with self._lock:
            self._pending.append(pending)
        return pending

    def end(self, pending: _Pending) -> None:
        with self._lock:
            self._pending.remove(pending)

    def overdue(self) -> _Pending | None:
        """The first call past its deadline and the grace period, if any."""
        now = time.monotonic()
        with self._lock:
            return next((p for p in self._pending if now > p.deadline + _WATCHDOG_GRACE_S), None)


# The running check's deadlines: set once per check in its own thread, read by every env call.
_WATCH: contextvars.ContextVar[_Watch] = contextvars.ContextVar("check_env_watch")


def _too_slow(what: str, timeout: float) -> str:
    return f"{what} did not return within {timeout:g} s (raise --call-timeout if it is only slow)"


@contextlib.asynccontextmanager
async def _deadline(rule: str, what: str, timeout: float | None = None) -> AsyncIterator[None]:
    """Bound the block by `timeout` (default: the check's call deadline); running past it
    breaks `rule`. The watchdog knows the block while it runs."""
    watch = _WATCH.get()
    seconds = watch.call_timeout if timeout is None else timeout
    pending = watch.begin(rule, what, seconds)
    task = asyncio.current_task()
    assert task is not None  # env calls are awaited from the check's tasks
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    # asyncio.timeout does this from Python 3.11 on; the checker runs on 3.10 as well.
    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        yield
    except asyncio.CancelledError as exc:
        if expired:
            raise EnvCheckError(rule, _too_slow(what, seconds)) from None
        # Nothing else cancels the check's own tasks: this came out of the environment's code.
        raise EnvCheckError(rule, f"{what} raised CancelledError") from exc
    finally:
        timer.cancel()
        watch.end(pending)
    if expired:  # the call swallowed the cancellation and returned late
        raise EnvCheckError(rule, _too_slow(what, seconds))


async def _call(
    rule: str, what: str, fn: Callable[..., Any], *args: Any,
    expect: tuple[type[Exception], ...] = (), within: float | None = None, **kwargs: Any,
) -> Any:
    """Call a sync or async environment method under the call deadline (or `within` seconds).
    Whatever it raises breaks `rule` (``SystemExit`` too: an env that ends the process must
    not read as a pass), but for exceptions of the `expect` types, which are raised as they are.

    The coroutine is awaited in the calling task, never wrapped in one of its own: asyncio lets
    a ``SystemExit`` raised inside a task escape the event loop."""
    async with _deadline(rule, what, within):
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
            return value
        except (EnvCheckError, asyncio.CancelledError):
            raise
        except expect:
            raise
        except BaseException as exc:
            raise EnvCheckError(rule, f"{what} raised {_quote_exception(exc)}") from exc


async def _cleanup(rule: str, what: str, fn: Callable[..., Any], *args: Any) -> None:
    """`_call` for a cleanup step after a failure: the failure being reported wins over one of
    the cleanup (which is still bounded by the deadline)."""
    with contextlib.suppress(EnvCheckError):
        await _call(rule, what, fn, *args)


def _in_daemon_thread(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """Run `fn` in a new daemon thread: one that never returns cannot hold up the exit, as a
    pool's worker (joined at interpreter exit) would."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: it is the env's verdict
            future.set_exception(exc)

    threading.Thread(target=run, name="check-env-call", daemon=True).start()
    return future


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _quote_exception(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


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
    name = env_cls.__name__

    def request(episode_seed: int) -> RolloutRequest:
        return RolloutRequest(
            messages=[{"role": "user", "content": "<check-env>"}],
            data_dict={"env_config": {"seed": episode_seed}},
            uuid=_EPISODE_ID,
        )

    async def build(episode_seed: int) -> Env:
        return typing.cast(
            Env, await _call("reset.returns", f"{name}(env_config)", env_cls, {"seed": episode_seed})
        )

    env, twin = await build(seed), await build(seed)
    guard = _GlobalRandomGuard()
    observation, info, system_message = _check_env_reset(
        await _call("reset.returns", "reset", env.reset, request(seed))
    )
    report.passed.append("reset.returns")
    with _judged(report):
        guard.check("reset")

    with _judged(report):
        twin_observation, twin_info, twin_system = _check_env_reset(
            await _call("reset.returns", "reset", twin.reset, request(seed))
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

    with _judged(report):
        crowd = [await build(seed) for _ in range(concurrency)]
        try:
            outs = await asyncio.gather(*(_call("reset.returns", "reset", e.reset, request(seed)) for e in crowd))
        finally:
            await asyncio.gather(*(_cleanup("close.idempotent", "close", e.close) for e in crowd))
        firsts = [_check_env_reset(out) for out in outs]
        differing = sum(1 for out in firsts if out != (observation, info, system_message))
        _check_concurrent_resets(differing, concurrency, seed, report)

    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    if system_message is not None:
        messages.append({"role": "system", "content": system_message})
    messages.append({"role": "user", "content": observation})
    trace: list[Any] = [(observation, info, system_message)]
    done = False
    with _judged(report):
        for _ in range(max_steps):
            messages.append({"role": "assistant", "content": rng.choice(replies)})
            guard = _GlobalRandomGuard()
            out = _check_env_step(await _call("step.returns", "step", env.step, [dict(m) for m in messages]))
            with _judged(report):
                guard.check("step")
            twin_out = _check_env_step(await _call("step.returns", "step", twin.step, [dict(m) for m in messages]))
            if out[:3] != twin_out[:3]:
                report.failed.setdefault(
                    "step.seed_determinism",
                    f"at step {report.episode_steps + 1} two instances with seed {seed} answered"
                    f" {_describe(out[:3])} and {_describe(twin_out[:3])} to the same conversation",
                )
            report.episode_steps += 1
            messages.append({"role": "user", "content": out[0]})
            trace.append(out[:3])
            done = out[2]
            if done:
                break
    _held(report, "step.returns", "step.seed_determinism", "no_global_random")
    report.episode_done = done

    if "step.returns" in report.failed:
        report.skipped["step.after_done_refused"] = "step.returns is broken: no episode was played to its end"
    elif done:
        messages.append({"role": "assistant", "content": rng.choice(replies)})
        with _judged(report):
            try:
                after = await _call(
                    "step.after_done_refused", "a step after done", env.step, [dict(m) for m in messages],
                    expect=(Exception,),
                )
            except EnvCheckError:
                raise
            except Exception:
                report.passed.append("step.after_done_refused")
            else:
                _fail("step.after_done_refused", f"step after done returned {_describe(after)}")
    else:
        report.skipped["step.after_done_refused"] = f"no episode ended within {max_steps} steps"

    with _judged(report):
        other = await build(seed + 1)
        try:
            other_trace = await _local_trace(other, request(seed + 1), random.Random(seed), replies, len(trace) - 1)
        finally:
            await _cleanup("close.idempotent", "close", other.close)
        _compare_seeds(trace, other_trace, seed, report)

    await _check_closes(report, env, twin)


async def _check_closes(report: CheckReport, *instances: Any) -> None:
    """``close.idempotent``: each of `instances` closes, then closes again without raising."""
    with _judged(report):
        for instance in instances:
            await _call("close.idempotent", "close", instance.close)
            await _call("close.idempotent", "the second close", instance.close)
        report.passed.append("close.idempotent")


async def _local_trace(
    env: Env, request: RolloutRequest, rng: random.Random, replies: Sequence[str], steps: int
) -> list[Any]:
    """What `env` shows over `steps` steps (fewer if it ends) played with the replies `rng` draws."""
    observation, info, system_message = _check_env_reset(await _call("reset.returns", "reset", env.reset, request))
    messages: list[dict[str, Any]] = [{"role": "user", "content": observation}]
    trace: list[Any] = [(observation, info, system_message)]
    for _ in range(steps):
        messages.append({"role": "assistant", "content": rng.choice(replies)})
        out = _check_env_step(await _call("step.returns", "step", env.step, [dict(m) for m in messages]))
        messages.append({"role": "user", "content": out[0]})
        trace.append(out[:3])
        if out[2]:
            break
    return trace


def _compare_seeds(trace: list[Any], other: list[Any], seed: int, report: CheckReport) -> None:
    """The `seed.changes_nothing` warning, when seeds `seed` and ``seed + 1`` showed the same."""
    if trace == other:
        report.warnings["seed.changes_nothing"] = (
            f"seeds {seed} and {seed + 1} gave the same first observation and the same"
            f" {len(trace) - 1} steps; if the environment has random parts it may ignore its seed:"
            " pass --replies (or --action) that reach its seeded logic, or ignore this for a"
            " deterministic environment"
        )


def _threads_left(before: set[threading.Thread]) -> list[threading.Thread]:
    """Non-daemon threads started since `before` that are still running (given a moment to end)."""
    deadline = time.monotonic() + 1.0
    left = []
    for thread in threading.enumerate():
        if thread in before or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread)
    return left


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
    # OpenEnv's Action and Observation are pydantic models of their own, served alike.
    return (
        action if isinstance(action, type) and (issubclass(action, Action) or _is_openenv_type(action)) else None,
        observation
        if isinstance(observation, type) and (issubclass(observation, Observation) or _is_openenv_type(observation))
        else None,
    )


def _is_openenv_type(cls: type) -> bool:
    """A pydantic model class deriving from one of openenv's (its Action, Observation)."""
    return issubclass(cls, BaseModel) and any((k.__module__ or "").startswith("openenv.") for k in cls.__mro__[1:])


def _sample_action(action_type: type[Action], rng: random.Random, replies: Sequence[str]) -> Action | None:
    """An action whose required fields are drawn by `rng`: text fields from `replies`, others
    from the field's JSON schema, within its bounds (`envsdk.schema_values`); ``None`` when no
    value drawn so fits the field (a type the checker cannot invent values for)."""
    schema = action_type.model_json_schema()
    properties = schema.get("properties") or {}
    values: dict[str, Any] = {}
    for name, info in action_type.model_fields.items():
        if not info.is_required():
            continue
        annotation = info.annotation
        if annotation is str:
            values[name] = rng.choice(replies)
        elif typing.get_origin(annotation) is list and typing.get_args(annotation)[:1] in ((dict,), (dict[str, Any],)):
            values[name] = [{"role": "assistant", "content": rng.choice(replies)}]
        elif (info.alias or name) in properties:
            values[name] = random_value(rng, properties[info.alias or name], schema)
        else:
            return None
    try:
        return action_type(**values)
    except ValidationError:
        return None


def _is_openenv_model(value: Any, field_name: str) -> bool:
    """An OpenEnv (openenv.core) model with `field_name`: OpenEnv's Observation and State are
    pydantic models that are not envsdk's classes, and `create_app` serves them as well."""
    return (
        isinstance(value, BaseModel)
        and field_name in type(value).model_fields
        and any((klass.__module__ or "").startswith("openenv.") for klass in type(value).__mro__)
    )


class NotAnEnvironmentError(CheckOptionError):
    """The target is not something check-env can run: not an `Env` class, nor an `Environment`
    class, nor a factory callable with no arguments."""


def _is_environment_class(cls: type) -> bool:
    return issubclass(cls, Environment) or is_openenv_environment(cls)


def _served(env: Any, name: str) -> Callable[..., Any]:
    """The method a server calls for `name` ("reset" or "step") on a server-side `env`, so that
    it is the one checked: ``<name>_async`` where an OpenEnv env's class overrides it (OpenEnv
    0.10's server and envsdk's call that one then, `envsdk.env.overrides_async`), else `name`."""
    return getattr(env, f"{name}_async" if overrides_async(type(env), name) else name)  # type: ignore[no-any-return]


def _check_is_factory(target: Any) -> None:
    """Refuse, before anything runs, a target that cannot make environments: a class other than
    an environment (an action, an observation), or a callable that needs arguments (an ASGI app
    such as ``create_app``'s, which takes ``scope, receive, send``)."""
    name = _name_of(target)
    if isinstance(target, type):
        if not _is_environment_class(target):
            bases = ", ".join(k.__name__ for k in target.__mro__[1:-1][:3]) or "object"
            raise NotAnEnvironmentError(
                f"{name} is a class ({bases}), not an environment: name an Env or Environment class,"
                " or a function that returns an Environment"
            )
        return
    try:
        inspect.signature(target).bind()
    except TypeError:
        raise NotAnEnvironmentError(
            f"{name} ({type(target).__name__}) cannot be called without arguments, so it is not an environment"
            " factory (an app built by create_app is served with `envsdk serve`, not checked): name the"
            " Environment class, or a function that returns one"
        ) from None
    except ValueError:  # no signature to read (a builtin): let the call say
        return


def _is_environment(value: Any) -> bool:
    """An envsdk `Environment`, or an OpenEnv one (which `create_app` serves as well)."""
    return _is_environment_class(type(value))


_JSON_SAMPLES: dict[str, Any] = {"integer": 1, "number": 1.0, "string": "hello", "boolean": True}


async def _check_tools(factory: Callable[[], Any], report: CheckReport, seed: int) -> None:
    """The tool rules, for an env with tools (envsdk ``@tool`` methods or an OpenEnv
    ``MCPEnvironment``), on an instance of its own: listed, names not reserved, object schemas,
    and one call answered."""
    from envsdk.tools import RESERVED_TOOL_NAMES, is_tool_env

    env = await _call("factory.returns", "the factory", factory)
    if not is_tool_env(env):
        await _call("close.idempotent", "close", env.close)
        return  # the tool rules apply to tool environments only
    from envsdk.server.mcp import release, tools_of

    try:
        await _call("reset.returns", "reset", _served(env, "reset"), seed=seed, episode_id=_EPISODE_ID)
        tools = tools_of(env)
        try:
            listed = await _call("tools.list", "tools/list", tools.list) if tools is not None else []
            if not listed:
                _fail("tools.list", "the environment has no tools")
            report.passed.append("tools.list")
            reserved = sorted(t["name"] for t in listed if t["name"] in RESERVED_TOOL_NAMES)
            if reserved:
                _fail("tools.reserved_names", f"tools named {reserved}")
            report.passed.append("tools.reserved_names")
            for entry in listed:
                schema = entry.get("inputSchema")
                if not isinstance(schema, dict) or schema.get("type") != "object":
                    _fail("tools.schemas", f"tool {entry['name']!r} has input schema {_describe(schema)}")
            report.passed.append("tools.schemas")
            await _check_one_tool_call(env, tools, listed, report)
        except BaseException:
            await _cleanup("tools.list", "releasing the tools", release, env)
            raise
        await _call("tools.list", "releasing the tools", release, env)
    except BaseException:
        await _cleanup("close.idempotent", "close", env.close)
        raise
    await _call("close.idempotent", "close", env.close)


async def _check_one_tool_call(env: Any, tools: Any, listed: list[dict[str, Any]], report: CheckReport) -> None:
    for entry in listed:
        schema = entry["inputSchema"]
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        if all(str(properties.get(name, {}).get("type")) in _JSON_SAMPLES for name in required):
            arguments = {name: _JSON_SAMPLES[str(properties[name]["type"])] for name in required}
            break
    else:
        report.skipped["tools.call"] = "no tool has only arguments the checker can fill (integer, number, string, boolean)"
        return
    name = entry["name"]
    what = f"tool {name}({arguments})"
    from envsdk.server.mcp import _NativeTools

    if isinstance(tools, _NativeTools):
        try:
            value = await _call("tools.call", what, functools.partial(getattr(env, name), **arguments), expect=(Exception,))
        except EnvCheckError:
            raise
        except Exception:  # noqa: BLE001 - a tool may refuse the checker's arguments: it answered
            report.passed.append("tools.call")
            return
        try:
            (await tools.tools())[name].convert_result(value)  # what the server would send
        except Exception as exc:
            _fail("tools.call", f"{what} returned {_describe(value)}, which cannot be sent: {exc}")
    else:
        client = await _call("tools.call", "connecting to the tools", tools.client)
        await _call("tools.call", what, client.call_tool, name, arguments, raise_on_error=False)
    report.passed.append("tools.call")


def _check_observation(rule: str, obs: Any, what: str) -> Observation:
    if _is_openenv_model(obs, "done"):
        return obs  # type: ignore[no-any-return]
    if not isinstance(obs, Observation):
        _fail(rule, f"{what} must return an Observation instance, got {_describe(obs)}")
    if obs.reward is not None and not (_is_number(obs.reward) or isinstance(obs.reward, bool)):
        _fail(rule, f"{what}: the reward must be a finite number or None, got {_describe(obs.reward)}")
    if not isinstance(obs.done, bool):
        _fail(rule, f"{what}: done must be a bool, got {_describe(obs.done)}")
    return obs


async def _reset_in_threads(factory: Callable[[], Any], seed: int, concurrency: int, timeout: float) -> list[Any]:
    """Reset `concurrency` fresh sync environments from as many threads, released together."""
    barrier = threading.Barrier(concurrency)

    def one() -> Any:
        instance = factory()
        barrier.wait(timeout=timeout)
        try:
            return instance.reset(seed=seed, episode_id=_EPISODE_ID)
        finally:
            closing = instance.close()
            if inspect.iscoroutine(closing):  # a sync reset beside an async close
                asyncio.run(closing)

    futures = [asyncio.wrap_future(_in_daemon_thread(one)) for _ in range(concurrency)]
    return list(await asyncio.gather(*futures))


def _dump(value: Any) -> Any:
    """A model's fields (for comparing what two instances showed) but the latencies its
    metadata reports (``timings``: how long a step took differs from run to run, and is no part
    of the episode), anything else as it is."""
    if not isinstance(value, BaseModel):
        return value
    dumped = value.model_dump()
    metadata = dumped.get("metadata")
    if isinstance(metadata, dict) and TIMINGS in metadata:
        dumped["metadata"] = {k: v for k, v in metadata.items() if k != TIMINGS}
    return dumped


def _state_dump(state: Any) -> Any:
    """`_dump` of a state without its episode id (the checker passes the same one anyway)."""
    dumped = _dump(state)
    if isinstance(dumped, dict):
        dumped.pop("episode_id", None)
    return dumped


def _playable_actions(
    action_type: type[Action], replies: Sequence[str], actions: Sequence[Mapping[str, Any]] | None,
    report: CheckReport,
) -> list[Action] | None:
    """The actions the steps are drawn from: `actions` (validated), else the replies a rollout
    would make into actions; None (and the `action.from_reply` warning) when no reply makes one."""
    if actions is not None:
        played = []
        for given in actions:
            try:
                played.append(action_type.model_validate(dict(given)))
            except ValidationError as exc:
                raise CheckOptionError(validation_message(
                    f"--action {json.dumps(given)[:200]} is not a {action_type.__name__}", validation_errors(exc)
                )) from None
        return played
    schema = action_type.model_json_schema()
    playable: list[Action] = []
    refusal = ""
    for reply in replies:
        try:
            playable.append(action_type.model_validate(parse_reply(reply, schema)))
        except (ReplyParseError, ValidationError) as exc:
            refusal = refusal or f"{reply!r}: {_quote_exception(exc)}"
    if playable:
        return playable
    fields = [name for name in action_type.model_fields if name != "metadata"]
    example = json.dumps({name: "..." for name in fields})
    report.warnings["action.from_reply"] = (
        f"none of the {len(replies)} replies played becomes a {action_type.__name__} the way a"
        f" rollout makes one (first refusal: {refusal}); a model must reply with a JSON object"
        f" such as {example}"
        + (f" or a bare value for {fields[0]!r}" if len(fields) == 1 else "")
        + ": say so in the observation, or pass --replies (or --action) that fit. The step rules"
        " were played with invented field values"
    )
    return None


async def _check_server_environment(
    factory: Callable[[], Any], report: CheckReport, *, seed: int, concurrency: int, max_steps: int,
    replies: Sequence[str], actions: Sequence[Mapping[str, Any]] | None,
) -> None:
    env = await _call("factory.returns", "the factory", factory)
    twin = await _call("factory.returns", "the factory", factory)
    for instance in (env, twin):
        if not _is_environment(instance):
            _fail("factory.returns", f"got {_describe(instance)}")
    report.passed.append("factory.returns")

    guard = _GlobalRandomGuard()
    started = time.monotonic()
    first = _check_observation(
        "reset.returns", await _call("reset.returns", "reset", _served(env, "reset"), seed=seed, episode_id=_EPISODE_ID),
        "reset",
    )
    reset_s = time.monotonic() - started
    report.passed.append("reset.returns")
    with _judged(report):
        guard.check("reset")
    state: Any = None
    with _judged(report):
        state = await _call("state.returns", "state", lambda: env.state)
        if not isinstance(state, State) and not _is_openenv_model(state, "step_count"):
            _fail("state.returns", f"got {_describe(state)}")
        report.passed.append("state.returns")
    with _judged(report):
        await _check_tools(factory, report, seed)

    with _judged(report):
        twin_first = await _call("reset.returns", "reset", _served(twin, "reset"), seed=seed, episode_id=_EPISODE_ID)
        if _dump(twin_first) != _dump(first):
            _fail(
                "reset.seed_determinism",
                f"two instances reset with seed {seed} gave {_describe(first)} and {_describe(twin_first)}",
            )
        report.passed.append("reset.seed_determinism")

    with _judged(report):
        # The resets of a crowd may share one CPU: each gets the call deadline on top of its share.
        crowd_s = _WATCH.get().call_timeout + concurrency * reset_s
        what = f"{concurrency} concurrent resets"
        if inspect.iscoroutinefunction(_served(env, "reset")):
            crowd = [await _call("factory.returns", "the factory", factory) for _ in range(concurrency)]
            try:
                outs = await asyncio.gather(
                    *(_call("reset.concurrent_seed_determinism", f"reset (one of {what})", _served(e, "reset"), seed=seed,
                            episode_id=_EPISODE_ID, within=crowd_s) for e in crowd)
                )
            finally:
                await asyncio.gather(*(_cleanup("close.idempotent", "close", e.close) for e in crowd))
        else:
            outs = await _call(
                "reset.concurrent_seed_determinism", what, _reset_in_threads, factory, seed, concurrency,
                crowd_s, within=crowd_s,
            )
        differing = sum(1 for out in outs if _dump(out) != _dump(first))
        _check_concurrent_resets(differing, concurrency, seed, report)

    action_type, observation_type = _step_types(env)
    rng = random.Random(seed)
    done = False
    played: list[Action] = []
    trace: list[Any] = [_dump(first), _state_dump(state)]
    if action_type is None and actions is not None:
        raise CheckOptionError(
            "--action needs the action type: annotate `def step(self, action: MyAction) -> MyObservation`"
        )
    pool = None if action_type is None else _playable_actions(action_type, replies, actions, report)
    if action_type is None or (pool is None and _sample_action(action_type, random.Random(seed), replies) is None):
        reason = (
            "the action type is unknown (annotate `def step(self, action: MyAction) -> MyObservation`)"
            " or has fields the checker cannot fill (pass --action)"
        )
        for rule in ("step.returns", "step.seed_determinism", "step.after_done_refused"):
            report.skipped[rule] = reason
    else:
        draw = _action_drawer(action_type, pool, replies)
        with _judged(report):
            for _ in range(max_steps):
                action = draw(rng)
                played.append(action)
                guard = _GlobalRandomGuard()
                obs = _check_observation(
                    "step.returns", await _call("step.returns", "step", _served(env, "step"), action), "step"
                )
                with _judged(report):
                    guard.check("step")
                twin_obs = await _call("step.returns", "step", _served(twin, "step"), action)
                if _dump(twin_obs) != _dump(obs):
                    report.failed.setdefault(
                        "step.seed_determinism",
                        f"at step {report.episode_steps + 1} two instances with seed {seed} answered"
                        f" {_describe(obs)} and {_describe(twin_obs)} to the same action",
                    )
                report.episode_steps += 1
                trace.append(_dump(obs))
                done = obs.done
                if done:
                    break
        _held(report, "step.returns", "step.seed_determinism")
        report.episode_done = done
        if "step.returns" in report.failed:
            report.skipped["step.after_done_refused"] = "step.returns is broken: no episode was played to its end"
        elif not done:
            report.skipped["step.after_done_refused"] = f"no episode ended within {max_steps} steps"
        elif observation_type is None:
            report.skipped["step.after_done_refused"] = "the observation type is unknown (annotate step's return)"
        else:
            with _judged(report):
                async with _deadline(
                    "step.after_done_refused", "replaying the episode through a server",
                    _WATCH.get().call_timeout * (len(played) + 4),
                ):
                    await _check_served_after_done(factory, action_type, observation_type, seed, played)
                report.passed.append("step.after_done_refused")

    with _judged(report):
        other = await _call("factory.returns", "the factory", factory)
        try:
            other_trace = await _served_trace(other, seed + 1, played)
        finally:
            await _cleanup("close.idempotent", "close", other.close)
        _compare_seeds(trace, other_trace, seed, report)

    await _check_closes(report, env, twin)
    _held(report, "no_global_random")  # reset's and every step's


def _action_drawer(
    action_type: type[Action], pool: list[Action] | None, replies: Sequence[str]
) -> Callable[[random.Random], Action]:
    """How each step's action is drawn: from the playable actions, else invented."""
    if pool is not None:
        return lambda rng: rng.choice(pool)

    def invent(rng: random.Random) -> Action:
        action = _sample_action(action_type, rng, replies)
        assert action is not None  # every field was fillable for the first sample
        return action

    return invent


async def _served_trace(env: Any, seed: int, actions: Sequence[Action]) -> list[Any]:
    """What a server-side `env` shows reset with `seed` and played `actions` (until it ends)."""
    trace: list[Any] = [_dump(await _call("reset.returns", "reset", _served(env, "reset"), seed=seed, episode_id=_EPISODE_ID))]
    trace.append(_state_dump(await _call("state.returns", "state", lambda: env.state)))
    for action in actions:
        obs = await _call("step.returns", "step", _served(env, "step"), action)
        trace.append(_dump(obs))
        if getattr(obs, "done", False):
            break
    return trace


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


async def _check(
    target: Any, *, seed: int, concurrency: int, max_steps: int, replies: Sequence[str],
    actions: Sequence[Mapping[str, Any]] | None,
) -> CheckReport:
    before = set(threading.enumerate())
    if isinstance(target, type) and issubclass(target, Env):
        if actions is not None:
            raise CheckOptionError("--action is for Environment classes; an Env is played with --replies")
        report = CheckReport(_name_of(target), "Env")
        await _check_local_env(
            target, report, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies
        )
    elif callable(target):
        _check_is_factory(target)
        report = CheckReport(_name_of(target), "Environment")
        await _check_server_environment(
            target, report, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies,
            actions=actions,
        )
    else:
        raise TypeError(
            f"check_env expects an Env class, an Environment class or factory, or a name; got {target!r}"
        )
    left = _threads_left(before)
    if left:
        report.warnings["close.threads"] = (
            f"{len(left)} non-daemon thread(s) still run after close ({', '.join(t.name for t in left)[:200]}):"
            " a process using this environment will not exit by itself; stop them in close() or"
            " make them daemons"
        )
    if report.failed:
        rule, detail = next(iter(report.failed.items()))
        raise EnvCheckError(rule, detail, report)
    return report


#: The most concurrent resets a check makes: each is a fresh env (a thread of its own for a sync
#: one), so a larger crowd exhausts the process, not the env.
MAX_CONCURRENCY = 256


def _check_counts(concurrency: int, max_steps: int, *, flags: bool = False) -> None:
    """Raise `CheckOptionError` for a crowd of resets or a step budget no check can use:
    `concurrency` outside 2 to `MAX_CONCURRENCY`, `max_steps` below 1. `flags`: the message
    names them as the command line does (``--max-steps``)."""

    def name(option: str) -> str:
        return "--" + option.replace("_", "-") if flags else option

    if not 2 <= concurrency <= MAX_CONCURRENCY:
        raise CheckOptionError(
            f"{name('concurrency')} must be at least 2 (to test concurrent seeding) and at most"
            f" {MAX_CONCURRENCY} (one thread or env per reset), got {concurrency}"
        )
    if max_steps < 1:
        raise CheckOptionError(f"{name('max_steps')} must be at least 1 (no step would be checked), got {max_steps}")


def check_env(
    target: Any,
    *,
    seed: int = 0,
    concurrency: int = 16,
    max_steps: int = 50,
    replies: Sequence[str] = DEFAULT_REPLIES,
    actions: Sequence[Mapping[str, Any]] | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
) -> CheckReport:
    """Check that `target` obeys its environment contract; see the module docstring for the rules.

    `target` is an `Env` subclass, an `Environment` subclass or zero-argument factory, or a
    string for `resolve_target`. `replies` are the model replies played; `actions` (action
    dicts, `Environment` only) are played instead of them. Every env call must return within
    `call_timeout` seconds. Raises `EnvCheckError` (its `rule` names the broken rule) or
    `CheckOptionError`, or returns a `CheckReport`. The check runs in a thread of its own, with
    its own event loop; it returns even when an env call never does (that call is left running
    in a daemon thread).
    """
    if isinstance(target, str):
        target = resolve_target(target)
    _check_counts(concurrency, max_steps)
    if not replies:
        raise ValueError("replies must not be empty")
    if not (math.isfinite(call_timeout) and call_timeout > 0):
        raise ValueError(f"call_timeout must be a number of seconds > 0, got {call_timeout}")
    watch = _Watch(call_timeout)
    outcome: concurrent.futures.Future[CheckReport] = concurrent.futures.Future()

    async def main() -> None:
        _WATCH.set(watch)
        try:
            report = await _check(
                target, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies, actions=actions
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            outcome.set_exception(exc)
        else:
            outcome.set_result(report)

    # The outcome is set before asyncio.run winds the loop down, which may wait on a hung call.
    threading.Thread(target=asyncio.run, args=(main(),), name="check-env", daemon=True).start()
    while not concurrent.futures.wait([outcome], timeout=0.1).done:
        overdue = watch.overdue()
        if overdue is not None:
            raise EnvCheckError(
                overdue.rule,
                _too_slow(overdue.what, overdue.timeout) + "; it could not be stopped (it blocks the"
                " event loop or ignores cancellation) and is left running",
            )
    return outcome.result()


async def check_env_async(
    target: Any,
    *,
    seed: int = 0,
    concurrency: int = 16,
    max_steps: int = 50,
    replies: Sequence[str] = DEFAULT_REPLIES,
    actions: Sequence[Mapping[str, Any]] | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
) -> CheckReport:
    """`check_env` for callers inside an event loop (it waits in a worker thread)."""
    return await asyncio.to_thread(
        functools.partial(
            check_env, target, seed=seed, concurrency=concurrency, max_steps=max_steps, replies=replies,
            actions=actions, call_timeout=call_timeout,
        )
    )


#: Envs that `envsdk rollout --env NAME` serves itself rather than finding in the registry: the
#: class check-env checks for each (imported by name: the library does not depend on servers/).
SERVED_ENVS = {"sudoku": "servers.sudoku.environment:SudokuEnvironment"}
#: The target that checks the Harbor tasks of ``--tasks DIR``, and what makes their environments
#: (given the folder; imported by name, as `SERVED_ENVS`).
HARBOR_TARGET = "harbor"
_HARBOR_FACTORY = "servers.harbor.app:harbor_environment_factory"


def harbor_environments(tasks: str) -> Callable[[], Any]:
    """A zero-argument maker of Harbor environments playing the task folders of `tasks` (every
    task's image built first, as the Harbor server does before it serves)."""
    make: Callable[[str], Callable[[], Any]] = import_spec(_HARBOR_FACTORY)
    environment = make(tasks)

    def harbor() -> Any:
        return environment()

    harbor.__qualname__ = f"{HARBOR_TARGET} --tasks {tasks}"  # the report's name for it
    return harbor


def resolve_target(spec: str) -> Any:
    """A registered env name, ``package.module:Class`` or ``path/to/file.py:Class`` -> the object.

    Raises `EnvNotFoundError` for an unknown name (listing the known ones), `ImportError` for an
    unknown module or attribute, `PluginLoadError` for a file that is missing or fails to import.
    """
    if spec in SERVED_ENVS and spec not in envs:
        return import_spec(SERVED_ENVS[spec])
    if spec in envs or ":" not in spec:
        return envs[spec]
    return import_spec(spec)


def _json_action(text: str) -> dict[str, Any]:
    """An ``--action`` value: a JSON object."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"message\": \"hi\"}}', got {text[:200]!r}")
    return value


#: The options only the contract check reads, by destination, as the command line spells them.
_CONTRACT_ONLY = {
    "external_plugins": "--external-plugins", "seed": "--seed", "max_steps": "--max-steps",
    "call_timeout": "--call-timeout", "replies": "--replies", "actions": "--action", "strict": "--strict",
    "tasks": "--tasks",
}
_CONCURRENCY = 16


def add_check_env_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``check-env TARGET [options]`` (and ``check-env --hacks [...]``, the reward-hack probe
    of `envsdk.hack_probe`) to an argparse CLI.

    The sub-command's ``func`` default is `run_check_env`, which returns the exit code.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "check-env",
        help="check that an environment obeys the reset/step/seed/close contract",
        description=(
            "Run an environment directly and check its contract: return shapes, seeding"
            " (also under concurrency), steps after done, idempotent close. Exit code 0: every"
            " rule holds; 1: a rule is broken (or a warning, with --strict); 2: the target or an"
            " option cannot be used. With --hacks, probe a code env for reward hacks instead (below)."
        ),
    )
    parser.add_argument(
        "target", nargs="?", default=None,
        help="a registered env name, module:Class or path.py:Class, or harbor (with --tasks) (with --hacks: none, "
        "or coding)",
    )
    parser.add_argument(
        "--tasks", default=None, metavar="DIR",
        help="with the target harbor: a folder of Harbor task folders, or one task folder, played in containers "
        "(the seed picks the task, as on the Harbor server)",
    )
    parser.add_argument(
        "--external-plugins", "--external_plugins", dest="external_plugins", nargs="+",
        action="extend", default=[], metavar="FILE", help="plugin files to import first",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed to check with (default 0)")
    parser.add_argument(
        "--concurrency", type=int, default=None,
        help=f"concurrent resets, 2 to {MAX_CONCURRENCY} (default {_CONCURRENCY}); with --hacks, episodes"
        f" played at once (default {DEFAULT_HACK_CONCURRENCY})",
    )
    parser.add_argument("--max-steps", type=int, default=50, help="steps to play at most, >= 1 (default 50)")
    parser.add_argument(
        "--call-timeout", type=float, default=DEFAULT_CALL_TIMEOUT_S, metavar="SECONDS",
        help=f"deadline of one env call (reset, step, close, a tool); a call past it breaks its rule"
        f" (default {DEFAULT_CALL_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--replies", nargs="+", action="extend", default=None, metavar="TEXT",
        help="model replies to play instead of the generic ones (an Environment gets the action a"
        " rollout makes of each); give ones that reach the env's seeded logic (default: the"
        " generic random policy's)",
    )
    parser.add_argument(
        "--action", dest="actions", action="append", type=_json_action, default=None, metavar="JSON",
        help="an action to play, as a JSON object (repeatable; Environment classes only)",
    )
    parser.add_argument("--strict", action="store_true", help="fail (exit 1) on warnings too")
    add_hack_arguments(parser)
    # What the contract check's own options hold when not given: --hacks refuses other values.
    parser.set_defaults(func=run_check_env, contract_defaults={dest: parser.get_default(dest) for dest in _CONTRACT_ONLY})
    return parser


def run_check_env(args: argparse.Namespace) -> int:
    """Run ``check-env`` from parsed arguments: 0 when every rule holds, 1 when one is broken
    (or, with ``--strict``, on a warning), 2 when the target or an option could not be used.

    When the environment left non-daemon threads running, the process exits here (after
    flushing the verdict) instead of returning: waiting for them could take forever."""
    before = set(threading.enumerate())
    code = _judge(args)
    if _threads_left(before):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _judge(args: argparse.Namespace) -> int:
    if args.hacks:
        given = [flag for dest, flag in _CONTRACT_ONLY.items() if getattr(args, dest) != args.contract_defaults[dest]]
        return run_hack_probe(args, given)
    stray = [flag for dest, flag in HACK_ONLY.items() if getattr(args, dest) is not None]
    if stray:
        print(f"envsdk check-env: error: {', '.join(stray)} {'is' if len(stray) == 1 else 'are'} for --hacks", file=sys.stderr)
        return 2
    if args.target is None:
        print("envsdk check-env: error: give a TARGET (an env name, module:Class or path.py:Class), or --hacks", file=sys.stderr)
        return 2
    concurrency = _CONCURRENCY if args.concurrency is None else args.concurrency
    # The options are checked before the target is imported: a bad one is the caller's mistake.
    try:
        _check_counts(concurrency, args.max_steps, flags=True)
    except CheckOptionError as exc:
        print(f"envsdk check-env: error: {exc}", file=sys.stderr)
        return 2
    if (args.target == HARBOR_TARGET) != (args.tasks is not None):
        said = (
            "the target harbor checks Harbor task folders: give --tasks DIR" if args.tasks is None
            else f"--tasks names Harbor task folders, for the target harbor, not {args.target}: leave it out"
        )
        print(f"envsdk check-env: error: {said}", file=sys.stderr)
        return 2
    try:
        load_plugins(args.external_plugins)
        target = harbor_environments(args.tasks) if args.tasks is not None else resolve_target(args.target)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a module may exit or fail while imported
        print(f"envsdk check-env: error: cannot load {args.target!r}: {_quote_exception(exc)}", file=sys.stderr)
        return 2
    try:
        report = check_env(
            target, seed=args.seed, concurrency=concurrency, max_steps=args.max_steps,
            replies=tuple(args.replies) if args.replies else DEFAULT_REPLIES, actions=args.actions,
            call_timeout=args.call_timeout,
        )
    except EnvCheckError as exc:
        # Every broken rule, one line each: fixing the first should not be the way to find the next.
        for rule, detail in exc.failures.items():
            print(f"check-env {args.target}: FAILED rule {rule}: {RULES[rule]}: {detail}", file=sys.stderr)
        return 1
    except (CheckOptionError, ValueError) as exc:
        print(f"envsdk check-env: error: {args.target}: {exc}", file=sys.stderr)
        return 2
    print_out(str(report))
    if args.strict and report.warnings:
        print(f"check-env {args.target}: FAILED under --strict: {len(report.warnings)} warning(s)", file=sys.stderr)
        return 1
    return 0
