"""Issue 25, a new user's path through the CLI: one test per finding, each through the real
``envsdk`` command in a temporary folder with no PYTHONPATH, against real servers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from tests.cli.conftest import ENVSDK, REPO, ServeFn, assert_one_line_error, envsdk, user_env
from tests.docs.blocks import commands, doc_block

pytestmark = pytest.mark.timeout(240)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# 4: unknown --env-config and dataset-row keys ----------------------------------------------


def test_4_unknown_env_config_keys_are_refused_with_the_accepted_ones(folder: Path) -> None:
    typo = envsdk("rollout", "--env", "frozen_lake", "--env-config", '{"rubrik": "shaped"}', "--no-progress",
                  cwd=folder)
    assert_one_line_error(typo, "'rubrik'", "rubric", "size")
    assert typo.returncode == 2 and not (folder / "completions.jsonl").exists()
    # A server's reset option given beside the row's keys instead of in reset_kwargs.
    misplaced = envsdk("rollout", "--env", "sudoku", "--env-config", '{"error_allowance": 99}', "--no-progress",
                       cwd=folder)
    assert_one_line_error(misplaced, "'error_allowance'", '{"reset_kwargs": {')
    assert misplaced.returncode == 2
    row = {"env_config": {"name": "frozen_lake", "seed": 0, "observation_form": "compact"}}
    in_row = envsdk("rollout", "--dataset", str(_rows(folder / "rows.jsonl", [row])), "--no-progress", cwd=folder)
    assert_one_line_error(in_row, "rows.jsonl line 1", "'observation_form'")
    # The spelling that works reaches the server: error_allowance 99 is out of its range.
    placed = envsdk("rollout", "--env", "sudoku", "--episodes", "1", "--env-config",
                    '{"reset_kwargs": {"error_allowance": 99}}', "--no-progress", cwd=folder)
    assert placed.returncode == 1 and "error_allowance" in placed.stderr, placed.stderr
    assert '"reset_kwargs": {' in (REPO / "docs" / "rollouts.md").read_text(encoding="utf-8")


# 5: the README's dataset command -----------------------------------------------------------


def test_5_the_readme_dataset_commands_run_and_a_remote_scheduler_is_not_sent_local_rows(folder: Path) -> None:
    shutil.copytree(REPO / "examples", folder / "examples")
    documented = commands(doc_block("docs/rollouts.md", "rollouts"))
    line = next(l for l in documented if l.startswith("envsdk rollout --dataset examples/data/frozen_lake"))
    ran = envsdk(*line.split()[1:], "--no-progress", cwd=folder)
    assert ran.returncode == 0, ran.stderr
    records = _records(folder / "completions.jsonl")
    assert len(records) == 128 and not [r for r in records if r["status"] == "error"]
    # The rows' own placeholder messages are not sent: the run says so once.
    assert ran.stderr.count("messages") == 1 and "not sent" in ran.stderr, ran.stderr

    remote = envsdk("rollout", "--dataset", "examples/data/frozen_lake.jsonl", "--scheduler", "openenv",
                    "--no-progress", cwd=folder)
    assert_one_line_error(remote, "--scheduler openenv", "--base-url")
    assert remote.returncode == 2

    # ms-swift's Sudoku rows name no env: --env names it.
    head = folder / "sudoku4.jsonl"
    head.write_text("".join((folder / "examples/swift/sudoku.jsonl").read_text().splitlines(True)[:4]))
    nameless = envsdk("rollout", "--dataset", str(head), "--no-progress", cwd=folder)
    assert_one_line_error(nameless, "--env")
    sudoku = envsdk("rollout", "--dataset", str(head), "--env", "sudoku", "--out", "s.jsonl", "--no-progress",
                    cwd=folder)
    assert sudoku.returncode == 0, sudoku.stderr
    assert sorted(r["seed"] for r in _records(folder / "s.jsonl")) == [0, 1, 2, 3]
    assert {r["status"] for r in _records(folder / "s.jsonl")} == {"done"}


# 10: a missing extra or a bad model path ---------------------------------------------------


def test_10_a_bad_model_path_and_a_missing_extra_are_one_line_each(folder: Path) -> None:
    bad_model = envsdk("rollout", "--env", "frozen_lake", "--policy", "transformers", "--model", "./no-such-model",
                       "--episodes", "1", "--no-progress", cwd=folder)
    assert_one_line_error(bad_model, "./no-such-model")
    assert len(bad_model.stderr.strip().splitlines()) <= 2, bad_model.stderr
    # A package that is not installed, as a user without the [mcp] extra has it: a folder named
    # after it that fails to import the way a missing distribution does.
    (folder / "fastmcp").mkdir()
    (folder / "fastmcp" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'fastmcp'\", name='fastmcp')\n", encoding="utf-8"
    )
    shutil.copy(REPO / "examples" / "ledger_tools.py", folder / "ledger_tools.py")
    served = envsdk("serve", "ledger_tools:LedgerEnvironment", "--port", "1", cwd=folder, timeout=60)
    assert_one_line_error(served, "pip install -e '.[mcp]'")
    assert len(served.stderr.strip().splitlines()) == 1, served.stderr
    for path in ("envsdk/report.py", "envsdk/tiny_model.py"):
        assert "'envsdk[" not in (REPO / path).read_text(encoding="utf-8") and "(or envsdk[" not in (
            REPO / path).read_text(encoding="utf-8"), path


# 12: a rollout whose server dies -----------------------------------------------------------


def test_12_a_rollout_stops_soon_after_its_server_dies_with_one_line(folder: Path) -> None:
    from envsdk.testing import free_port, stop_process

    port = free_port()
    server = subprocess.Popen([str(ENVSDK), "serve", "my_env:MyEnv", "--port", str(port)], cwd=folder,
                              env=user_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        rollout = subprocess.Popen(
            [str(ENVSDK), "rollout", "--env", "my_env", "--base-url", url, "--episodes", "400", "--concurrency", "2",
             "--no-progress"], cwd=folder, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        out = folder / "completions.jsonl"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (not out.exists() or len(_records(out)) < 5):
            time.sleep(0.1)
        if rollout.poll() is not None:
            pytest.fail(f"the rollout ended before its server was killed: {rollout.communicate()}")
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        stdout, stderr = rollout.communicate(timeout=120)
    finally:
        stop_process(server)
        if "rollout" in locals() and rollout.poll() is None:
            rollout.kill()
            rollout.wait()
    records = _records(out)
    assert rollout.returncode == 1, stderr
    assert len(records) < 60, len(records)  # stopped, not 400 episodes attempted
    # One line per episode lost before the stop (at most the concurrency plus the streak), then the verdict.
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 10, stderr
    last = stderr.strip().splitlines()[-1]
    assert "stopped" in last and "connection" in last and "steps ran" in last, last


# 13: the wrong server, a URL without a scheme, client mistakes -----------------------------


def test_13_a_server_of_another_env_and_a_url_without_scheme_are_refused_up_front(
    folder: Path, serve: ServeFn
) -> None:
    sudoku = serve("--board-workers", "1", cwd=folder, module="servers.sudoku")
    wrong = envsdk("rollout", "--env", "my_env", "--base-url", sudoku, "--no-progress", cwd=folder)
    assert_one_line_error(wrong, "SudokuEnvironment", "my_env")
    assert not (folder / "completions.jsonl").exists()
    mine = serve("my_env:MyEnv", cwd=folder)
    bare = mine.removeprefix("http://")
    no_scheme = envsdk("rollout", "--env", "my_env", "--base-url", bare, "--no-progress", cwd=folder)
    assert_one_line_error(no_scheme, f"http://{bare}")
    assert no_scheme.returncode == 2 and not (folder / "completions.jsonl").exists()
    right = envsdk("rollout", "--env", "my_env", "--base-url", mine, "--episodes", "2", "--no-progress", cwd=folder)
    assert right.returncode == 0, right.stderr


async def test_13_client_mistakes_raise_errors_that_say_what_to_do(folder: Path, serve: ServeFn) -> None:
    from envsdk import EnvClient
    from envsdk.errors import EnvSDKError

    url = serve("my_env:MyEnv", cwd=folder)
    with pytest.raises((ValueError, EnvSDKError)) as web:
        async with EnvClient(url + "/web") as env:
            await env.reset()
    assert "/web" in str(web.value) and url in str(web.value) and "403" not in repr(web.value).split(":")[0]
    async with EnvClient(url) as env:
        await env.reset(seed=1)
        with pytest.raises(TypeError) as caught:
            await env.step("[1 1 1]")  # type: ignore[arg-type]
        assert "dictionary update sequence" not in str(caught.value)
        assert "{\"message\": " in str(caught.value) or "{'message': " in str(caught.value)


# 14: sampling options ----------------------------------------------------------------------


def _recording_inference_app(seen: list[dict[str, Any]]) -> Any:
    """An OpenAI-compatible endpoint that records each request's body and bearer key (what a
    real server does with them cannot show which were sent)."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "m", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> dict[str, Any]:
        seen.append({"body": await request.json(), "auth": request.headers.get("authorization")})
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "<action>down</action>"},
                             "finish_reason": "stop"}]}

    return app


