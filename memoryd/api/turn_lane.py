"""`POST /v1/context` answered without FastAPI's routing, for the requests it would accept.

Every turn went through the router, the dependency solver, body validation through a field
and the response model's validation again: under load about a sixth of a worker's busy time,
against a quarter for the turn's own Python (BENCHMARKS.md, API under load). The lane answers
a request the framework would accept, with the same answer: the body read once,
the bearer token looked up as `HTTPBearer` parses it, the JSON validated as `ContextRequest`
in the mode FastAPI uses, the turn run by the endpoint's own `serve`, the model written as
JSON. Anything else (no or unknown token, a body that does not validate, a content type
other than `application/json`, another route) goes on to the application with the body
replayed, so every refusal is still the framework's own answer.

It sits inside the application's middleware: a failure reaches the server-error handler, and
the latency histogram labels the turn with its route, which the lane puts in the scope as the
router would.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Awaitable, Callable

from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memoryd.api.auth import TokenTable
from memoryd.api.models import ContextRequest, ContextResponse
from store.errors import DatabaseUnavailable

PATH = "/v1/context"

Serve = Callable[[str, ContextRequest], Awaitable[ContextResponse]]


class TurnLane:
    def __init__(
        self,
        app: ASGIApp,
        *,
        serve: Serve,
        tokens: TokenTable,
        route: BaseRoute,
        database_down: Callable[[DatabaseUnavailable], Response],
    ) -> None:
        self._app = app
        self._serve = serve
        self._tokens = tokens
        self._route = route
        self._database_down = database_down

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self._app(scope, receive, send)
            return
        body = await _whole_body(receive)
        if body is None:
            return  # the client went away before it sent the request
        accepted = self._accepted(scope, body)
        if accepted is None:
            await self._app(scope, _replaying(body, receive), send)
            return
        org, request = accepted
        scope["route"] = self._route
        try:
            answer = await self._serve(org, request)
        except DatabaseUnavailable as e:
            await self._database_down(e)(scope, receive, send)
            return
        payload = answer.__pydantic_serializer__.to_json(answer)
        await Response(payload, media_type="application/json")(scope, receive, send)

    def _accepted(self, scope: Scope, body: bytes) -> tuple[str, ContextRequest] | None:
        """(organization, request) when the framework would run the endpoint with them."""
        headers = Headers(scope=scope)
        content_type = headers.get("content-type")
        authorization = headers.get("authorization")
        if not body or content_type is None or not authorization:
            return None
        parsed = email.message.Message()
        parsed["content-type"] = content_type
        if parsed.get_content_type() != "application/json":
            return None
        scheme, credentials = get_authorization_scheme_param(authorization)  # as `HTTPBearer`
        if not scheme or not credentials or scheme.lower() != "bearer":
            return None
        org = self._tokens.organization(credentials)
        if org is None:
            return None
        try:
            # FastAPI's order: `json.loads`, then the model validated in Python mode.
            request = ContextRequest.model_validate(json.loads(body))
        # JSONDecodeError and UnicodeDecodeError are ValueErrors; nesting too deep for the
        # parser is a RecursionError: the framework answers each (400 or 422).
        except (ValueError, RecursionError, ValidationError):
            return None
        return org, request


async def _whole_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` for the application: the body already read, then the connection's own."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
