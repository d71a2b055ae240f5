"""Writes taken off the hot path: a bounded queue drained in batches by one worker thread.

`submit` never blocks: when the queue is full the item is dropped and counted, because a
chat turn must not wait for its own audit row. The worker starts on the first submit and
exits after it has been idle a while, so a short-lived service leaves no thread behind;
`close` writes what is queued and stops it. A failed batch is retried with bounded backoff
on `StoreError` (Postgres away, a deadlock); after the last attempt it is dropped and counted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from pydantic import BaseModel, Field

from domain.retry import Backoff
from store.errors import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")


class WriterSettings(BaseModel):
    """A background writer's tuning (`MEMORYD_READ_PATH__WRITER__...`)."""

    max_queue: int = Field(default=10_000, ge=1)
    max_batch: int = Field(default=500, ge=1)
    max_delay_s: float = Field(default=0.2, gt=0)  # how long a batch waits to fill up
    idle_exit_s: float = Field(default=5.0, gt=0)
    attempts: int = Field(default=4, ge=1)
    backoff_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=2.0, gt=0)

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.backoff_s, self.backoff_max_s)


class BatchWriter(Generic[T]):
    def __init__(
        self,
        name: str,
        write: Callable[[Sequence[T]], None],
        settings: WriterSettings | None = None,
        *,
        on_dropped: Callable[[str, str, int], None] | None = None,
        on_written: Callable[[str, int], None] | None = None,
    ) -> None:
        self.name = name
        self._write = write
        self._settings = settings or WriterSettings()
        self._on_dropped = on_dropped
        self._on_written = on_written
        self._queue: queue.Queue[T] = queue.Queue(maxsize=self._settings.max_queue)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._pending = 0  # submitted, not yet written or dropped
        self._closed = False

    def submit(self, item: T) -> bool:
        """Queue an item; False (and counted) when the queue is full or the writer closed."""
        with self._lock:
            if self._closed:
                accepted = False
            else:
                try:
                    self._queue.put_nowait(item)
                    accepted = True
                    self._pending += 1
                    if self._thread is None:
                        self._thread = threading.Thread(
                            target=self._run, name=f"writer-{self.name}", daemon=True
                        )
                        self._thread.start()
                except queue.Full:
                    accepted = False
        if not accepted:
            self._dropped(1, "queue full" if not self._closed else "writer closed")
        return accepted

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
        """Refuse new items, write the queued ones, and stop the worker."""
        with self._lock:
            self._closed = True
        self.flush(timeout_s)
        with self._lock:
            thread = self._thread
        if thread is not None:
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
            batch = [first, *self._more(s)]
            self._write_with_retries(batch)
            with self._settled:
                self._pending -= len(batch)
                self._settled.notify_all()

    def _more(self, s: WriterSettings) -> list[T]:
        items: list[T] = []
        deadline = time.monotonic() + (0 if self._closed else s.max_delay_s)
        while len(items) < s.max_batch - 1:
            try:
                items.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return items

    def _write_with_retries(self, batch: list[T]) -> None:
        s = self._settings
        for attempt in range(1, s.attempts + 1):
            try:
                self._write(batch)
            except StoreError as e:
                if attempt == s.attempts:
                    log.error(
                        "%s: dropping %d item(s) after %d attempts: %s",
                        self.name,
                        len(batch),
                        attempt,
                        e,
                    )
                    self._dropped(len(batch), "write failed")
                    return
                time.sleep(s.backoff.delay(attempt - 1))
            else:
                if self._on_written is not None:
                    self._on_written(self.name, len(batch))
                return

    def _dropped(self, n: int, reason: str) -> None:
        if self._on_dropped is not None:
            self._on_dropped(self.name, reason, n)
        if reason != "write failed":
            log.warning("%s: dropped %d item(s): %s", self.name, n, reason)
