"""Decoding settings through the real ``envsdk rollout``, as a user gives them: the same flags for
``--policy openai`` (against an OpenAI-compatible server on loopback) and ``--policy
transformers`` (the tiny model), refused for the policies that do not decode, echoed in the
summary, written to the run file and taken up again by ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envsdk.runfile import read_run_file
from tests.cli.conftest import Result, assert_one_line_error, envsdk, user_env
from tests.eval.conftest import records
from tests.policies.conftest import ScriptedChatServer, chat_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(240)

DECODING = [
    "--temperature", "0.3", "--top-p", "0.9", "--max-tokens", "7",
    "--sampling-args", '{"top_k": 20, "seed": 4, "max_tokens": 9}',
    "--chat-template-kwargs", '{"enable_thinking": false}',
]


def openai_run(server: ScriptedChatServer, folder: Path, *args: str) -> Result:
    return envsdk(
        "rollout", "--env", "frozen_lake", "--policy", "openai", "--api-base", f"{server.base_url}/v1", "--model", "m",
        "--max-turns", "1", "--no-progress", *args, cwd=folder,
    )


def summary_policy_line(result: Result) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("policy "))


def test_decoding_flags_reach_an_openai_server_and_are_echoed_and_written(
    chat_server: ScriptedChatServer, tmp_path: Path  # noqa: F811
) -> None:
    chat_server.default = "<action>down</action>"
    chat_server.replies = [{"content": "<action>down</action>", "reasoning_content": "Not <action>up</action>: a hole."}]
    run = openai_run(chat_server, tmp_path, "--episodes", "1", *DECODING)
    assert run.returncode == 0, run.stderr
    body = chat_server.bodies[-1]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["top_k"]) == (0.3, 0.9, 9, 4, 20)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert summary_policy_line(run) == (
        'policy          openai, model m: temperature=0.3, top_p=0.9, max_tokens=9, seed=4, '
        'chat_template_kwargs={"enable_thinking": false}, top_k=20'
    )
    written = read_run_file(tmp_path / "completions.run.toml")
    assert (written["temperature"], written["top-p"], written["max-tokens"]) == (0.3, 0.9, 7)
    assert written["sampling-args"] == {"top_k": 20, "seed": 4, "max_tokens": 9}
    assert written["chat-template-kwargs"] == {"enable_thinking": False}
    # The server's reasoning field is kept in the record beside the reply, which alone was played.
    (record,) = records(tmp_path / "completions.jsonl")
    (reply,) = [m for m in record["messages"] if m["role"] == "assistant"]
    assert reply == {
        "role": "assistant", "content": "<action>down</action>", "reasoning_content": "Not <action>up</action>: a hole."
    }
    assert record["messages"][-1]["content"].startswith("You moved down.")


def test_a_resumed_run_decodes_as_the_run_it_continues(chat_server: ScriptedChatServer, tmp_path: Path) -> None:  # noqa: F811
    chat_server.default = "<action>down</action>"
    first = openai_run(chat_server, tmp_path, "--episodes", "2", "--greedy", "--sampling-args", '{"top_k": 3}')
    assert first.returncode == 0, first.stderr
    assert [b["temperature"] for b in chat_server.bodies] == [0, 0]
    out = tmp_path / "completions.jsonl"
    kept = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text(kept[0], encoding="utf-8")  # the second episode's record is lost: --resume plays it
    chat_server.bodies.clear()
    resumed = envsdk("rollout", "--resume", "--out", "completions.jsonl", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len(chat_server.bodies) == 1
    assert (chat_server.bodies[0]["temperature"], chat_server.bodies[0]["top_k"]) == (0, 3)
    assert summary_policy_line(resumed).startswith("policy          openai, model m: temperature=0 (greedy), ")
    assert len(records(out)) == 2
    changed = envsdk("rollout", "--resume", "--out", "completions.jsonl", "--temperature", "0.9", cwd=tmp_path)
    assert_one_line_error(changed, "--temperature 0.9", "--resume")


def test_transformers_takes_the_same_flags_and_greedy_repeats_exactly(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="needs transformers (envsdk[train])")
    from envsdk.tiny_model import build_tiny_model

    build_tiny_model(tmp_path / "tiny")
    flags = ["rollout", "--env", "frozen_lake", "--policy", "transformers", "--model", "tiny", "--episodes", "2",
             "--max-turns", "2", "--greedy", "--max-tokens", "5", "--chat-template-kwargs", '{"enable_thinking": false}',
             "--tokens", "--no-progress"]
    env = {**user_env(), "OMP_NUM_THREADS": "1"}
    a = envsdk(*flags, "--out", "a.jsonl", cwd=tmp_path, env=env)
    assert a.returncode == 0, a.stderr
    b = envsdk(*flags, "--out", "b.jsonl", "--seed", "0", cwd=tmp_path, env=env)
    assert b.returncode == 0, b.stderr
    assert summary_policy_line(a) == (
        'policy          transformers, model tiny: temperature=0 (greedy), top_p=1, max_tokens=5, seed=0, '
        'chat_template_kwargs={"enable_thinking": false}'
    )
    # Records are written as episodes finish: compared by seed, not by the order they finished in.
    first, second = (sorted(records(tmp_path / name), key=lambda r: r["seed"]) for name in ("a.jsonl", "b.jsonl"))
    assert [r["seed"] for r in first] == [0, 1]
    assert [r["messages"] for r in first] == [r["messages"] for r in second]
    for record in first:
        # The random model never ends its turn by itself: each reply is cut at --max-tokens.
        assert record["status"] == "length"
        assert [len(turn["completion_ids"]) for turn in record["tokens"]] == [5] * record["turns"]
    written = read_run_file(tmp_path / "a.run.toml")
    assert written["greedy"] is True and written["max-tokens"] == 5
    assert written["chat-template-kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--sampling-args", '{"presence_penalty": 1}'], ["presence_penalty", "did you mean 'repetition_penalty'"]),
        (["--greedy", "--temperature", "0.5"], ["greedy decoding is temperature 0"]),
        (["--sampling-args", '{"max_tokens": "long"}'], ["max_tokens must be an integer"]),
    ],
)
def test_bad_decoding_settings_for_transformers_are_one_line_errors_before_loading(
    tmp_path: Path, flags: list[str], needles: list[str]
) -> None:
    # No model at that path: the settings are refused before anything is loaded.
    run = envsdk("rollout", "--env", "frozen_lake", "--policy", "transformers", "--model", "no-model", *flags, cwd=tmp_path)
    assert_one_line_error(run, *needles)
    assert run.returncode == 2


@pytest.mark.parametrize(
    "flags",
    [["--greedy"], ["--sampling-args", '{"top_k": 2}'], ["--chat-template-kwargs", '{"enable_thinking": false}'],
     ["--max-tokens", "9"]],
)
def test_decoding_flags_are_refused_for_policies_that_do_not_decode(tmp_path: Path, flags: list[str]) -> None:
    run = envsdk("rollout", "--env", "frozen_lake", "--policy", "oracle", "--episodes", "1", *flags, cwd=tmp_path)
    assert_one_line_error(run, f"{flags[0]} is read only by --policy openai or transformers", "--policy oracle")
    assert run.returncode == 2
    assert not (tmp_path / "completions.jsonl").exists()


def test_a_scripted_run_names_its_policy_in_the_summary(tmp_path: Path) -> None:
    run = envsdk("rollout", "--env", "frozen_lake", "--policy", "oracle", "--episodes", "1", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert summary_policy_line(run) == "policy          oracle"
    assert json.loads((tmp_path / "completions.jsonl").read_text().splitlines()[0])["status"] == "done"
