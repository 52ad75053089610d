"""Every ``envsdk`` subcommand fails with one line ``envsdk <command>: error: ...`` (exit 2 on a
usage error, 1 on a failure) and no traceback: one test per case a README reader hit, each
through the real ``envsdk`` command in a temporary folder."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.cli.conftest import Result, assert_one_line_error, envsdk, user_env
from tests.docs.blocks import doc_block

pytestmark = pytest.mark.timeout(240)


def _error_line(result: Result, command: str) -> str:
    assert_one_line_error(result)
    line = next(l for l in result.stderr.splitlines() if "error" in l.lower())
    assert line.startswith(f"envsdk {command}: error: "), result.stderr
    return line


# 1: invalid options and failures are one line, not a traceback --------------------------------


def test_an_out_of_range_server_option_is_a_usage_error_naming_it_and_its_bound(folder: Path) -> None:
    served = envsdk("serve", "my_env:MyEnv", "--max-concurrent-envs", "0", cwd=folder, timeout=60)
    line = _error_line(served, "serve")
    assert served.returncode == 2
    assert "--max-concurrent-envs" in line and "greater than or equal to 1" in line, line


def test_an_unwritable_rollout_out_is_a_usage_error(folder: Path) -> None:
    ran = envsdk("rollout", "--env", "frozen_lake", "--episodes", "1", "--out", "/proc/nope/c.jsonl",
                 "--no-progress", cwd=folder)
    line = _error_line(ran, "rollout")
    assert ran.returncode == 2 and "cannot write" in line and "/proc/nope" in line, line


def test_a_score_function_that_raises_is_one_line_naming_it_and_the_exception(folder: Path) -> None:
    played = envsdk("rollout", "--env", "frozen_lake", "--episodes", "1", "--no-progress", cwd=folder)
    assert played.returncode == 0, played.stderr
    (folder / "bad.py").write_text("def boom(record):\n    raise KeyError('missing')\n", encoding="utf-8")
    rescored = envsdk("rescore", "completions.jsonl", "--score", "bad.py:boom", cwd=folder)
    line = _error_line(rescored, "rescore")
    assert rescored.returncode == 1 and "boom" in line and "KeyError" in line and "missing" in line, line
    assert not (folder / "completions.rescored.jsonl").exists()


# 2: a port already taken ------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "said"), [("def f(:\n", "SyntaxError"), ("raise RuntimeError('boom')\n", "boom")])
@pytest.mark.parametrize("command", ["serve", "rollout"])
def test_a_module_that_raises_while_imported_is_one_line_naming_it(
    tmp_path: Path, source: str, said: str, command: str
) -> None:
    """A `module:Name` whose import raised gave the module's whole traceback (the `file.py:Name`
    form already said it in one line)."""
    (tmp_path / "broken_module.py").write_text(source)
    args = ["serve", "broken_module:X"] if command == "serve" else ["rollout", "--env", "broken_module:X", "--episodes", "1"]
    ran = envsdk(*args, cwd=tmp_path, timeout=60)
    line = _error_line(ran, command)
    assert ran.returncode == 2 and "broken_module" in line and said in line, line


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ENVSDK_WEB", "maybe"), ("ENVSDK_FIRST_FRAME_TIMEOUT_S", "abc"), ("ENVSDK_FIRST_FRAME_TIMEOUT_S", "-1"),
     ("ENVSDK_MAX_BODY_BYTES", "-5")],
)
def test_a_server_option_set_by_a_bad_environment_variable_names_the_variable(
    folder: Path, variable: str, value: str
) -> None:
    """A value that is not one was a traceback; one out of bounds (-1) was taken without a word
    (a default read from the environment was never checked); and pydantic's refusals named
    flags `serve` does not have (--first-frame-timeout-s)."""
    served = envsdk("serve", "my_env:MyEnv", "--port", "0", cwd=folder, timeout=60, env={**user_env(), variable: value})
    line = _error_line(served, "serve")
    assert served.returncode == 2 and variable in line, line
    assert "--" not in line.replace("envsdk serve", ""), line


@pytest.mark.parametrize(("flags", "env", "named"), [
    ([], {"LOG_LEVEL": "loud"}, "LOG_LEVEL='loud'"), (["--log-level", "loud"], {}, "--log-level"),
])
def test_an_unknown_log_level_is_a_usage_error_before_the_target_is_imported(
    folder: Path, flags: list[str], env: dict[str, str], named: str
) -> None:
    """LOG_LEVEL was not read at all: `envsdk serve` served at info, whatever it said."""
    (folder / "my_env.py").write_text("print('my_env imported')\n" + (folder / "my_env.py").read_text())
    served = envsdk("serve", "my_env:MyEnv", "--port", "0", *flags, cwd=folder, timeout=30, env={**user_env(), **env})
    line = _error_line(served, "serve")
    assert served.returncode == 2 and named in line and "debug" in line, line
    assert "my_env imported" not in served.stdout


def test_serving_on_a_taken_port_says_so_before_starting(folder: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = envsdk("serve", "my_env:MyEnv", "--port", str(port), cwd=folder, timeout=60)
    line = _error_line(served, "serve")
    assert served.returncode == 1
    assert line == f"envsdk serve: error: port {port} on 127.0.0.1 is already in use", line
    assert "startup complete" not in served.stderr + served.stdout


# 3: the README's plugin example -----------------------------------------------------------------


def test_the_readmes_plugin_example_passes_check_env(tmp_path: Path) -> None:
    plugin = doc_block("docs/local-env.md", "plugin").text
    assert plugin.startswith("# my_plugin.py\n")
    (tmp_path / "my_plugin.py").write_text(plugin, encoding="utf-8")
    checked = envsdk("check-env", "my_env", "--external-plugins", "my_plugin.py", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "step.after_done_refused" in checked.stdout, checked.stdout


# 4: the same error line everywhere --------------------------------------------------------------


def test_an_unknown_flag_is_the_subcommands_usage_error(folder: Path) -> None:
    ran = envsdk("rollout", "--env", "frozen_lake", "--bogus", cwd=folder, timeout=60)
    line = _error_line(ran, "rollout")
    assert ran.returncode == 2 and line == "envsdk rollout: error: unrecognized arguments: --bogus", line
    assert ran.stderr.startswith("usage: envsdk rollout"), ran.stderr


def test_check_env_errors_are_one_bounded_envsdk_line(folder: Path) -> None:
    checked = envsdk("check-env", "my_env:MyEnv", "--action", '{"nope": 1}', cwd=folder, timeout=60)
    line = _error_line(checked, "check-env")
    assert checked.returncode == 2 and checked.stderr.strip() == line, checked.stderr
    assert "message" in line and "nope" in line and len(line) <= 600, line


def test_one_warning_is_singular(tmp_path: Path) -> None:
    # reset ignores its seed: the one warning is seed.changes_nothing.
    (tmp_path / "plain.py").write_text(
        "from envsdk.env import Env\n"
        "class Plain(Env):\n"
        "    async def reset(self, config):\n"
        "        self.done = False\n"
        "        return 'say something', {}, 'Be brief.'\n"
        "    async def step(self, messages):\n"
        "        from envsdk.errors import EpisodeDoneError\n"
        "        if self.done:\n"
        "            raise EpisodeDoneError('the episode is over')\n"
        "        self.done = True\n"
        "        return 'heard', 1.0, True, {}\n",
        encoding="utf-8",
    )
    checked = envsdk("check-env", "plain:Plain", cwd=tmp_path, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "; 1 warning\n" in checked.stdout, checked.stdout


def test_a_rollout_error_line_names_the_error_type_once(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(
        "from envsdk.env import Env\n"
        "class Broken(Env):\n"
        "    async def reset(self, config):\n"
        "        raise RuntimeError('no board today')\n"
        "    async def step(self, messages):\n"
        "        raise RuntimeError('never reached')\n",
        encoding="utf-8",
    )
    ran = envsdk("rollout", "--env", "broken:Broken", "--episodes", "1", "--no-progress", cwd=tmp_path)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    line = next(l for l in ran.stderr.splitlines() if l.startswith("envsdk rollout: error: "))
    assert "RuntimeError: no board today" in line, line
    assert line.count("RuntimeError") == 1, line
