"""A request body over the limit is refused with 413 before the application parses it, whether
its size is declared (Content-Length) or it comes in chunks."""

from __future__ import annotations

from collections.abc import Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from memoryd.api.body_limit import BodyLimit

LIMIT = 1024


def app() -> tuple[Starlette, list[int]]:
    read: list[int] = []

    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        read.append(len(body))
        return JSONResponse({"bytes": len(body)})

    application = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    application.add_middleware(BodyLimit, max_bytes=LIMIT)
    return application, read


def chunks(n: int, size: int = 256) -> Iterator[bytes]:
    for _ in range(n):
        yield b"x" * size


def test_a_body_within_the_limit_reaches_the_application() -> None:
    application, read = app()
    with TestClient(application) as client:
        response = client.post("/echo", content=b"x" * LIMIT)
        chunked = client.post("/echo", content=chunks(4))
    assert (response.status_code, response.json()) == (200, {"bytes": LIMIT})
    assert (chunked.status_code, chunked.json()) == (200, {"bytes": LIMIT})
    assert read == [LIMIT, LIMIT]


def test_a_declared_body_over_the_limit_is_refused_unread() -> None:
    application, read = app()
    with TestClient(application) as client:
        response = client.post("/echo", content=b"x" * (LIMIT + 1))
    assert response.status_code == 413
    assert response.json() == {"detail": f"the request body is over {LIMIT} bytes"}
    assert read == []


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives() -> None:
    application, read = app()
    with TestClient(application) as client:
        response = client.post("/echo", content=chunks(5))
    assert response.status_code == 413
    assert read == []  # the application was told the client went away, and answered nothing
