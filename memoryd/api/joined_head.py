"""A response's head and its body in one send.

uvicorn writes a response's head when the application starts the response and its body when
the application sends it: two sends on the socket, and on loopback two deliveries to the
client, for every turn. The transport here holds a head back until the write that follows
it (the body, which starlette sends in the same step of the coroutine, with nothing awaited
in between) and sends the two together. A head with nothing after it in that step (a `100
Continue`, a response whose body comes later) goes out on the loop's next turn, before any
other write of the connection.

An earlier try joined every write of a loop turn, waiting for the next turn each time, and
was slower (BENCHMARKS.md, "The client's share, ..."): here nothing waits when a body follows.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD = b"HTTP/"


class HeadJoiningTransport(asyncio.Transport):
    """`transport`, with a response head held until the next write (or the loop's next turn)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            data, self._held = self._held + bytes(data), None
        elif bytes(data[: len(_HEAD)]) == _HEAD:
            self._held = bytes(data)
            self._loop.call_soon(self._release)
            return
        self._transport.write(data)

    def _release(self) -> None:
        """Send a head no write followed in its step; the connection may have closed since."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        held = 0 if self._held is None else len(self._held)
        return self._transport.get_write_buffer_size() + held

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self._release()
        self._transport.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class JoinedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `HeadJoiningTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadJoiningTransport(transport, self.loop))