def test_14_sampling_options_and_the_api_key_reach_the_endpoint(folder: Path) -> None:
    from envsdk.testing import running_server

    seen: list[dict[str, Any]] = []
    with running_server(_recording_inference_app(seen)) as base:
        flags = ["rollout", "--env", "frozen_lake", "--policy", "openai", "--api-base", base + "/v1", "--model", "m",
                 "--episodes", "1", "--max-turns", "1", "--overwrite", "--no-progress"]
        greedy = envsdk(*flags, "--temperature", "0", "--top-p", "0.5", "--max-tokens", "7", "--api-key", "k1",
                        cwd=folder)
        assert greedy.returncode == 0, greedy.stderr
        body = seen[-1]["body"]
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0, 0.5, 7), body
        assert seen[-1]["auth"] == "Bearer k1"
        from_env = envsdk(*flags, cwd=folder, env={**user_env(), "OPENAI_API_KEY": "k2"})
        assert from_env.returncode == 0, from_env.stderr
        assert seen[-1]["auth"] == "Bearer k2"
        bad = envsdk(*flags, "--temperature", "3", cwd=folder)
        assert_one_line_error(bad, "temperature")
        assert bad.returncode == 2
    helped = envsdk("rollout", "--help", cwd=folder)
    for flag in ("--temperature", "--top-p", "--max-tokens", "--api-key", "OPENAI_API_KEY"):
        assert flag in helped.stdout


