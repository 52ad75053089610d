"""`BodyLimit`: the HTTP request-body limit of an envsdk server (``ServerConfig.max_body_bytes``).

Without it one ``POST /reset`` of 400 MiB costs the server over a gigabyte while it is read and
parsed. A body declared larger than the limit (``Content-Length``) is refused with 413 before a
byte of it is read; a body sent without a length (chunked) is counted as it arrives and refused
with 413 as soon as it passes the limit: the app is told the client left, and the rest is never
read (uvicorn closes the connection after the response).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from envsdk.protocol import dumps

__all__ = ["BodyLimit"]

_Message = MutableMapping[str, Any]
_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


class BodyLimit:
    """ASGI middleware refusing HTTP bodies over `max_bytes` with 413 (see the module docstring).

    The 413 body is ``{"detail": {"message", "code": "FRAME_TOO_LARGE", "limit"}}``.
    """

    def __init__(self, app: _ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                if not value.strip().isdigit() or int(value) > self.max_bytes:
                    await self._refuse(send, value.decode("latin-1"))
                    return
        received = 0
        refused = False

        async def limited_receive() -> _Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    await self._refuse(send, f"more than {self.max_bytes}")
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: _Message) -> None:
            if not refused:  # else the 413 already is the response
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, send: _Send, size: str) -> None:
        body = dumps({"detail": {
            "message": f"Request body of {size} bytes exceeds the limit of {self.max_bytes} bytes "
            "(ServerConfig.max_body_bytes, ENVSDK_MAX_BODY_BYTES)",
            "code": "FRAME_TOO_LARGE",
            "limit": self.max_bytes,
        }}).encode()
        await send({
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": body})
