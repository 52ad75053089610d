# mypy: ignore-errors
# (Not imported by envsdk: this text is prepended to the sources of the candidate's harness and
# of the verifier, two processes that run alone, with the standard library only.)
"""Plain data across the verification boundary: values of exact builtin types, as JSON.

`encode_plain` refuses anything but exact ``None``, ``bool``, ``int``, ``float``, ``complex``,
``str``, ``bytes``, ``list``, ``tuple``, ``set``, ``frozenset`` and ``dict`` (a subclass is not
plain data: its ``__eq__`` could say anything), nested at most ``PLAIN_DEPTH`` deep.
`decode_plain` builds such values from JSON it does not trust: whatever the other side sent,
what comes out is made of those exact types, compared by their own ``__eq__``.

JSON lists are lists; every other container is a one-key object naming its type
(``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"bytes": "<base64>"}``).
Integers keep Python's default limit of 4,300 digits: a longer one is refused, not parsed.
"""

import base64 as _plain_b64
import json as _plain_json

PLAIN_DEPTH = 100


class PlainDataError(ValueError):
    """A value that is not plain data, or JSON that does not describe plain data."""


def _plain_name(kind):
    base = next((b.__name__ for b in kind.__mro__[1:] if b.__module__ == "builtins" and b is not object), None)
    name = getattr(kind, "__qualname__", None) or "object"
    return f"{name} (a subclass of {base})" if base else str(name)


def encode_plain(value, depth=0):
    """`value` as JSON-ready data; `PlainDataError` for anything that is not plain data."""
    if depth > PLAIN_DEPTH:
        raise PlainDataError(f"nested deeper than {PLAIN_DEPTH}")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if kind is list:
        return [encode_plain(item, depth + 1) for item in value]
    if kind is tuple or kind is set or kind is frozenset:
        return {kind.__name__: [encode_plain(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode_plain(k, depth + 1), encode_plain(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": _plain_b64.b64encode(value).decode()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    raise PlainDataError(f"a {_plain_name(kind)} is not plain data")


def _decode_items(body, depth):
    if type(body) is not list:
        raise PlainDataError("a container's items must be a JSON list")
    return [decode_plain(item, depth + 1) for item in body]


def decode_plain(data, depth=0):
    """The plain value `data` (parsed JSON) describes; `PlainDataError` when it describes none."""
    if depth > PLAIN_DEPTH:
        raise PlainDataError(f"nested deeper than {PLAIN_DEPTH}")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is list:
        return _decode_items(data, depth)
    if kind is not dict or len(data) != 1:
        raise PlainDataError("a JSON object must name one type")
    (tag, body), = data.items()
    try:
        if tag == "tuple":
            return tuple(_decode_items(body, depth))
        if tag == "set":
            return set(_decode_items(body, depth))
        if tag == "frozenset":
            return frozenset(_decode_items(body, depth))
        if tag == "dict":
            pairs = _decode_items(body, depth)
            if any(type(pair) is not list or len(pair) != 2 for pair in pairs):
                raise PlainDataError("a dict's items must be [key, value] pairs")
            return {key: value for key, value in pairs}
        if tag == "bytes" and type(body) is str:
            return _plain_b64.b64decode(body.encode("ascii"), validate=True)
        if tag == "complex" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
            return complex(body[0], body[1])
    except (TypeError, ValueError) as exc:  # an unhashable key or item, bad base64
        raise PlainDataError(f"bad {tag}: {exc}") from None
    raise PlainDataError(f"unknown or malformed type {tag!r}")


def dumps_plain(value):
    """One line of ASCII JSON for the plain `value`."""
    return _plain_json.dumps(encode_plain(value), separators=(",", ":"))


def loads_plain(text):
    """The plain value a line of JSON describes; `PlainDataError` for anything else."""
    try:
        data = _plain_json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PlainDataError(f"not JSON: {str(exc)[:200]}") from None
    return decode_plain(data)


def open_channel():
    """This process's stdin and stdout as its private channel (binary files on duplicates of
    fds 0 and 1); fds 0, 1 and 2 then point at /dev/null, so what the code run here prints
    or reads never mixes with the channel."""
    import os as _os
    import sys as _sys

    fd_in, fd_out = _os.dup(0), _os.dup(1)
    null = _os.open(_os.devnull, _os.O_RDWR)
    for fd in (0, 1, 2):
        _os.dup2(null, fd)
    _os.close(null)
    _sys.stdin = open(_os.devnull, "r")
    _sys.stdout = _sys.stderr = open(_os.devnull, "w")
    return _os.fdopen(fd_in, "rb"), _os.fdopen(fd_out, "wb")
