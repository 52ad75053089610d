"""`Rubric`: a reward computed from an action and the observation it led to.

The API is OpenEnv 0.10's (``openenv.core.rubrics.Rubric``), attribute for attribute, so that
rubrics of either package nest in containers of the other and every function of
`envsdk.rewards` takes both: ``forward(action, observation)`` (sync or ``async def``), calling
the rubric runs the pre-forward hooks, ``forward`` and the forward hooks and stores the result in
``last_score``; a rubric assigned as an attribute becomes a named child (``named_rubrics()``,
``get_rubric("a.b")``); ``reset()``, ``state_dict()`` and ``load_state_dict()``.

A sync ``forward`` may hand back a coroutine (a container whose child is async): calling the
rubric then returns a coroutine too, which stores the score when awaited. Hooks run as in
OpenEnv: the pre-forward hooks up to the first ``async def`` one run before ``forward``; the rest
are awaited once the call has turned out to be async, before the children's results are
awaited. A coroutine-function hook on a call that stays synchronous raises `TypeError` (OpenEnv
creates the coroutine and drops it, so the hook silently never runs).
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

__all__ = ["Rubric", "is_rubric", "ForwardHook", "ForwardPreHook"]

ForwardHook = Callable[[Any, Any, Any, float], Any]
ForwardPreHook = Callable[[Any, Any, Any], Any]


class Rubric(abc.ABC):
    """Base class of a reward: subclasses implement ``forward(action, observation) -> float``.

    Hooks: ``register_forward_pre_hook(hook)`` — ``hook(rubric, action, observation)`` before
    ``forward``; ``register_forward_hook(hook)`` — ``hook(rubric, action, observation, score)``
    after it. Async hooks are awaited on the async path (an ``async def forward``, or a sync
    one that hands back a coroutine); on a call that stays synchronous a coroutine-function
    hook raises `TypeError` (there is nothing to await it with).
    """

    # The attribute names are OpenEnv's: its containers and `get_rubric` read them directly.
    _rubric_children: dict[str, Any]
    _forward_hooks: list[ForwardHook]
    _forward_pre_hooks: list[ForwardPreHook]
    last_score: float | None

    def __init__(self) -> None:
        object.__setattr__(self, "_rubric_children", {})
        object.__setattr__(self, "_forward_hooks", [])
        object.__setattr__(self, "_forward_pre_hooks", [])
        object.__setattr__(self, "last_score", None)

    def __setattr__(self, name: str, value: Any) -> None:
        if is_rubric(value):
            self._rubric_children[name] = value
        object.__setattr__(self, name, value)

    # ------------------------------------------------------------ evaluation

    @abc.abstractmethod
    def forward(self, action: Any, observation: Any) -> Any:
        """The reward for `action` and the `observation` it led to (a float; or a coroutine
        giving one, for an ``async def forward``)."""

    def __call__(self, action: Any, observation: Any) -> Any:
        if inspect.iscoroutinefunction(self.forward):
            return self._call_async(action, observation)
        # Whether the call is async shows only once forward has called the children, but the
        # pre-hooks come first: those before the first async one run now, the rest once the
        # call turns out to be async (OpenEnv's order).
        ran = self._run_leading_sync_pre_hooks(action, observation)
        result = self.forward(action, observation)
        if inspect.isawaitable(result):
            return self._finish_awaited(action, observation, result, ran)
        self._run_pre_hooks(action, observation, start=ran)
        return self._finish(action, observation, float(result))

    async def _call_async(self, action: Any, observation: Any) -> float:
        await self._run_pre_hooks_async(action, observation)
        result = await self.forward(action, observation)
        return await self._finish_async(action, observation, float(result))

    async def _finish_awaited(self, action: Any, observation: Any, pending: Awaitable[Any], ran: int) -> float:
        await self._run_pre_hooks_async(action, observation, start=ran)
        return await self._finish_async(action, observation, float(await pending))

    def _run_leading_sync_pre_hooks(self, action: Any, observation: Any) -> int:
        """Run the pre-hooks before the first ``async def`` one; return how many ran."""
        ran = 0
        for hook in self._forward_pre_hooks:
            if inspect.iscoroutinefunction(hook):
                break
            _sync_hook_result(hook(self, action, observation), hook)
            ran += 1
        return ran

    def _run_pre_hooks(self, action: Any, observation: Any, start: int = 0) -> None:
        for hook in self._forward_pre_hooks[start:]:
            _sync_hook_result(hook(self, action, observation), hook)

    async def _run_pre_hooks_async(self, action: Any, observation: Any, start: int = 0) -> None:
        for hook in self._forward_pre_hooks[start:]:
            result = hook(self, action, observation)
            if inspect.isawaitable(result):
                await result

    def _finish(self, action: Any, observation: Any, score: float) -> float:
        self.last_score = score
        for hook in self._forward_hooks:
            _sync_hook_result(hook(self, action, observation, score), hook)
        return score

    async def _finish_async(self, action: Any, observation: Any, score: float) -> float:
        self.last_score = score
        for hook in self._forward_hooks:
            result = hook(self, action, observation, score)
            if inspect.isawaitable(result):
                await result
        return score

    # ------------------------------------------------------------ hooks

    def register_forward_hook(self, hook: ForwardHook) -> None:
        """Call ``hook(rubric, action, observation, score)`` after every forward."""
        self._forward_hooks.append(hook)

    def register_forward_pre_hook(self, hook: ForwardPreHook) -> None:
        """Call ``hook(rubric, action, observation)`` before every forward."""
        self._forward_pre_hooks.append(hook)

    # ------------------------------------------------------------ children

    def children(self) -> Iterator[Any]:
        """The immediate child rubrics."""
        yield from self._rubric_children.values()

    def named_children(self) -> Iterator[tuple[str, Any]]:
        """The immediate child rubrics with their attribute names."""
        yield from self._rubric_children.items()

    def rubrics(self) -> Iterator[Any]:
        """Every descendant rubric, depth first."""
        for _, child in self.named_rubrics():
            yield child

    def named_rubrics(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Every descendant rubric with its dotted path (``"code.syntax"``), depth first."""
        for name, child in self._rubric_children.items():
            path = f"{prefix}.{name}" if prefix else name
            yield path, child
            yield from child.named_rubrics(path)

    def get_rubric(self, path: str) -> Any:
        """The descendant at a dotted `path`; `KeyError` if there is none."""
        current: Any = self
        for part in path.split("."):
            if part not in current._rubric_children:
                raise KeyError(f"Rubric path not found: {path}")
            current = current._rubric_children[part]
        return current

    # ------------------------------------------------------------ state

    def reset(self) -> None:
        """Clear per-episode state (an environment calls it on reset). Default: nothing."""

    def state_dict(self) -> dict[str, Any]:
        """The rubric's configuration, for checkpoints. Default: empty."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned. Default: nothing."""


def is_rubric(value: Any) -> bool:
    """Whether `value` is a rubric of either package: an envsdk `Rubric`, or an object with
    OpenEnv's ``forward``, ``named_rubrics`` and ``_rubric_children`` (``openenv.core.rubrics``)."""
    if isinstance(value, Rubric):
        return True
    if isinstance(value, type):
        return False
    return callable(getattr(value, "forward", None)) and callable(getattr(value, "named_rubrics", None)) and isinstance(
        getattr(value, "_rubric_children", None), dict
    )


def _sync_hook_result(result: Any, hook: Any) -> None:
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()
        raise TypeError(f"hook {hook!r} is async but the rubric was called synchronously; use an async forward")