# 17: CLI conventions -----------------------------------------------------------------------


def test_17_version_help_defaults_and_names_follow_cli_conventions(folder: Path) -> None:
    import envsdk as package

    version = envsdk("--version", cwd=folder)
    assert version.returncode == 0 and version.stdout.strip() == f"envsdk {package.__version__}"
    for args in ([], ["serve"], ["check-env"], ["rollout"], ["report"]):
        helped = envsdk(*args, "--help", cwd=folder)
        assert helped.returncode == 0 and "``" not in helped.stdout, (args, helped.stdout)
    rollout_help = " ".join(envsdk("rollout", "--help", cwd=folder).stdout.split())
    assert "--episodes EPISODES number of episodes (default: 8)" in rollout_help, rollout_help
    assert "(default: completions.jsonl)" in rollout_help
    scheduler_help = rollout_help.split("--scheduler SCHEDULER ", 2)[-1].split(" --", 1)[0]
    assert "tools" in scheduler_help and "openenv" in scheduler_help
    assert "remote" in (REPO / "docs" / "rollouts.md").read_text(encoding="utf-8")


def test_17_envs_are_named_alike_everywhere(folder: Path) -> None:
    (folder / "my_plugin.py").write_text(
        "from envsdk.env import Env\nfrom envsdk.registry import envs\n\n"
        "class Once(Env):\n"
        "    async def reset(self, config):\n        self.over = False\n        return 'say it', {}, None\n"
        "    async def step(self, messages):\n"
        "        if self.over:\n            raise RuntimeError('over')\n"
        "        self.over = True\n        return 'ok', 1.0, True, {}\n\n"
        "envs['once'] = Once\n",
        encoding="utf-8",
    )
    plugins = envsdk("rollout", "--env", "once", "--external_plugins", "my_plugin.py", "--episodes", "2",
                     "--no-progress", cwd=folder)
    assert plugins.returncode == 0, plugins.stderr
    by_class = envsdk("rollout", "--env", "my_env:MyEnv", "--episodes", "2", "--overwrite", "--no-progress", cwd=folder)
    assert by_class.returncode == 0, by_class.stderr
    assert {r["turns"] for r in _records(folder / "completions.jsonl")} == {3}
    local_class = envsdk("rollout", "--env", "my_plugin.py:Once", "--episodes", "2", "--overwrite", "--no-progress", cwd=folder)
    assert local_class.returncode == 0, local_class.stderr
    checked = envsdk("check-env", "sudoku", cwd=folder, timeout=120)
    assert checked.returncode == 0, checked.stderr


