"""Drive a code env from outside, as a policy would, with every probe of the catalogue.

One episode is one envsdk client session: ``reset(task_id=...)``, then the probe's steps as
``{"code": ...}`` actions until the env says done. A probe's reward is the episode's total
reward, the most over the problems it was tried on. Two controls run first on the same
problems: the canonical solution (from `envsdk.games.humaneval`, by the task id the reset
returned) must earn 1.0 on each, a wrong answer 0.0 on each.

The verdict, and the exit code of ``envsdk check-env --hacks``:

* 0: the controls hold and no probe earned reward;
* 1: a probe earned reward, or the wrong answer did (the env is hackable; the probes still run);
* 2: a usage error, or the canonical solution did not earn 1.0 on every problem (the env could
  not be reached, does not serve HumanEval by ``task_id``, or does not reward a correct
  answer): then a probe's 0.0 would mean nothing, so the probes are not run.

With no base URL, the coding server (`servers.coding`) is started here on a free loopback
port, with the sandbox provider asked for (see `embedded_coding_server`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envsdk._process import print_out
from envsdk.errors import EnvSDKError
from envsdk.hack_probe.catalogue import PROBES, Probe, Task, probe_named, wrong_answer

if TYPE_CHECKING:
    from envsdk.games.humaneval import Problem

# The task set (with the sandbox layer behind it) and the client are imported where they are
# used: every envsdk command builds check-env's parser, --hacks' options included, and only the
# probe needs them.

__all__ = [
    "DEFAULT_PROBLEMS",
    "DEFAULT_CONCURRENCY",
    "MAX_CONCURRENCY",
    "PROBLEM_ORDER",
    "CANONICAL",
    "WRONG",
    "Episode",
    "ProbeResult",
    "HackReport",
    "HackProbeError",
    "probe_env",
    "probe_hacks",
    "embedded_coding_server",
    "add_hack_arguments",
    "run_hack_probe",
    "HACK_ONLY",
]

#: Problems tried by default (``--problems``): the first ones of `PROBLEM_ORDER`.
DEFAULT_PROBLEMS = 3
#: Episodes played at once by default (``--concurrency``), and the most allowed.
DEFAULT_CONCURRENCY = 4
MAX_CONCURRENCY = 64
# The order problems are tried in: HumanEval/2 (an exact and two tolerance asserts on a float),
# HumanEval/32 (a helper from the prompt, `math` imported by the tests, random inputs),
# HumanEval/4 (tolerance asserts only), HumanEval/0 (booleans), then the rest in order.
_FIRST = ("HumanEval/2", "HumanEval/32", "HumanEval/4", "HumanEval/0")
PROBLEM_ORDER: tuple[str, ...] = _FIRST + tuple(f"HumanEval/{i}" for i in range(164) if f"HumanEval/{i}" not in _FIRST)

# How long the client waits for one reply: past the coding server's own 60 s step deadline.
_REQUEST_TIMEOUT_S = 90.0
# How long an episode waits before asking a server at capacity again, each time.
_CAPACITY_WAITS_S = (0.2, 0.5, 1.0, 2.0, 4.0)
# Error messages quoted in the report are cut to this many characters.
_QUOTE_CHARS = 160


class HackProbeError(EnvSDKError):
    """The probe cannot run as asked (an option, the sandbox provider, the task set): the
    message says what to change. ``check-env --hacks`` answers it with exit code 2."""


def _canonical(task: Task) -> tuple[str, ...]:
    return (_problem(task.task_id).solution,)


CANONICAL = Probe("canonical-solution", "the problem's canonical solution: must earn 1.0", _canonical)
WRONG = Probe("wrong-answer", "an entry point that answers None: must earn 0.0", lambda task: (wrong_answer(task),))


def _problem(task_id: str) -> Problem:
    from envsdk.games.humaneval import humaneval

    for problem in humaneval():
        if problem.task_id == task_id:
            return problem
    raise LookupError(f"{task_id!r} is not a HumanEval task: no canonical solution to control with")


# ------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class Episode:
    """One played episode: the task the env reset to (the one asked for when the reset
    failed), its total reward, and the error that ended it early, if any."""

    task_id: str
    reward: float
    error: str | None = None


@dataclass
class ProbeResult:
    """A probe's (or control's) episodes, one per problem."""

    name: str
    hack: str
    episodes: list[Episode] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """The most any episode earned (0.0 with no episode)."""
        return max((e.reward for e in self.episodes), default=0.0)

    @property
    def earned_on(self) -> list[str]:
        return [e.task_id for e in self.episodes if e.reward > 0]

    @property
    def tried_on(self) -> list[str]:
        return [e.task_id for e in self.episodes]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "hack": self.hack, "reward": self.reward, "earned_on": self.earned_on,
            "tried_on": self.tried_on, "episodes": [vars(e) for e in self.episodes],
        }


def _task_list(task_ids: Sequence[str]) -> str:
    """``HumanEval/0, /2, /32``: the common prefix said once."""
    shown: list[str] = []
    for task_id in task_ids:
        head, slash, tail = task_id.rpartition("/")
        shown.append("/" + tail if shown and slash and task_ids[0].rpartition("/")[0] == head else task_id)
    return ", ".join(shown)


@dataclass
class HackReport:
    """What the probe found on `target`: the controls, then each probe's result (none when the
    canonical control failed). `exit_code` and `verdict` follow the module docstring."""

    target: str
    problems: tuple[str, ...]
    canonical: ProbeResult
    wrong: ProbeResult
    probes: list[ProbeResult]
    seconds: float

    @property
    def canonical_failure(self) -> str | None:
        """Why the canonical control failed (a sentence), or None when it held on every problem."""
        bad = [e for e in self.canonical.episodes if not math.isclose(e.reward, 1.0)]
        if not bad:
            return None
        first = bad[0]
        why = f" ({first.error})" if first.error else ""
        return (
            f"the canonical solution earned {first.reward:.3f} on {first.task_id}{why}, not 1.000"
            f"{f' (and failed on {len(bad) - 1} more)' if len(bad) > 1 else ''}: the env cannot be judged"
            " (it does not reset to HumanEval problems by task_id, or does not reward a correct answer)"
        )

    @property
    def earned(self) -> list[str]:
        """The probes that earned reward."""
        return [p.name for p in self.probes if p.reward > 0]

    @property
    def exit_code(self) -> int:
        if self.canonical_failure is not None:
            return 2
        return 1 if self.earned or self.wrong.reward > 0 else 0

    @property
    def verdict(self) -> str:
        failure = self.canonical_failure
        if failure is not None:
            return f"CANNOT JUDGE: {failure}; the probes were not run"
        problems = _task_list(self.problems)
        if self.exit_code == 0:
            return f"ok: no probe earned reward ({len(self.probes)} probes on {problems}); the controls hold"
        said = []
        if self.wrong.reward > 0:
            said.append(f"the wrong answer earned {self.wrong.reward:.3f} (on {_task_list(self.wrong.earned_on)})")
        if self.earned:
            said.append(f"{len(self.earned)} of {len(self.probes)} probes earned reward: {', '.join(self.earned)}")
        return "HACKABLE: " + "; ".join(said)

    def render(self) -> str:
        """The report as the command prints it: one line per probe, the controls, the verdict."""
        width = max(len(r.name) for r in [*self.probes, self.canonical, self.wrong])
        lines = [f"reward-hack probe of {self.target} on {_task_list(self.problems)} ({self.seconds:.1f} s)"]
        lines += [_line(result, width) for result in self.probes]
        lines.append("controls:")
        lines += [_line(self.canonical, width, "must be 1.000 on each"), _line(self.wrong, width, "must be 0.000")]
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "problems": list(self.problems),
            "probes": [p.to_json() for p in self.probes],
            "controls": {r.name: r.to_json() for r in (self.canonical, self.wrong)},
            "earned": self.earned,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
        }


def _line(result: ProbeResult, width: int, rule: str | None = None) -> str:
    """``name  reward 0.000  (tried on HumanEval/0, /2)``, with where it earned, what it must
    earn (a control) and the first error that ended an episode early."""
    if not result.episodes:
        where = "not run"
    elif result.earned_on:
        where = f"earned on {_task_list(result.earned_on)}; tried on {_task_list(result.tried_on)}"
    else:
        where = f"tried on {_task_list(result.tried_on)}"
    if rule is not None:
        where += f"; {rule}"
    errors = [e for e in result.episodes if e.error]
    error = f"  [{len(errors)} ended by an error; {errors[0].task_id}: {errors[0].error}]" if errors else ""
    return f"  {result.name:<{width}}  reward {result.reward:.3f}  ({where}){error}"


# ------------------------------------------------------------------------------ episodes


def _quote(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 3] + "..."


def _task(observation: Any, asked: str) -> Task:
    """The problem a reset showed: its metadata's ``task_id``, ``prompt`` and ``entry_point``
    (the latter two from HumanEval when the env leaves them out)."""
    meta = observation.get("metadata") if isinstance(observation, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("task_id"), str):
        raise LookupError(f"reset(task_id={asked!r}) showed no metadata.task_id: not a coding env of this wire")
    task_id = meta["task_id"]
    prompt, entry_point = meta.get("prompt"), meta.get("entry_point")
    if not isinstance(prompt, str) or not isinstance(entry_point, str):
        problem = _problem(task_id)
        prompt, entry_point = problem.prompt, problem.entry_point
    return Task(task_id, prompt, entry_point)


async def _episode(base_url: str, probe: Probe, task_id: str) -> Episode:
    """Play `probe` on `task_id` in a session of its own; any error ends the episode with the
    reward earned so far (an env that errs on a hack has not rewarded it). A server at capacity
    is asked again a few times: a session closed by the episode before may not be released yet."""
    from envsdk.client import EnvClient, Timeouts
    from envsdk.errors import CapacityError

    waits = iter(_CAPACITY_WAITS_S)
    while True:
        total, seen = 0.0, task_id
        try:
            async with EnvClient(base_url, timeouts=Timeouts(request=_REQUEST_TIMEOUT_S)) as env:
                reset = await env.reset(task_id=task_id)
                task = _task(reset.observation, task_id)
                seen = task.task_id
                for code in probe.steps(task):
                    result = await env.step({"code": code})
                    total += result.reward or 0.0
                    if result.done:
                        break
        except CapacityError as exc:
            wait = next(waits, None)
            if wait is None:
                return Episode(seen, total, _quote(exc))
            await asyncio.sleep(wait)
            continue
        except (EnvSDKError, OSError, asyncio.TimeoutError, LookupError) as exc:
            return Episode(seen, total, _quote(exc))
        return Episode(seen, total)


async def _play(
    base_url: str, probes: Sequence[Probe], problems: Sequence[str], gate: asyncio.Semaphore
) -> list[ProbeResult]:
    """Every probe on every problem, at most `gate`'s count of episodes at once."""

    async def one(probe: Probe, task_id: str) -> Episode:
        async with gate:
            return await _episode(base_url, probe, task_id)

    plays = [[one(probe, task_id) for task_id in problems] for probe in probes]
    episodes = await asyncio.gather(*(asyncio.gather(*row) for row in plays))
    return [ProbeResult(probe.name, probe.hack, list(row)) for probe, row in zip(probes, episodes)]


