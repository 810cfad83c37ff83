"""Request size limit (pure ASGI middleware): a body above ``max_bytes`` is answered 413 at once when its
``Content-Length`` says so, and otherwise as soon as the bytes received pass the limit (chunked uploads),
before the application reads or parses it."""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def _refuse(self, send: Any, got: str) -> None:
        body = json.dumps({"detail": f"request body too large: {got}, the limit is {self.max_bytes} bytes "
                                     "(PIPEPLAN_MAX_BODY_BYTES)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.max_bytes <= 0:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    n = 0
                if n > self.max_bytes:
                    await self._refuse(send, f"{n} bytes")
                    return
        seen = 0
        over = started = False

        async def limited_receive() -> Any:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:  # the application sees a client that went away, and stops reading
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def tracking_send(msg: Any) -> None:
            nonlocal started
            if over:
                return
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(send, f"more than {self.max_bytes} bytes")
