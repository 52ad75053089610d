"""Run files: every ``envsdk rollout`` option from a TOML file, and the resolved run written back.

``envsdk rollout --config run.toml`` reads options from ``run.toml`` (keys are the option names
without their dashes, ``rollouts-per-example = 4`` or ``rollouts_per_example = 4``); options given
on the command line win. After resolving, the command writes the whole configuration next to the
records (``completions.jsonl`` → ``completions.run.toml``) with a ``[run]`` table naming the run
and its attempt; ``envsdk rollout --config completions.run.toml`` repeats the run exactly, and
``--resume`` reads it back to continue the run.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import json
import math
import sys
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "RunFileError", "RUN_TABLE", "run_file_path", "read_run_file", "options_from", "parse_with", "written_options",
    "run_file_text", "options_digest",
]

#: The table of a written run file that names the run; it is not an option.
RUN_TABLE = "run"
# Options that only the command line can give: which file to read, and whether to continue the
# run that file describes.
_COMMAND_LINE_ONLY = frozenset({"help", "config", "resume"})
# Secrets a run file may give but a written one never holds (the file lies beside records that
# get shared): a resumed or repeated run takes them from the command line or the environment.
_SECRETS = {"api_key": "give --api-key again or set $OPENAI_API_KEY"}
# Options a run file may give but a written one leaves out: how one invocation behaves, and secrets.
_NOT_WRITTEN = frozenset({"overwrite", *_SECRETS})


class RunFileError(ValueError):
    """A run file cannot be read or holds an option the command does not have or cannot take."""


def run_file_path(out: str | Path) -> Path:
    """Where the resolved configuration of a run writing `out` lives: ``<stem>.run.toml`` beside it."""
    path = Path(out)
    return path.with_name(f"{path.stem}.run.toml")


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The TOML document at `path`; `RunFileError` naming the file when it is missing or not TOML."""
    source = Path(path)
    try:
        with source.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise RunFileError(f"{source}: no such run file") from None
    except OSError as exc:  # a folder, a file it may not read
        raise RunFileError(f"{source}: cannot read the run file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise RunFileError(f"{source}: not TOML (not UTF-8 text: byte {exc.start + 1})") from None
    except RecursionError:  # arrays or tables nested deeper than the parser goes
        raise RunFileError(f"{source}: not TOML this envsdk reads (arrays or tables nested too deep)") from None
    except tomllib.TOMLDecodeError as exc:
        with contextlib.suppress(OSError), source.open("rb") as handle:
            if handle.read(3) == b"\xef\xbb\xbf":
                raise RunFileError(
                    f"{source}: not TOML: it begins with a byte-order mark (U+FEFF), which TOML does not allow; "
                    "save it as UTF-8 without one"
                ) from None
        raise RunFileError(f"{source}: not TOML ({exc})") from None


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's long options a run file may give, by destination name."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:  # argparse has no public list of its actions
        if action.dest in _COMMAND_LINE_ONLY or action.dest == argparse.SUPPRESS:
            continue
        if any(s.startswith("--") for s in action.option_strings):
            found[action.dest] = action
    return found


def written_options(parser: argparse.ArgumentParser) -> list[str]:
    """The destinations a written run file records when they are set: every option a run file
    may give but ``overwrite`` and the secrets. One that is absent from a written file was unset."""
    return [dest for dest in _options(parser) if dest not in _NOT_WRITTEN]


def _convert(action: argparse.Action, key: str, value: Any, where: str) -> Any:
    flag = next(s for s in action.option_strings if s.startswith("--"))
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise RunFileError(f"{where}: {key} must be true or false (it is the flag {flag})")
        return value
    many = action.nargs in ("+", "*")
    items = value if isinstance(value, list) and many else [value]
    if isinstance(value, list) and not many:
        raise RunFileError(f"{where}: {key} takes one value ({flag}), not a list")
    converted = []
    for item in items:
        if isinstance(item, str) and action.type is not None and callable(action.type):
            try:
                item = action.type(item)
            except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
                raise RunFileError(f"{where}: {key} = {item!r}: {exc}") from None
        elif action.type is int and (isinstance(item, bool) or not isinstance(item, int)):
            raise RunFileError(f"{where}: {key} must be an integer, got {item!r}")
        elif isinstance(item, dict):
            item = dict(item)
        elif action.type is None and not isinstance(item, str):
            raise RunFileError(f"{where}: {key} must be a string, got {item!r}")
        if action.choices is not None and item not in action.choices:
            raise RunFileError(f"{where}: {key} = {item!r}; expected one of {', '.join(map(str, action.choices))}")
        converted.append(item)
    return converted if many else converted[0]


def options_from(document: Mapping[str, Any], parser: argparse.ArgumentParser, where: str) -> dict[str, Any]:
    """The parser destinations set by a run file's top-level keys (its ``[run]`` table skipped),
    each checked and converted as the command line would. `RunFileError` names an unknown key
    (with the closest option) or a value of the wrong type."""
    actions = _options(parser)
    values: dict[str, Any] = {}
    for key, value in document.items():
        if key == RUN_TABLE:
            continue
        dest = key.replace("-", "_")
        if dest in values:  # `rollouts-per-example` and `rollouts_per_example` both
            raise RunFileError(f"{where}: {key!r} gives the option {dest.replace('_', '-')!r} a second time")
        action = actions.get(dest)
        if dest in _COMMAND_LINE_ONLY - {"help"}:
            raise RunFileError(f"{where}: {key!r} cannot come from a run file: give --{dest} on the command line")
        if action is None:
            known = sorted(d.replace("_", "-") for d in actions)
            close = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RunFileError(f"{where}: unknown option {key!r}.{hint} Options: {', '.join(known)}")
        values[dest] = _convert(action, key, value, where)
    return values


def parse_with(parser: argparse.ArgumentParser, argv: Sequence[str], base: Mapping[str, Any]) -> argparse.Namespace:
    """Parse `argv` with `base` in place of the parser's defaults: an option on the command line
    wins, an option only in `base` keeps its value, the rest take their defaults."""
    # argparse fills in a default only for a destination the namespace does not have yet.
    return parser.parse_args(list(argv), namespace=argparse.Namespace(**base))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a file name in another encoding, as Python reads it
            raise RunFileError(
                f"{value!r} is not UTF-8 text, and a run file (TOML) holds only text: rename it"
            ) from None
        # A JSON string is a TOML basic string: the same escapes.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise RunFileError(f"cannot write {value!r} ({type(value).__name__}) to a run file")


def _has_none(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_none(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_none(v) for v in value)
    return False


def _written(value: Any) -> Any:
    """`value` as a run file holds it: TOML has no null, so a table holding one goes in as the
    JSON text the option also accepts."""
    if isinstance(value, dict) and _has_none(value):
        return json.dumps(value)
    return value


def run_file_text(args: argparse.Namespace, parser: argparse.ArgumentParser, run: Mapping[str, Any]) -> str:
    """The run file of every option of `parser` as resolved in `args` (unset ones left out: TOML
    has no null; ``overwrite`` and the API key never written) and the `run` table. `RunFileError`
    names an option whose value a run file cannot hold."""
    lines = ["# The resolved `envsdk rollout` options of this run; `envsdk rollout --config FILE` repeats it.", ""]
    for dest in _options(parser):
        value = getattr(args, dest, None)
        if dest in _SECRETS and value is not None:
            lines.append(f"# {dest.replace('_', '-')}: given, not written (a secret): {_SECRETS[dest]}")
            continue
        if value is None or dest in _NOT_WRITTEN:
            continue
        option = dest.replace("_", "-")
        try:
            lines.append(f"{option} = {_toml_value(_written(value))}")
        except RunFileError as exc:
            raise RunFileError(f"--{option}: {exc}") from None
    lines += ["", f"[{RUN_TABLE}]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in run.items()]
    return "\n".join(lines) + "\n"


def options_digest(values: Mapping[str, Any], parser: argparse.ArgumentParser, skip: Collection[str] = ()) -> str:
    """The SHA-256 of the options in `values` (destination -> value: a namespace's, or
    `options_from`'s of a run file) that a run file writes, but those in `skip` and those at
    their default (a line of one, deleted, plays the same), as it writes them: a run keeps it,
    so that a hand-edited run file is told from the one it wrote."""
    lines = sorted(
        f"{dest} = {_toml_value(_written(values[dest]))}"
        for dest in written_options(parser)
        if dest not in skip and values.get(dest) is not None and values[dest] != parser.get_default(dest)
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