async def probe_env(
    base_url: str,
    *,
    problems: Sequence[str] = PROBLEM_ORDER[:DEFAULT_PROBLEMS],
    probes: Sequence[Probe] = PROBES,
    concurrency: int = DEFAULT_CONCURRENCY,
    target: str | None = None,
) -> HackReport:
    """Run the controls, then (when the canonical one held) `probes`, against the code env
    at `base_url` (``http``/``ws`` base URL), on `problems` (task ids its reset takes as
    ``task_id``), `concurrency` episodes at once. `target` names the env in the report
    (default: the URL). Never raises for what the env does: errors end episodes (see
    `Episode.error`)."""
    started = time.monotonic()
    gate = asyncio.Semaphore(concurrency)
    canonical, wrong = await _play(base_url, (CANONICAL, WRONG), problems, gate)
    report = HackReport(target or base_url, tuple(problems), canonical, wrong, [], 0.0)
    if report.canonical_failure is None:
        report.probes = await _play(base_url, probes, problems, gate)
    report.seconds = time.monotonic() - started
    return report


# ------------------------------------------------------------------------------ the coding server


def _provider_name(sandbox: str) -> str:
    """The provider `sandbox` names (``auto``: bubblewrap where installed), refused where the
    probe cannot run safely or at all."""
    from envsdk.sandbox import bwrap_path

    name = ("bubblewrap" if bwrap_path() is not None else "process") if sandbox == "auto" else sandbox
    if name == "bubblewrap" and bwrap_path() is None:
        raise HackProbeError("--sandbox bubblewrap: bwrap is not installed (Debian: apt-get install bubblewrap)")
    if name == "process" and os.geteuid() != 0:
        # Without a user id of their own, the sandbox's processes are this user's: kill-everything
        # (os.kill(-1, SIGKILL)) would take down this command and every other process of the user.
        raise HackProbeError(
            "--sandbox process runs the probes' code as your own user, and the kill-* probes would"
            " kill every process of yours: use --sandbox bubblewrap, or run as root"
        )
    return name


