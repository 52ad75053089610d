"""`OpenEnvWrapper`: a blocking facade over `EnvClient`, for code that is not async.

Meant to be called from worker threads (``asyncio.to_thread``, a thread pool). Every wrapper
in the process shares ONE background event-loop thread (daemon, started on first use): a
wrapper costs a socket, never a thread, so a thousand wrappers still add one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel

from envsdk.client.client import EnvClient, ServerKind
from envsdk.errors import EnvTimeoutError
from envsdk.tools import ToolSpec
from envsdk.types import StepResult

__all__ = ["OpenEnvWrapper", "background_loop"]

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_thread: threading.Thread | None = None
_loop_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process-wide event loop all wrappers run on, started lazily in one daemon thread."""
    global _loop, _loop_thread
    with _loop_lock:
        if _loop is None or _loop_thread is None or not _loop_thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=run, name="envsdk-client-loop", daemon=True)
            thread.start()
            ready.wait()
            _loop, _loop_thread = loop, thread
        return _loop


class OpenEnvWrapper:
    """Blocking client of one session: ``reset``, ``step``, ``state``, ``close`` and a context
    manager, with `EnvClient`'s keyword arguments (timeouts, keepalive, retry, resume, …).

    ``call_timeout`` bounds each blocking call (None: rely on the client's own timeouts,
    which already bound every wait); a call that runs past it is cancelled and raises
    `EnvTimeoutError`. Calling a wrapper from the background loop's own thread (i.e. from a
    coroutine on it) is refused, as it would deadlock.
    """

    def __init__(self, base_url: str, *, call_timeout: float | None = None, **client_kwargs: Any) -> None:
        if call_timeout is not None and not (isinstance(call_timeout, (int, float)) and call_timeout > 0):
            # 0 or less timed out every call, after the call had already been sent.
            raise ValueError(f"call_timeout must be a number of seconds > 0 (or None), got {call_timeout!r}")
        self.call_timeout = call_timeout
        self._loop = background_loop()
        self._client = EnvClient(base_url, **client_kwargs)

    @property
    def client(self) -> EnvClient:
        """The async client underneath (runs on the shared background loop)."""
        return self._client

    @property
    def session_id(self) -> str | None:
        return self._client.session_id

    @property
    def server_kind(self) -> ServerKind | None:
        return self._client.server_kind

    @property
    def resumable(self) -> bool:
        return self._client.resumable

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is _loop_thread:
            coro.close()
            raise RuntimeError("OpenEnvWrapper was called from its own event loop; use EnvClient there")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.call_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise EnvTimeoutError(
                f"The call did not finish within call_timeout={self.call_timeout} s",
                "TIMEOUT",
                {"timeout_s": self.call_timeout, "source": "client"},
            ) from None

    def connect(self) -> OpenEnvWrapper:
        self._run(self._client.connect())
        return self

    def reset(self, **kwargs: Any) -> StepResult[Any]:
        return self._run(self._client.reset(**kwargs))

    def step(self, action: Mapping[str, Any] | BaseModel) -> StepResult[Any]:
        return self._run(self._client.step(action))

    def state(self) -> dict[str, Any]:
        return self._run(self._client.state())

    def list_tools(self) -> list[ToolSpec]:
        return self._run(self._client.list_tools())

    def call_tool(self, name: str, /, **arguments: Any) -> Any:
        return self._run(self._client.call_tool(name, **arguments))

    def close(self) -> None:
        self._run(self._client.close())

    def __enter__(self) -> OpenEnvWrapper:
        return self.connect()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
