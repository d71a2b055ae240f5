"""A request body over a size is refused (413) before anything parses it.

Neither FastAPI nor uvicorn bounds a body: the turn lane and the framework read it whole, and
only then do the models' limits (500 events, 8,000 characters a field) apply. A body's size is
checked against its Content-Length before it is read, and counted as it arrives when it comes
in chunks. The outermost middleware: nothing inside it sees more than the limit.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max:
            await self._refuse(send)
            return
        seen = 0
        over = started = False

        async def counted() -> Message:
            # Past the limit the application is told the client went away, and whatever it
            # answers to that is replaced by the 413 (unless it had answered already).
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not started:
                seen += len(message.get("body", b""))
                if seen > self._max:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def unless_over(message: Message) -> None:
            nonlocal started
            if not over:
                started = started or message["type"] == "http.response.start"
                await send(message)

        try:
            await self._app(scope, counted, unless_over)
        except Exception:
            if not over:
                raise
        if over:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": f"the request body is over {self._max} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
