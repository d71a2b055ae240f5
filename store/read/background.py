"""Writes taken off the hot path: a bounded queue drained in batches by one worker thread.

Nothing submitted is dropped while the process runs. A failed batch (Postgres away, a
deadlock, a privilege revoked) is retried with bounded backoff for as long as it fails, with a
warning in the log and the rows pending in `memoryd_background_pending`; meanwhile the queue
fills, and when it is full `submit` waits for room (back-pressure: reads slow down rather than
lose their audit rows and recall counts). The worker starts on the first submit and exits
after it has been idle a while, so a short-lived service leaves no thread behind.

`close` refuses new items and writes what is queued. If that cannot finish in its timeout
(Postgres away at shutdown), or the pool is already closed, the rows left are given up,
logged and counted as dropped at shutdown: a process that stops cannot hold them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from psycopg_pool import PoolClosed
from pydantic import BaseModel, ConfigDict, Field

from domain.retry import Backoff
from store.errors import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")
_ROOM_POLL_S = 0.005


class _Wake:
    """Queued by close(): a worker blocked waiting for items sees the close at once instead
    of after `idle_exit_s` (which held every service's close for seconds)."""


class WriterSettings(BaseModel):
    """A background writer's tuning (`MEMORYD_READ_PATH__WRITER__...`)."""

    model_config = ConfigDict(extra="forbid")

    max_queue: int = Field(default=10_000, ge=1)
    max_batch: int = Field(default=500, ge=1)
    max_delay_s: float = Field(default=0.2, gt=0)  # how long a batch waits to fill up
    idle_exit_s: float = Field(default=5.0, gt=0)
    backoff_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=2.0, gt=0)

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.backoff_s, self.backoff_max_s)


# Why a writer gives items up: it was closed before they were submitted, or the process
# stopped with them unwritten (the pool closed, or Postgres away past the close timeout).
WRITER_CLOSED = "writer closed"
SHUTDOWN = "shutdown"
DROP_REASONS = (WRITER_CLOSED, SHUTDOWN)


class BatchWriter(Generic[T]):
    def __init__(
        self,
        name: str,
        write: Callable[[Sequence[T]], None],
        settings: WriterSettings | None = None,
        *,
        on_dropped: Callable[[str, str, int], None] | None = None,
        on_written: Callable[[str, int], None] | None = None,
        on_pending: Callable[[str, int], None] | None = None,
    ) -> None:
        self.name = name
        self._write = write
        self._settings = settings or WriterSettings()
        self._on_dropped = on_dropped
        self._on_written = on_written
        self._on_pending = on_pending
        self._queue: queue.Queue[T | _Wake] = queue.Queue(maxsize=self._settings.max_queue)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._pending = 0  # submitted, not yet written or dropped
        self._closed = False
        self._closing = threading.Event()  # set by close(): a batch being gathered goes now
        self._given_up = False  # close() timed out: stop retrying, the process is stopping

    def submit(self, item: T) -> bool:
        """Queue an item, waiting for room while the queue is full; False (and counted) only
        when the writer is closed."""
        while True:
            with self._lock:
                if self._closed:
                    break
                try:
                    self._queue.put_nowait(item)
                except queue.Full:
                    self._ensure_worker()
                else:
                    self._pending += 1
                    self._ensure_worker()
                    self._report_pending()
                    break
            time.sleep(_ROOM_POLL_S)  # back-pressure: the worker frees room as it writes
        if self._closed:
            self._dropped(1, WRITER_CLOSED)
            return False
        return True

    def _ensure_worker(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"writer-{self.name}", daemon=True
            )
            self._thread.start()

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything submitted so far is written or dropped; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._settled:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settled.wait(left)
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new items, write the queued ones, and stop the worker; what cannot be written
        in `timeout_s` is given up (logged and counted)."""
        with self._lock:
            self._closed = True
        self._closing.set()
        if not self.flush(timeout_s):
            self._given_up = True
        with self._lock:
            thread = self._thread
        if thread is not None:
            try:
                self._queue.put_nowait(_Wake())
            except queue.Full:
                log.debug("writer %s: queue full at close, its worker is awake", self.name)
            thread.join(timeout_s)

    # -- the worker -----------------------------------------------------------------------

    def _run(self) -> None:
        s = self._settings
        while True:
            try:
                first = self._queue.get(timeout=0.05 if self._closed else s.idle_exit_s)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if isinstance(first, _Wake):
                continue
            batch = [first, *self._more(s)]
            self._write_until_done(batch)
            with self._settled:
                self._pending -= len(batch)
                self._report_pending()
                self._settled.notify_all()

    def _more(self, s: WriterSettings) -> list[T]:
        """The rest of a batch: what is queued once the batch delay is over (at once when a
        batch is already waiting or the writer is closing). One wake-up per batch, not one per
        item: a turn submits a recall per fact, and each wake-up of this thread took the GIL
        from the turns being served."""
        if self._queue.qsize() < s.max_batch - 1:
            self._closing.wait(s.max_delay_s)
        items: list[T] = []
        while len(items) < s.max_batch - 1:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, _Wake):
                items.append(item)
        return items

    def _write_until_done(self, batch: list[T]) -> None:
        backoff = self._settings.backoff
        failures = 0
        while True:
            try:
                self._write(batch)
            except StoreError as e:
                if _pool_closed(e) or (self._closed and self._given_up):
                    log.error(
                        "%s: %d item(s) not written at shutdown: %s", self.name, len(batch), e
                    )
                    self._dropped(len(batch), SHUTDOWN)
                    return
                wait = backoff.delay(failures)
                failures += 1
                log.warning(
                    "%s: degraded, writing %d item(s) failed (retry %d in %.1fs): %s",
                    self.name,
                    len(batch),
                    failures,
                    wait,
                    e,
                )
                time.sleep(wait)
            else:
                if failures:
                    log.info("%s: recovered after %d retries", self.name, failures)
                if self._on_written is not None:
                    self._on_written(self.name, len(batch))
                return

    def _report_pending(self) -> None:
        """Under the lock, as the count changes: reported after it, a submitter's 1 could
        land after the worker's 0, and the gauge would show a row pending that was written."""
        if self._on_pending is not None:
            self._on_pending(self.name, self._pending)

    def _dropped(self, n: int, reason: str) -> None:
        if self._on_dropped is not None:
            self._on_dropped(self.name, reason, n)
        if reason == WRITER_CLOSED:
            log.warning("%s: dropped %d item(s): %s", self.name, n, reason)


def _pool_closed(error: BaseException) -> bool:
    """The pool was closed under the writer: the process is stopping, Postgres is not away."""
    return isinstance(error.__cause__, PoolClosed)
