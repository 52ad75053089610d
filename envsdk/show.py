"""``envsdk show completions.jsonl``: episodes as the model read them, one transcript each.

Every message of a record in order, by role: the system prompt, each observation the model read
(``user``), each reply (``assistant``), with its reasoning marked apart from the reply (the part
never parsed as the action) and each native tool call by name, id and arguments, and each tool
result (``tool``) with the call it answers. Each transcript opens with the episode's example and
rollout index, environment, status, success, reward and turns, then why it ended.

Records are written in the order episodes end (so a crash loses none); `show` prints them by
example in natural order (``seed-2`` before ``seed-10``), then by rollout index.
``envsdk rollout --print-samples N`` prints the first N the same way after its summary.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

from envsdk._process import print_err, print_out
from envsdk.evaluate import natural_key
from envsdk.records import Status, number_text
from envsdk.server.config import positive_int

__all__ = ["add_show_parser", "render_records", "select_records", "show_command", "transcript"]

#: What a record's transcript says of its success: true, false, or not stated.
_SUCCESS = {True: "yes", False: "no", None: "not stated"}


def _order(record: Mapping[str, Any]) -> tuple[list[tuple[int, int, str]], int, list[tuple[int, int, str]]]:
    tag = record.get("eval")
    example = tag.get("example") if isinstance(tag, dict) else None
    index = tag.get("index") if isinstance(tag, dict) else None
    uuid = str(record.get("uuid"))
    return (
        natural_key(example if isinstance(example, str) else uuid),
        index if isinstance(index, int) and not isinstance(index, bool) else 0,
        natural_key(uuid),
    )


def _wanted(record: Mapping[str, Any], examples: Sequence[str], statuses: Sequence[str]) -> bool:
    tag = record.get("eval")
    example = tag.get("example") if isinstance(tag, dict) else record.get("uuid")
    return (not examples or str(example) in examples or str(record.get("uuid")) in examples) and (
        not statuses or record.get("status") in statuses
    )


def select_records(
    path: str | Path,
    *,
    limit: int | None = None,
    examples: Sequence[str] = (),
    statuses: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The records of `path` to show, by example in natural order then rollout index: those of
    `examples` (an example or uuid) and `statuses` when given, the first `limit` of them. Reads
    the file twice rather than holding every record: only the chosen ones are kept.
    `envsdk.evaluate.EvalError` for a file that is not one of records."""
    from envsdk.evaluate import iter_records

    keys = [
        (_order(record), number)
        for number, (_, record) in enumerate(iter_records(path))
        if _wanted(record, examples, statuses)
    ]
    keys.sort()
    chosen = {number: rank for rank, (_, number) in enumerate(keys[:limit] if limit is not None else keys)}
    kept: dict[int, dict[str, Any]] = {}
    for number, (_, record) in enumerate(iter_records(path)):
        if number in chosen:
            kept[chosen[number]] = record
    return [kept[rank] for rank in sorted(kept)]


