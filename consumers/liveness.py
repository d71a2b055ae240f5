"""What a consumer runtime tells its health endpoints: joined its group, and still looping.

Written by the consumer's own thread (and kafka-python's IO thread for assignments), read by
the health server's threads: plain values under a lock, never the (thread-unsafe) consumer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from consumers.batching import TopicPartition


@dataclass(frozen=True)
class ConsumerSnapshot:
    joined: bool  # an assignment arrived since the last revocation (it may be empty)
    partitions: int
    seconds_since_poll: float | None  # None: never polled
    paused: bool


class ConsumerLiveness:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._joined = False
        self._partitions = 0
        self._last_poll: float | None = None
        self._paused = False

    def assigned(self, tps: Sequence[TopicPartition]) -> None:
        with self._lock:
            self._joined = True
            self._partitions = len(tps)

    def left(self, tps: Sequence[TopicPartition], *, lost: bool = False) -> None:
        del tps, lost  # whatever left, the member rejoins before it owns anything again
        with self._lock:
            self._joined = False
            self._partitions = 0

    def polled(self, *, paused: bool = False) -> None:
        with self._lock:
            self._last_poll = self._monotonic()
            self._paused = paused

    def snapshot(self) -> ConsumerSnapshot:
        with self._lock:
            since = None if self._last_poll is None else self._monotonic() - self._last_poll
            return ConsumerSnapshot(self._joined, self._partitions, since, self._paused)
