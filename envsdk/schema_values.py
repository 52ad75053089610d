"""Values that fit a JSON schema: drawn at random (`random_value`), or one plain example
(`example_value`), and a schema's type in words (`type_name`).

They read the JSON schemas pydantic writes for an action (a server's ``/schema`` ``action``) or a
tool's parameters: ``$ref`` into ``$defs``, ``anyOf``/``oneOf`` (an optional field), ``allOf``,
``const``, ``enum``, ``type`` (one or a list) and the bounds of each type: ``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` and ``multipleOf`` for numbers,
``minLength``/``maxLength`` for strings, ``minItems``/``maxItems``, ``items`` and
``prefixItems`` for arrays, ``properties``/``required``/``additionalProperties`` for objects.
A random policy replies with `random_value`, so that a typed environment sees actions it
accepts; a reply hint shows `example_value`, so that a model is told a value of the right type.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

__all__ = ["example_value", "random_value", "type_name"]

#: The words random strings are made of.
_WORDS = ("alpha", "beta", "gamma", "delta", "hello", "test")
#: How deep a schema is followed (a model that holds itself): deeper, only what is required, empty.
_MAX_DEPTH = 8
#: The range drawn from for a number with no bound on that side.
_SPAN = 100
_NO_VALUE = object()


def _resolve(schema: Any, root: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with a local ``$ref`` (``#/$defs/Name``) and a one-member ``allOf`` followed."""
    for _ in range(_MAX_DEPTH):
        if not isinstance(schema, dict):
            return {}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part) if isinstance(target, dict) else None
            schema = {**(target if isinstance(target, dict) else {}), **{k: v for k, v in schema.items() if k != "$ref"}}
            continue
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1:
            schema = {**{k: v for k, v in schema.items() if k != "allOf"}, **_resolve(all_of[0], root)}
            continue
        return schema
    return schema if isinstance(schema, dict) else {}


def _options(schema: dict[str, Any]) -> list[Any] | None:
    options = schema.get("anyOf", schema.get("oneOf"))
    return options if isinstance(options, list) and options else None


def _types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    if "properties" in schema:
        return ["object"]
    if "items" in schema or "prefixItems" in schema:
        return ["array"]
    return []


def type_name(schema: Any, root: Mapping[str, Any] | None = None) -> str:
    """A schema's type in words: ``integer``, ``integer or null``, ``one of 'buy', 'sell'``,
    ``object``; ``any`` when it says none."""
    resolved = _resolve(schema, root if root is not None else schema if isinstance(schema, dict) else {})
    if "const" in resolved:
        return repr(resolved["const"])
    if isinstance(resolved.get("enum"), list) and resolved["enum"]:
        return "one of " + ", ".join(map(repr, resolved["enum"]))
    options = _options(resolved)
    if options is not None:
        return " or ".join(dict.fromkeys(type_name(o, root or resolved) for o in options))
    return " or ".join(_types(resolved)) or "any"


# ---------------------------------------------------------------- numbers


