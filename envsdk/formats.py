"""What the model reads, and how its replies become actions.

One function renders an observation as the text of a user message (`render_observation`); the
schedulers, the rollout records (their ``messages``) and the ``/web`` page's "What the model
reads" panel all call it, so all three show the same characters. The rule, by the shape of the
observation body (``reward``, ``done`` and ``metadata`` are never shown):

1. a tool result (a ``tool_name`` key): the tool's value as text, or ``error: <message>``;
2. a transcript (``messages``, a list of ``{"content": str, ...}``, as TextArena servers send):
   on the first observation of an episode the ``prompt`` (unless the transcript already holds
   it) then the transcript; later only the text added since the previous observation, so a
   server that resends the whole transcript every turn costs no more context than one that
   sends only the news;
3. a text field: the first non-empty string among ``text``, ``prompt``, ``message``,
   ``content`` and ``observation``, else the body's only string field;
4. anything else: the body as compact JSON.

Formatters are looked up by name in `formatters`: ``"text"`` (the rule above, the default) and
``"json"`` (the whole observation as JSON, ms-swift's default). A formatter is any
``(observation, previous) -> str`` callable; register your own with ``formatters["mine"] = fn``.

A reply becomes an action by `parse_reply`: a JSON object (a code fence around it is dropped)
is the action; otherwise, when the action has a single field, a string field gets the reply's
text and any other field the reply read as JSON (``"42"`` → ``{"guess": 42}``); with no action
schema known the text goes to ``message`` (OpenEnv's text action); anything else is a
`ReplyParseError` naming the fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from envsdk.registry import Registry, import_spec
from envsdk.schema_values import example_value, type_name

__all__ = [
    "ObservationFormatter",
    "render_observation",
    "observation_json",
    "tool_result_text",
    "formatters",
    "formatter_for",
    "DEFAULT_FORMATTER",
    "ReplyParseError",
    "parse_reply",
    "action_fields",
]

ObservationFormatter = Callable[[Mapping[str, Any], "Mapping[str, Any] | None"], str]

DEFAULT_FORMATTER = "text"

#: Fields of every observation that the model never reads: the frame's figures and side data.
_NOT_SHOWN = frozenset({"reward", "done", "metadata"})
#: Where a text observation keeps its text, most specific first.
_TEXT_FIELDS = ("text", "prompt", "message", "content", "observation")


def tool_result_text(observation: Mapping[str, Any]) -> str:
    """A tool call's observation as text: its value (a string as is, anything else as JSON),
    or ``error: <message>``."""
    error = observation.get("error")
    if error:
        return f"error: {error.get('message', error) if isinstance(error, dict) else error}"
    result = observation.get("result")
    value = result.get("data") if isinstance(result, dict) and "data" in result else result
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _transcript(messages: list[Any]) -> str:
    return "\n".join(
        str(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)
    )


def _is_transcript(value: Any) -> TypeGuard[list[Any]]:
    return isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value)


def render_observation(observation: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> str:
    """The text a model reads for `observation`; `previous` is the episode's observation before
    it (None for the first one). See the module docstring for the rule."""
    body = {k: v for k, v in observation.items() if k not in _NOT_SHOWN}
    if "tool_name" in body:
        return tool_result_text(body)
    messages = body.get("messages")
    if _is_transcript(messages) and (messages or "prompt" in body):
        text = _transcript(messages)
        before = previous.get("messages") if previous is not None else None
        if previous is not None:
            seen = _transcript(before) if _is_transcript(before) else ""
            # A cumulative transcript repeats what was read before: only the rest is news.
            return (text[len(seen):] if seen and text.startswith(seen) else text).strip()
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt.strip() and prompt.strip() not in text:
            text = f"{prompt.strip()}\n\n{text}" if text else prompt
        return text.strip()
    for name in _TEXT_FIELDS:
        value = body.get(name)
        if isinstance(value, str) and value:
            return value
    strings = [v for v in body.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(body, ensure_ascii=False, default=str)


def observation_json(observation: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> str:
    """ms-swift's default: the whole observation body as JSON (`previous` is not used)."""
    return json.dumps(observation, ensure_ascii=False, default=str)


formatters: Registry[ObservationFormatter] = Registry("formatter")
formatters["text"] = render_observation
formatters["json"] = observation_json


def formatter_for(spec: str | ObservationFormatter | None) -> ObservationFormatter:
    """The formatter `spec` names: a registered name (`formatters`), a ``"module:attribute"``
    or ``"file.py:attribute"`` spec, or a formatter itself; None is the default (``"text"``).
    Raises `EnvNotFoundError` (a `KeyError`, listing the names) for an unknown name."""
    if spec is None:
        return render_observation
    if callable(spec):
        return spec
    if ":" in spec and spec not in formatters:
        found = import_spec(spec)
        if not callable(found):
            raise TypeError(f"{spec} is not callable: a formatter is a function (observation, previous) -> str")
        return found  # type: ignore[no-any-return]
    return formatters[spec]


# ---------------------------------------------------------------- replies


class ReplyParseError(ValueError):
    """A reply that cannot be made into the environment's action; the message says what the
    action takes and how to reply."""


_CODE_FENCE = re.compile(r"^\s*```[\w+-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def action_fields(action_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The action's fields (name → JSON schema) a reply may fill: all but ``metadata``."""
    properties = action_schema.get("properties")
    if not isinstance(properties, dict):
        return {}
    return {name: prop for name, prop in properties.items() if name != "metadata"}


def _is_string(prop: Any) -> bool:
    if not isinstance(prop, dict):
        return False
    if prop.get("type") == "string":
        return True
    options = prop.get("anyOf")
    return isinstance(options, list) and any(isinstance(o, dict) and o.get("type") == "string" for o in options)


def parse_reply(text: str, action_schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The action for a reply (see the module docstring for the rule).

    `action_schema` is the action's JSON schema (a server's ``/schema`` ``action``); without it
    a non-JSON reply becomes ``{"message": text}``. Raises `ReplyParseError` when the reply fits
    no field of the action."""
    fenced = _CODE_FENCE.match(text)
    body = fenced.group(1) if fenced else text
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = _NOT_JSON
    if isinstance(parsed, dict):
        return parsed
    if action_schema is None:
        return {"message": text}
    fields = action_fields(action_schema)
    if len(fields) == 1:
        name, prop = next(iter(fields.items()))
        if _is_string(prop):
            return {name: text}
        if parsed is not _NOT_JSON:
            return {name: parsed}
    described = ", ".join(f"{n} ({type_name(p, action_schema)})" for n, p in fields.items())
    example = json.dumps(_example_action(action_schema, fields), ensure_ascii=False)
    raise ReplyParseError(
        f"reply {text[:80]!r} is not an action: the action's fields are {described or 'none'};"
        f" reply with a JSON object such as {example}, or override the scheduler's parse_action"
    )


def _example_action(action_schema: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """An action the schema accepts, of its required fields (all of them when none is required),
    each a plain value of its type: what a reply hint shows."""
    required = [n for n in action_schema.get("required", []) if n in fields] or list(fields)
    return {name: example_value(fields[name], action_schema) for name in required}


_NOT_JSON = object()
