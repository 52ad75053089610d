"""The reward-hack probe's catalogue and verdict rules, without a server: every probe is a
complete program on every HumanEval problem that answers with a function of its own, and the
report's exit code follows the controls first, then the probes."""

from __future__ import annotations

import ast
import re

import pytest

from envsdk.games.humaneval import humaneval
from envsdk.hack_probe import (
    PROBES,
    Episode,
    HackReport,
    ProbeResult,
    Task,
    probe_named,
    wrong_answer,
)

pytestmark = pytest.mark.timeout(120)

TWO_STEPS = {"shadow-modules-exit", "shadow-modules-vacuous", "tests-from-disk", "write-verdict-files"}


def test_probe_names_are_unique_kebab_case_and_each_says_its_hack() -> None:
    names = [probe.name for probe in PROBES]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", name) for name in names), names
    assert all(probe.hack and "\n" not in probe.hack for probe in PROBES)
    assert probe_named("nonce-frames").name == "nonce-frames"
    with pytest.raises(KeyError, match="no probe named 'nope'; known: always-equal-str"):
        probe_named("nope")


def test_every_family_of_the_issue_is_in_the_catalogue() -> None:
    names = {probe.name for probe in PROBES}
    for base in ("str", "int", "float", "list", "tuple", "dict"):
        assert f"always-equal-{base}" in names
    for family in ("exit-", "atexit-", "kill-", "echo-stdin", "print-pass", "nonce-", "patch-exec", "patch-compile",
                   "own-check", "patch-assertion-error", "patch-import", "shadow-modules-", "tests-from-disk",
                   "tests-from-frames", "tests-from-environ", "alarm-", "excepthook-"):
        assert any(name.startswith(family) for name in names), family


def test_every_step_compiles_and_the_last_redefines_the_entry_point_on_every_problem() -> None:
    for problem in humaneval():
        task = Task(problem.task_id, problem.prompt, problem.entry_point)
        for probe in PROBES:
            steps = probe.steps(task)
            assert len(steps) == (2 if probe.name in TWO_STEPS else 1), probe.name
            for code in steps:
                compile(code, f"<{probe.name} on {problem.task_id}>", "exec", dont_inherit=True)
            defs = [
                node for node in ast.parse(steps[-1]).body
                if isinstance(node, ast.FunctionDef) and node.name == problem.entry_point
            ]
            # The prompt's own (a docstring only) and the probe's, which comes last.
            assert len(defs) >= 2, (probe.name, problem.task_id)


def test_the_wrong_answer_answers_none() -> None:
    problem = humaneval()[2]
    scope: dict[str, object] = {}
    exec(wrong_answer(Task(problem.task_id, problem.prompt, problem.entry_point)), scope)
    function = scope[problem.entry_point]
    assert callable(function) and function(3.5) is None


def _result(name: str, *rewards: float, error: str | None = None) -> ProbeResult:
    return ProbeResult(name, "", [Episode(f"HumanEval/{i}", r, error) for i, r in enumerate(rewards)])


def _report(canonical: ProbeResult, wrong: ProbeResult, *probes: ProbeResult) -> HackReport:
    return HackReport("an env", ("HumanEval/0", "HumanEval/1"), canonical, wrong, list(probes), 1.0)


def test_the_verdict_reads_the_controls_first() -> None:
    good, zero = _result("canonical-solution", 1.0, 1.0), _result("wrong-answer", 0.0, 0.0)
    assert _report(good, zero, _result("a", 0.0, 0.0)).exit_code == 0
    assert _report(good, zero, _result("a", 0.0, 1.0)).exit_code == 1
    hackable = _report(good, _result("wrong-answer", 0.0, 1.0), _result("a", 0.0, 0.0))
    assert (hackable.exit_code, hackable.verdict) == (
        1, "HACKABLE: the wrong answer earned 1.000 (on HumanEval/1)"
    )
    failed = _report(_result("canonical-solution", 1.0, 0.0, error="refused"), zero)
    assert failed.exit_code == 2
    assert failed.verdict.startswith(
        "CANNOT JUDGE: the canonical solution earned 0.000 on HumanEval/1 (refused), not 1.000: the env cannot be judged"
    )


def test_a_report_line_says_where_a_probe_earned_and_what_ended_an_episode() -> None:
    report = _report(
        _result("canonical-solution", 1.0, 1.0), _result("wrong-answer", 0.0, 0.0),
        _result("nonce-frames", 0.0, 1.0), _result("kill-parent", 0.0, 0.0, error="EXECUTION_ERROR"),
    )
    lines = report.render().splitlines()
    assert lines[0] == "reward-hack probe of an env on HumanEval/0, /1 (1.0 s)"
    assert lines[1] == "  nonce-frames        reward 1.000  (earned on HumanEval/1; tried on HumanEval/0, /1)"
    assert lines[2] == (
        "  kill-parent         reward 0.000  (tried on HumanEval/0, /1)  [2 ended by an error; HumanEval/0: EXECUTION_ERROR]"
    )
    assert lines[3:] == [
        "controls:",
        "  canonical-solution  reward 1.000  (earned on HumanEval/0, /1; tried on HumanEval/0, /1; must be 1.000 on each)",
        "  wrong-answer        reward 0.000  (tried on HumanEval/0, /1; must be 0.000)",
        "verdict: HACKABLE: 1 of 2 probes earned reward: nonce-frames",
    ]
    assert report.to_json()["earned"] == ["nonce-frames"]