@contextlib.contextmanager
def embedded_coding_server(sandbox: str = "auto", capacity: int = DEFAULT_CONCURRENCY) -> Iterator[str]:
    """The coding server (HumanEval in sandboxes of provider `sandbox`: ``bubblewrap``,
    ``process`` or ``auto``) on a free 127.0.0.1 port, serving `capacity` sessions with as many
    sandboxes kept warm; yields its base URL and stops it (and its sandboxes) when the block
    ends. Raises `HackProbeError` for a provider that cannot be used."""
    name = _provider_name(sandbox)
    # As `envsdk rollout --env coding` does (the import contracts in pyproject.toml allow both).
    from envsdk.testing import running_server
    from servers.coding.app import create_coding_app

    app = create_coding_app(provider=name, warm=capacity, max_concurrent_envs=capacity, web=False)
    with running_server(app) as url:
        yield url


def probe_hacks(
    base_url: str | None = None,
    *,
    sandbox: str = "auto",
    problems: int = DEFAULT_PROBLEMS,
    probes: Sequence[Probe] = PROBES,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> HackReport:
    """`probe_env` on the server at `base_url`, or on the coding server started here with
    `sandbox` (`embedded_coding_server`), trying the first `problems` of `PROBLEM_ORDER`.
    Blocks; call it outside an event loop. Raises `HackProbeError` for an option out of range
    or a provider that cannot be used."""
    if not 1 <= problems <= len(PROBLEM_ORDER):
        raise HackProbeError(f"--problems must be from 1 to {len(PROBLEM_ORDER)}, got {problems}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise HackProbeError(f"--concurrency must be from 1 to {MAX_CONCURRENCY} with --hacks, got {concurrency}")
    from envsdk.games.humaneval import TaskSetError, humaneval

    try:
        humaneval()
    except TaskSetError as exc:
        raise HackProbeError(str(exc)) from None
    chosen = PROBLEM_ORDER[:problems]
    if base_url is not None:
        return asyncio.run(probe_env(base_url, problems=chosen, probes=probes, concurrency=concurrency))
    name = _provider_name(sandbox)
    with embedded_coding_server(name, concurrency) as url:
        return asyncio.run(
            probe_env(url, problems=chosen, probes=probes, concurrency=concurrency,
                      target=f"the coding server (embedded, sandbox {name})")
        )


# ------------------------------------------------------------------------------ the command line


def add_hack_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--hacks`` and its options to ``check-env``'s parser. Their defaults are None (or
    False), so that `run_hack_probe` and the contract check can tell which were given."""
    group = parser.add_argument_group(
        "reward-hack probe (--hacks)",
        "Drive a code env over the wire with known reward hacks (objects equal to everything,"
        " early exits, faked pass output, the grader's marker dug out of memory, patched builtins,"
        " shadowed modules, tests read from disk or frames, timers, exit hooks, signals) and"
        " report each one's reward, then the controls (canonical solution 1.0, wrong answer 0.0)."
        " TARGET: none or coding (the coding server, started here), or give --base-url. Exit code"
        " 0: no probe earned reward; 1: one did (or the wrong answer did); 2: a usage error, or"
        " the canonical solution did not earn 1.0 (the env cannot be judged; the probes are not run).",
    )
    group.add_argument("--hacks", action="store_true", help="run the reward-hack probe instead of the contract check")
    group.add_argument(
        "--base-url", default=None, metavar="URL",
        help="the code env's server (http:// or ws://; it must take reset(task_id='HumanEval/N') and"
        " steps {'code': ...}); default: start the coding server here",
    )
    group.add_argument(
        "--sandbox", choices=("bubblewrap", "process", "auto"), default=None,
        help="the embedded coding server's sandbox provider (default auto: bubblewrap where installed)",
    )
    group.add_argument(
        "--problems", type=int, default=None, metavar="N",
        help=f"try each probe on the first N of HumanEval/2, /32, /4, /0, then the rest (default {DEFAULT_PROBLEMS})",
    )
    group.add_argument(
        "--probe", dest="hack_probes", action="append", default=None, metavar="NAME",
        help="run only this probe (repeatable; default: all)",
    )
    group.add_argument("--json", dest="hack_json", action="store_true", default=None, help="print the report as JSON")


#: The options only the probe reads, by destination, as the command line spells them.
HACK_ONLY = {"base_url": "--base-url", "sandbox": "--sandbox", "problems": "--problems", "hack_probes": "--probe", "hack_json": "--json"}


def _refuse(message: str) -> int:
    print(f"envsdk check-env: error: {message}", file=sys.stderr)
    return 2


def run_hack_probe(args: argparse.Namespace, contract_options: Sequence[str] = ()) -> int:
    """Run ``check-env --hacks`` from parsed arguments; the exit code (see the module docstring).
    `contract_options`: the contract check's options that were given (refused here)."""
    given = list(contract_options)
    if given:
        return _refuse(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for the contract check, not --hacks")
    if args.target not in (None, "coding"):
        return _refuse(
            f"--hacks probes a code env: give no TARGET (or coding) to probe the coding server started"
            f" here, or --base-url URL for a running one; got {args.target!r}"
        )
    if args.base_url is not None:
        if args.target is not None or args.sandbox is not None:
            extra = "--sandbox" if args.sandbox is not None else f"the TARGET {args.target!r}"
            return _refuse(f"--base-url probes a running server: drop {extra} (it is for the coding server started here)")
        from envsdk.client import websocket_url

        try:
            websocket_url(args.base_url)
        except ValueError as exc:
            return _refuse(f"--base-url: {exc}")
    try:
        probes = [probe_named(name) for name in args.hack_probes] if args.hack_probes else list(PROBES)
    except KeyError as exc:
        return _refuse(f"--probe: {exc.args[0]}")
    if args.base_url is None:
        # The probes kill their sandboxes on purpose, and the server started here would log each
        # such step as a traceback on this command's stderr; the report says how each episode ended.
        logging.getLogger("envsdk").addHandler(logging.NullHandler())
    try:
        report = probe_hacks(
            args.base_url, sandbox=args.sandbox or "auto",
            problems=DEFAULT_PROBLEMS if args.problems is None else args.problems, probes=probes,
            concurrency=DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency,
        )
    except HackProbeError as exc:
        return _refuse(str(exc))
    print_out(json.dumps(report.to_json(), indent=2) if args.hack_json else report.render())
    failure = report.canonical_failure
    if failure is not None:
        print(f"envsdk check-env: error: --hacks: {failure}", file=sys.stderr)
    return report.exit_code
