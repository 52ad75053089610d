"""Every ``swift rollout`` / ``swift rlhf`` command line in examples/swift/README.md uses flags
that ms-swift's argument dataclasses have, and names plugins, schedulers and envs that exist."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from types import ModuleType

from swift.arguments import RLHFArguments, RolloutArguments
from swift.rollout import envs, multi_turns

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "examples" / "swift" / "README.md"


def _commands() -> list[list[str]]:
    """The `swift …` commands in the README's bash blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL):
        text = re.sub(r"\\\n", " ", "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("#")))
        for line in text.splitlines():
            tokens = shlex.split(line)
            while tokens and re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):  # environment variables
                tokens.pop(0)
            if tokens[:1] == ["swift"]:
                commands.append(tokens)
    return commands


def _flags(tokens: list[str]) -> dict[str, str | None]:
    flags: dict[str, str | None] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
            flags[token[2:]] = value
    return flags


def test_readme_swift_commands_use_real_flags_and_names(
    sudoku_plugin: ModuleType, frozen_lake_plugin: ModuleType
) -> None:
    fields = {
        "rollout": {f.name for f in dataclasses.fields(RolloutArguments)},
        "rlhf": {f.name for f in dataclasses.fields(RLHFArguments)},
    }
    commands = _commands()
    assert sum(c[1] == "rollout" for c in commands) >= 2 and sum(c[1] == "rlhf" for c in commands) >= 3
    for tokens in commands:
        flags = _flags(tokens)
        unknown = sorted(set(flags) - fields[tokens[1]])
        assert not unknown, f"`swift {tokens[1]}` has no flags {unknown}"
        if "external_plugins" in flags:
            assert (ROOT / str(flags["external_plugins"])).is_file()
        if "multi_turn_scheduler" in flags:
            assert flags["multi_turn_scheduler"] in multi_turns
        if "gym_env" in flags:
            assert flags["gym_env"] in envs
        if "dataset" in flags:
            assert (ROOT / str(flags["dataset"])).is_file()
