"""Name registries for local environments and schedulers, and plugin loading.

ms-swift's convention, kept as is: a plugin file registers its classes on import,

    from envsdk.registry import envs
    envs["my_env"] = MyEnv

and is loaded with ``--external-plugins path/to/plugin.py`` (`load_plugins`). Built-ins are
registered by import path and loaded on first lookup, so ``envs["frozen_lake"]`` works without
importing `envsdk.envs` first and `import envsdk.registry` stays cheap.

An installed package registers its envs (or schedulers) without any plugin flag through an
entry point in the ``envsdk.envs`` (``envsdk.schedulers``) group, in its ``pyproject.toml``::

    [project.entry-points."envsdk.envs"]
    my_env = "my_package.env:MyEnv"

Entry points are read on the first lookup of a name that is not registered otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterable, Iterator, MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from envsdk.errors import EnvNotFoundError, EnvSDKError

__all__ = [
    "Registry", "PluginLoadError", "envs", "schedulers", "load_plugins", "import_spec",
]

T = TypeVar("T")


class PluginLoadError(EnvSDKError):
    """A plugin file is missing, or raised while it was imported (the cause is chained)."""


def import_spec(spec: str) -> Any:
    """The object named by ``"package.module:attr"`` or ``"path/to/file.py:attr"`` (dots after
    ':' walk attributes); a module is looked up on ``sys.path`` (the ``envsdk`` command puts the
    current folder first, as ``python -m`` does). Raises `ImportError` (one line
    naming what is missing) or `PluginLoadError` (a file that raised while imported)."""
    module_part, sep, attribute = spec.rpartition(":")
    if not sep or not module_part or not attribute:
        raise ImportError(f"expected 'module:attribute' or 'file.py:attribute', got {spec!r}")
    module: Any
    if module_part.endswith(".py") or "/" in module_part or "\\" in module_part:
        module = load_plugin(Path(module_part))
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_part.startswith(exc.name):
                raise ImportError(
                    f"cannot import {module_part!r}: no module named {exc.name!r} in {Path.cwd()} or on"
                    " the Python path (run from the folder that holds it, or name the file: path/to/file.py:Name)"
                ) from None
            raise ImportError(f"cannot import {module_part!r}: {exc}", name=exc.name) from None
        except ImportError:
            raise
        except Exception as exc:  # the module raised while imported (a syntax error, its own code)
            raise PluginLoadError(
                f"module {module_part!r} raised while being imported: {type(exc).__name__}: {' '.join(str(exc).split())}"
            ) from exc
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{module_part} has no attribute {attribute!r}") from None
    return obj


class Registry(MutableMapping[str, T], Generic[T]):
    """A name -> class mapping whose failed lookups say which names exist.

    `builtins` maps names to ``"module:attribute"`` import paths resolved on first lookup; an
    explicit assignment of the same name wins over a built-in. Names from the entry-point group
    `entry_points` (read once, when a name is first missed or the names are listed) come last.
    """

    def __init__(self, kind: str, builtins: dict[str, str] | None = None, entry_points: str | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = dict(builtins or {})
        self._group = entry_points

    def _read_entry_points(self) -> None:
        group, self._group = self._group, None
        if group is None:
            return
        for point in importlib.metadata.entry_points(group=group):
            if point.name not in self._items and point.name not in self._lazy:
                self._lazy[point.name] = point.value

    def __getitem__(self, name: str) -> T:
        if name not in self._items and name not in self._lazy:
            self._read_entry_points()
        if name in self._items:
            return self._items[name]
        if name in self._lazy:
            value: T = import_spec(self._lazy.pop(name))
            self._items[name] = value
            return value
        known = ", ".join(sorted(self)) or "none"
        raise EnvNotFoundError(
            f"no {self.kind} named {name!r} is registered; known {self.kind}s: {known}."
            f" Register one with `{self.kind}s[name] = Class` in a plugin file loaded by"
            " --external-plugins."
        )

    def __setitem__(self, name: str, value: T) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} names must be non-empty strings, got {name!r}")
        self._lazy.pop(name, None)
        self._items[name] = value

    def __delitem__(self, name: str) -> None:
        if name in self._items:
            del self._items[name]
        elif name in self._lazy:
            del self._lazy[name]
        else:
            raise EnvNotFoundError(f"no {self.kind} named {name!r} is registered")

    def __iter__(self) -> Iterator[str]:
        self._read_entry_points()
        return iter([*self._items, *(n for n in self._lazy if n not in self._items)])

    def __len__(self) -> int:
        self._read_entry_points()
        return len(self._items) + sum(1 for n in self._lazy if n not in self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items and name not in self._lazy:
            self._read_entry_points()
        return name in self._items or name in self._lazy

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={sorted(self)})"


#: Local environments (`envsdk.env.Env` subclasses) by name.
envs: Registry[Any] = Registry(
    "env",
    builtins={
        "frozen_lake": "envsdk.envs.frozen_lake:FrozenLakeEnv",
        # Any remote server as an Env: rows say {"name": "remote", "base_url": ...}.
        "remote": "envsdk.adapters:RemoteEnv",
    },
    entry_points="envsdk.envs",
)
#: Multi-turn schedulers by name.
schedulers: Registry[Any] = Registry(
    "scheduler",
    builtins={
        "gym": "envsdk.schedulers.gym:GYMScheduler",
        "openenv": "envsdk.schedulers.openenv:OpenEnvScheduler",
        "sudoku": "envsdk.schedulers.sudoku:SudokuScheduler",
        "tools": "envsdk.schedulers.tools:ToolScheduler",
        "coding": "envsdk.schedulers.coding:CodingScheduler",
    },
    entry_points="envsdk.schedulers",
)


def _module_name_for(path: Path) -> str:
    # Unique per file, so two plugins that share a file name never replace each other, and
    # stable, so loading the same file twice finds the first import in sys.modules.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    stem = "".join(ch if ch.isalnum() else "_" for ch in path.stem)
    return f"envsdk_plugin_{stem}_{digest}"


def load_plugin(path: str | Path) -> ModuleType:
    """Import one plugin file by path; registrations it makes on import take effect.

    A file already loaded is not run again. Raises `PluginLoadError` when the file is missing or
    its import raises (the original exception is the cause).
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise PluginLoadError(f"plugin file not found: {path} (resolved to {resolved})")
    name = _module_name_for(resolved)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise PluginLoadError(f"cannot import {resolved}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    # Registered before execution so that the plugin's own dataclasses/pickling can find it.
    sys.modules[name] = module
    # Its folder first on the path while it runs, as `python file.py` has it: a plugin imports
    # the modules beside it whatever folder the command runs in.
    folder = str(resolved.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not ours to wrap
            raise
        raise PluginLoadError(
            f"plugin {resolved} raised while being imported: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        with contextlib.suppress(ValueError):  # the plugin took it off itself
            sys.path.remove(folder)
    return module


def load_plugins(paths: Iterable[str | Path] | str | Path | None) -> list[ModuleType]:
    """Import every plugin file in `paths` in order (see `load_plugin`); ``None`` loads nothing."""
    if paths is None:
        return []
    if isinstance(paths, (str, Path)):
        paths = [paths]
    return [load_plugin(p) for p in paths]