def test_17_exit_codes_prefixes_and_pipes_are_consistent(folder: Path) -> None:
    usage = [
        envsdk("rollout", "--env", "nope", cwd=folder),
        envsdk("check-env", "nope", cwd=folder),
        envsdk("serve", "nope:Env", cwd=folder),
        envsdk("serve", "my_env:MyEnv", "--log-level", "verbose", cwd=folder),
        envsdk("serve", "my_env:MyEnv", cwd=folder, env={**user_env(), "PORT": "abc"}),
        envsdk("report", "missing.jsonl", cwd=folder),
    ]
    for result in usage:
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr, result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("envsdk ") and ": error: " in last, result.stderr
    assert "PORT" in usage[4].stderr and "'abc'" in usage[4].stderr
    assert "verbose" in usage[3].stderr and "debug" in usage[3].stderr
    # A reader that stops early (| head) ends the command quietly.
    piped = subprocess.run(
        f"'{ENVSDK}' check-env my_env:MyEnv | head -n 0", shell=True, cwd=folder, env=user_env(),
        capture_output=True, text=True, timeout=120,
    )
    assert "BrokenPipeError" not in piped.stderr and "Traceback" not in piped.stderr, piped.stderr


# 18: serving an ms-swift-style Env ---------------------------------------------------------

ENV_THAT_KEEPS_GOING = """\
from envsdk.env import Env

class MyEnv(Env):
    '''Ends after two replies, and (wrongly) would go on answering after that.'''
    async def reset(self, config):
        self.turn = 0
        return "say two things", {}, "You are brief."
    async def step(self, messages):
        self.turn += 1
        return f"heard {messages[-1]['content']!r}", 1.0, self.turn >= 2, {}
"""


