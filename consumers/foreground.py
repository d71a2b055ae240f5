"""Which of a processor's flushes are at work on the cores, so background writes can wait.

A flush spends most of its time waiting on the consolidation backend; before that call it
embeds its observations and searches (the candidates), after it it embeds the proposals and
writes the run. A batch's index write (embedding, a Chroma upsert) run in those stretches
shares the cores with them and makes the flush slower; run while a flush waits on the
backend it costs no flush anything. The index thread asks `wait_for_quiet` before a write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum


class Release(StrEnum):
    """What ended a wait for quiet."""

    BACKEND_WAIT = "backend_wait"  # a flush waits on its backend and none is at work
    BOUND = "bound"  # the whole bound passed
    CANCELLED = "cancelled"  # the waiter was told to stop waiting (shutting down)


class ForegroundWork:
    def __init__(self) -> None:
        self._working = 0
        self._waiting = 0
        self._changed = threading.Condition()

    @contextmanager
    def working(self) -> Iterator[None]:
        """A flush's stretch on the cores."""
        self._move(working=1)
        try:
            yield
        finally:
            self._move(working=-1)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Inside `working`: the flush's wait on its backend, off the cores."""
        self._move(working=-1, waiting=1)
        try:
            yield
        finally:
            self._move(working=1, waiting=-1)

    def wait_for_quiet(self, max_wait_s: float, cancel: threading.Event | None = None) -> Release:
        """Block until no flush is at work and one waits on its backend, for `max_wait_s` at
        most, or until `cancel` is set (and `wake` called).

        Not simply "no flush at work": a flush that has just finished is followed at once by
        the next one's candidate search, and a write started in between would share the cores
        with it. With nothing to consolidate the write waits the whole bound, so indexing is
        delayed at most `max_wait_s` whatever the processor does.
        """
        deadline = time.monotonic() + max_wait_s
        with self._changed:
            while not self._is_quiet():
                if cancel is not None and cancel.is_set():
                    return Release.CANCELLED
                left = deadline - time.monotonic()
                if left <= 0:
                    return Release.BOUND
                self._changed.wait(left)
            return Release.BACKEND_WAIT

    def wake(self) -> None:
        """Make waiters look at their `cancel` again."""
        with self._changed:
            self._changed.notify_all()

    def _is_quiet(self) -> bool:
        return self._working == 0 and self._waiting > 0

    def _move(self, *, working: int = 0, waiting: int = 0) -> None:
        with self._changed:
            self._working += working
            self._waiting += waiting
            if self._is_quiet():
                self._changed.notify_all()