def _real(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    """The closed range a number may take (an integer's exclusive bound moved in by one)."""
    low, high = _real(schema.get("minimum")), _real(schema.get("maximum"))
    exclusive_low, exclusive_high = _real(schema.get("exclusiveMinimum")), _real(schema.get("exclusiveMaximum"))
    step = 1 if integer else 1e-9
    if exclusive_low is not None:
        low = exclusive_low + step if low is None else max(low, exclusive_low + step)
    if exclusive_high is not None:
        high = exclusive_high - step if high is None else min(high, exclusive_high - step)
    if low is None and high is None:
        low, high = 0.0, float(_SPAN)
    elif low is None:
        assert high is not None
        low = min(0.0, high - _SPAN)
    elif high is None:
        high = max(low, 0.0) + _SPAN
    if integer:
        return float(math.ceil(low)), float(math.floor(high))
    return low, high


def _multiple(value: float, schema: dict[str, Any], low: float, high: float, integer: bool) -> float:
    """`value` moved to a multiple of ``multipleOf`` within [low, high], when the schema asks."""
    multiple = schema.get("multipleOf")
    if not isinstance(multiple, (int, float)) or isinstance(multiple, bool) or multiple <= 0:
        return value
    first, last = math.ceil(low / multiple), math.floor(high / multiple)
    count = max(first, min(last, round(value / multiple)))
    moved = count * multiple
    return float(round(moved)) if integer else moved


def _number(rng: random.Random | None, schema: dict[str, Any], integer: bool) -> int | float:
    low, high = _bounds(schema, integer)
    if rng is None:  # the example: 0 when it fits, else the nearest bound
        value: float = min(max(0, low), high)
    elif integer:
        value = rng.randint(int(low), int(max(low, high)))
    else:
        value = rng.uniform(float(low), float(high))
    value = _multiple(value, schema, low, high, integer)
    return int(value) if integer else float(value)


# ---------------------------------------------------------------- strings, arrays, objects


def _string(rng: random.Random | None, schema: dict[str, Any]) -> str:
    low = schema.get("minLength", 0)
    high = schema.get("maxLength")
    low = low if isinstance(low, int) and low > 0 else 0
    word = "text" if rng is None else rng.choice(_WORDS)
    if len(word) < low:
        word = (word * (low // len(word) + 1))[:low]
    if isinstance(high, int) and high >= low:
        word = word[: max(high, low)]
    return word


def _array(rng: random.Random | None, schema: dict[str, Any], root: Mapping[str, Any], depth: int) -> list[Any]:
    given = schema.get("prefixItems")
    prefix: list[Any] = given if isinstance(given, list) else []
    low = schema.get("minItems", 0)
    high = schema.get("maxItems")
    low = low if isinstance(low, int) and low > 0 else 0
    low = max(low, len(prefix))
    if not isinstance(high, int) or high < low:
        high = low + 3
    if rng is None or depth >= _MAX_DEPTH:
        size = low
    else:
        size = rng.randint(low, high)
    items = schema.get("items")
    if items is False:  # a tuple: its prefix only
        size = len(prefix)
    values = [_value(rng, prefix[i] if i < len(prefix) else items, root, depth + 1) for i in range(size)]
    if schema.get("uniqueItems"):
        unique: list[Any] = []
        for value in values:
            if value not in unique:
                unique.append(value)
        values = unique if len(unique) >= low else values
    return values


def _object(rng: random.Random | None, schema: dict[str, Any], root: Mapping[str, Any], depth: int) -> dict[str, Any]:
    described = schema.get("properties")
    properties: dict[str, Any] = described if isinstance(described, dict) else {}
    required = [name for name in schema.get("required", []) if isinstance(name, str)]
    value: dict[str, Any] = {}
    for name, prop in properties.items():
        # An optional field is given half the time (drawn), never in an example or past the depth.
        if name in required or (rng is not None and depth < _MAX_DEPTH and rng.random() < 0.5):
            value[name] = _value(rng, prop, root, depth + 1)
    for name in required:  # required but not described
        value.setdefault(name, "text" if rng is None else rng.choice(_WORDS))
    extra = schema.get("additionalProperties")
    if not properties and isinstance(extra, dict) and rng is not None and depth < _MAX_DEPTH:
        for _ in range(rng.randint(0, 2)):
            value[rng.choice(_WORDS)] = _value(rng, extra, root, depth + 1)
    return value


def _value(rng: random.Random | None, schema: Any, root: Mapping[str, Any], depth: int) -> Any:
    resolved = _resolve(schema, root)
    if "const" in resolved:
        return resolved["const"]
    enum = resolved.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0] if rng is None else rng.choice(enum)
    options = _options(resolved)
    if options is not None:
        # An optional field's null is one choice among the others' values; an example shows a value.
        typed = [o for o in options if _resolve(o, root).get("type") != "null"] or options
        chosen = typed[0] if rng is None else rng.choice(options if depth < _MAX_DEPTH else typed)
        return _value(rng, {**{k: v for k, v in resolved.items() if k not in ("anyOf", "oneOf")}, **_resolve(chosen, root)}, root, depth)
    kinds = _types(resolved)
    kind = (kinds[0] if rng is None else rng.choice(kinds)) if kinds else None
    if kind == "null":
        return None
    if kind in ("integer", "number"):
        return _number(rng, resolved, kind == "integer")
    if kind == "boolean":
        return True if rng is None else rng.random() < 0.5
    if kind == "array":
        return _array(rng, resolved, root, depth)
    if kind == "object":
        return _object(rng, resolved, root, depth)
    if "default" in resolved:
        return resolved["default"]
    return _string(rng, resolved)


def random_value(rng: random.Random, schema: Any, root: Mapping[str, Any] | None = None) -> Any:
    """A value drawn with `rng` that `schema` accepts (within its bounds). `root` is the document
    its ``$ref`` point into (default: `schema` itself)."""
    return _value(rng, schema, root if root is not None else schema if isinstance(schema, dict) else {}, 0)


def example_value(schema: Any, root: Mapping[str, Any] | None = None) -> Any:
    """One plain value `schema` accepts, the same every time: an enum's first member, 0 (or the
    nearest bound) for a number, ``true``, ``"text"``, an object of its required fields."""
    return _value(None, schema, root if root is not None else schema if isinstance(schema, dict) else {}, 0)