async def test_18_an_env_is_served_through_the_adapter_and_refuses_a_step_after_done(
    tmp_path: Path, serve: ServeFn
) -> None:
    from envsdk import EnvClient
    from envsdk.errors import EpisodeDoneError, ServerError

    (tmp_path / "my_plugin.py").write_text(ENV_THAT_KEEPS_GOING, encoding="utf-8")
    url = serve("my_plugin:MyEnv", cwd=tmp_path)
    async with EnvClient(url) as env:
        first = await env.reset(seed=1)
        assert first.observation["text"] == "say two things" and first.observation["system_message"] == "You are brief."
        conversation = [{"role": "user", "content": "say two things"}, {"role": "assistant", "content": "one"}]
        assert (await env.step({"messages": conversation})).observation["text"] == "heard 'one'"
        conversation += [{"role": "user", "content": "heard 'one'"}, {"role": "assistant", "content": "two"}]
        assert (await env.step({"messages": conversation})).done
        with pytest.raises((EpisodeDoneError, ServerError)) as caught:
            await env.step({"messages": conversation})
        assert "over" in str(caught.value) or "done" in str(caught.value).lower()
    rolled = envsdk("rollout", "--env", "my_env", "--base-url", url, "--episodes", "2", "--no-progress", cwd=tmp_path)
    assert rolled.returncode == 0, rolled.stderr
    assert {r["turns"] for r in _records(tmp_path / "completions.jsonl")} == {2}
    assert "envsdk serve my_plugin:MyEnv" in doc_block("docs/local-env.md", "plugin-commands").text
    assert "class MyEnv(Env):" in doc_block("docs/local-env.md", "plugin").text


# 19: plots a reader can read; envsdk on PATH ------------------------------------------------


def _record(seed: int, reward: float, step: int) -> dict[str, Any]:
    return {
        "schema": "envsdk.completions/1", "uuid": f"u{seed}", "env": "frozen_lake", "seed": seed, "env_config": {},
        "status": "done", "reason": None, "error_kind": None, "success": reward == 1.0, "turns": 2,
        "total_reward": reward, "step_rewards": [0.0, reward], "reward_components": {}, "infos": {},
        "messages": [], "timings": {}, "global_step": step,
    }


def test_19_report_plots_have_whole_ticks_visible_labels_and_no_twin_curves(folder: Path) -> None:
    pytest.importorskip("matplotlib")
    from envsdk.report import load_episodes, training_figure

    one_step = _rows(folder / "train.jsonl", [_record(i, float(i % 2), 1) for i in range(4)])
    reported = envsdk("report", "train.jsonl", cwd=folder)
    assert reported.returncode == 0, reported.stderr
    assert (folder / "train_report" / "training.png").is_file()
    figure = training_figure(load_episodes(one_step), [])
    # A 0/1 reward is the success: one curve, said so, not the same curve twice.
    assert len(figure.axes) == 1 and "0/1" in figure.axes[0].get_title()
    figure.canvas.draw()
    assert [t for t in figure.axes[0].get_xticks() if t != int(t)] == []
    zeros = _rows(folder / "zeros.jsonl", [_record(i, 0.0, 1) for i in range(4)])
    ones = _rows(folder / "ones.jsonl", [_record(i, 1.0, 1) for i in range(4)])
    compared = envsdk("report", str(zeros), str(ones), cwd=folder)
    assert compared.returncode == 0, compared.stderr
    from envsdk.report import _histogram, _figure

    ax = _figure(4, 3).add_subplot()
    _histogram(ax, [0.0, 0.0, 0.0], "total reward", "#2f6fde")
    assert list(ax.get_xticks()) == [0.0]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert ".venv/bin" in readme.split("Your own environment, from an empty folder", 1)[1][:1500]


def test_5_a_sudoku_row_under_the_openenv_scheduler_is_played_from_the_board_text(folder: Path) -> None:
    row = {"messages": [{"role": "user", "content": "Play Sudoku."}], "env_config": {"name": "sudoku", "seed": 3}}
    rows = _rows(folder / "rows.jsonl", [row])
    played = envsdk("rollout", "--dataset", str(rows), "--scheduler", "openenv", "--max-turns", "3", "--no-progress",
                    cwd=folder)
    assert played.returncode == 0, played.stderr
    [record] = _records(folder / "completions.jsonl")
    assert record["status"] != "error", record["reason"]
    assert "Sudoku Grid" in record["messages"][0]["content"] and not record["messages"][0]["content"].startswith("{")
