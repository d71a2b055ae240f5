"""Spreading connections evenly over the API's worker processes.

Workers accepting on one shared socket take connections in whatever order the kernel wakes
them, and a client's pool of keep-alive connections stays where it landed. A worker's latency
grows with the connections it serves: with 16 clients split 9/7, bench.api measured 74 ms a
request on the nine and 61 ms on the seven, and the p99 is the busier worker's.

Each worker publishes how many connections it holds in an array shared by the workers. All of
them wake when a connection is pending; one holding more than the least loaded defers up to
`defer_s` for that one to take it, then takes it itself if it is still there: a stuck or dead
sibling never leaves a connection waiting longer than that. A deferring worker looks again
every `POLL_S`: once the connection is gone it goes back to waiting, so it never wakes from an
old deferral and takes a later connection without weighing the loads again (that let one worker
run two ahead: 9/7 in CI).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import select
import socket
from collections.abc import MutableSequence
from dataclasses import dataclass

import uvicorn

log = logging.getLogger(__name__)

DEFER_S = 0.002
POLL_S = 0.0005
# As asyncio's own accept loop: out of descriptors or buffers, wait and accept again, while
# the connections held close and free some.
ACCEPT_RETRY_S = 1.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True)
class SharedListener:
    """What a worker needs to take its share: the listening socket, every worker's count of
    open connections (shared memory), and which of them is its own."""

    sock: socket.socket
    loads: MutableSequence[int]
    index: int


class BalancedServer(uvicorn.Server):
    """uvicorn serving the connections this worker accepts from a `SharedListener`."""

    def __init__(
        self, config: uvicorn.Config, listener: SharedListener, defer_s: float = DEFER_S
    ) -> None:
        super().__init__(config)
        self._listener = listener
        self._defer_s = defer_s
        self._opening = 0  # accepted, not yet in uvicorn's connections
        self._accepting: asyncio.Task[None] | None = None
        self._connecting: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # No listener of uvicorn's own: the connections come from `_accept`. Each worker calls
        # listen, as uvicorn's own would on a shared socket (again is harmless).
        self._listener.sock.listen(self.config.backlog)
        await super().startup(sockets=[])
        self._accepting = asyncio.get_running_loop().create_task(self._accept())
        self._accepting.add_done_callback(self._accept_ended)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.wait([self._accepting])  # a failure of it is `_accept_ended`'s
        self._listener.sock.close()
        await super().shutdown(sockets=[])

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        sock = self._listener.sock
        sock.setblocking(False)
        while True:
            await _readable(loop, sock)
            if not await self._my_turn(loop):
                continue  # a less loaded sibling took it
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue  # a sibling took it, or the client gave up before it was taken
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    raise
                log.error("cannot accept a connection, again in %.0fs: %s", ACCEPT_RETRY_S, e)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            conn.setblocking(False)
            self._opening += 1
            self._publish()
            task = loop.create_task(self._connect(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    def _accept_ended(self, task: asyncio.Task[None]) -> None:
        """A worker that no longer accepts must not go on as if it served: it stops, and the
        parent, seeing a worker end while the service was not stopping, stops the service."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("accepting connections failed; this worker stops", exc_info=task.exception())
        self.should_exit = True

    async def _my_turn(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether this worker takes the pending connection: it does when none holds fewer,
        or when the connection is still pending after `defer_s`."""
        deadline = loop.time() + self._defer_s
        while self._publish() > min(self._listener.loads):
            if loop.time() >= deadline:
                return True
            await asyncio.sleep(POLL_S)
            if not _pending(self._listener.sock):
                return False
        return True

    async def _connect(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(self._protocol, conn)
        except OSError as e:  # the client went away before its transport was made
            log.debug("connection dropped before it was served: %s", e)
            conn.close()
        finally:
            self._opening -= 1

    def _protocol(self) -> asyncio.Protocol:
        # As uvicorn builds its own protocols (uvicorn.Server.startup).
        protocol: asyncio.Protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    def _publish(self) -> int:
        load = len(self.server_state.connections) + self._opening
        self._listener.loads[self._listener.index] = load
        return load


def _pending(sock: socket.socket) -> bool:
    poller = select.poll()  # not select.select: a worker's descriptors pass 1024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():  # the selector calls again until the reader is removed
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())