def _text(content: Any) -> str:
    """A message's content as text: a string as is; a list of parts (OpenAI's content parts)
    their text, a non-text part as ``[type]``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(f"[{part.get('type', 'part') if isinstance(part, dict) else type(part).__name__}]")
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… ({len(text) - max_chars} more chars)"


def _header(record: Mapping[str, Any]) -> str:
    tag = record.get("eval")
    example = tag.get("example") if isinstance(tag, dict) else None
    index = tag.get("index") if isinstance(tag, dict) else None
    name = f"{example} #{index}" if example is not None else str(record.get("uuid"))
    success = record.get("success")
    reward = record.get("total_reward")
    facts = [
        name,
        f"env {record.get('env')}",
        f"status {record.get('status')}",
        f"success {_SUCCESS.get(success if isinstance(success, bool) else None)}",
        f"reward {number_text(float(reward)) if isinstance(reward, (int, float)) else reward}",
        f"turns {record.get('turns')}",
    ]
    return "=" * 3 + " " + " | ".join(facts) + " " + "=" * 3


def _tool_call_lines(call: Any, max_chars: int | None) -> list[str]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ["--- assistant: tool call ---", _cut(_text(call), max_chars)]
    arguments = function.get("arguments")
    shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, default=str)
    return [f"--- assistant: tool call {function.get('name')} (id {call.get('id')}) ---", _cut(shown, max_chars)]


def transcript(record: Mapping[str, Any], *, max_chars: int | None = None) -> str:
    """One record as the model read it: a header, why the episode ended, then every message in
    order (see the module docstring). `max_chars` cuts each message's text past that length."""
    lines = [_header(record)]
    if record.get("reason"):
        lines.append(f"ended: {record['reason']}")
    if record.get("truncated"):
        lines.append("the last reply was cut by the length limit")
    messages = record.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", "?"))
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning:
            lines += [f"--- {role}: reasoning (kept apart from the reply, never read as the action) ---",
                      _cut(_text(reasoning), max_chars)]
        calls = message.get("tool_calls")
        content = _text(message.get("content"))
        if role == "tool":
            said = message.get("tool_call_id")
            name = message.get("name")
            head = "--- tool" + (f": result of {said}" if said else "") + (f" ({name})" if name else "") + " ---"
            lines += [head, _cut(content, max_chars)]
            continue
        if content or not calls:
            lines += [f"--- {role} ---", _cut(content, max_chars)]
        for call in calls if isinstance(calls, list) else []:
            lines += _tool_call_lines(call, max_chars)
    return "\n".join(lines)


def render_records(records: Iterable[Mapping[str, Any]], *, max_chars: int | None = None) -> str:
    """Transcripts of `records`, a blank line apart."""
    return "\n\n".join(transcript(record, max_chars=max_chars) for record in records)


def add_show_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``show`` command to an argparse subparsers object (``func``: `show_command`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "show",
        help="print episodes of a completions.jsonl file as the model read them",
        description="Print each episode's transcript as the model read it: every message in order, by role, "
        "reasoning marked apart from the reply, tool calls and tool results; with its example, status, "
        "success, reward and turns. Episodes are shown by example in natural order (seed-2 before seed-10).",
    )
    parser.add_argument("completions", help="JSON-lines file of trajectories (envsdk rollout --out)")
    parser.add_argument("-n", "--limit", type=positive_int, default=None, metavar="N", help="show the first N episodes only")
    parser.add_argument(
        "--example", action="append", default=[], metavar="ID",
        help="only this example's episodes (seed-3, a dataset row's uuid, HumanEval/7); may be given again",
    )
    parser.add_argument(
        "--status", action="append", default=[], metavar="STATUS",
        choices=[status for status in get_args(Status) if status != "running"],  # how a recorded episode ended
        help="only episodes that ended so (done, max_turns, length, error, cancelled); may be given again",
    )
    parser.add_argument(
        "--max-chars", type=positive_int, default=None, metavar="N", help="cut each message's text after N characters"
    )
    parser.set_defaults(func=show_command)
    return parser


def show_command(args: argparse.Namespace) -> int:
    """Run ``envsdk show``: 0 when it printed episodes, 1 when none matched, 2 for a file that
    is not one of records (said in one line)."""
    from envsdk.evaluate import EvalError

    try:
        records = select_records(args.completions, limit=args.limit, examples=args.example, statuses=args.status)
    except EvalError as exc:
        print_err(f"envsdk show: error: {' '.join(str(exc).split())}")
        return 2
    if not records:
        wanted = " and ".join(
            part for part in (
                f"example {', '.join(args.example)}" if args.example else "",
                f"status {', '.join(args.status)}" if args.status else "",
            ) if part
        )
        print_err(f"envsdk show: error: no episode in {args.completions}" + (f" with {wanted}" if wanted else ""))
        return 1
    print_out(render_records(records, max_chars=args.max_chars))
    return 0
