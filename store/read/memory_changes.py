"""Which memories' stamps this process knows to be current, without asking Postgres.

Every change of `user_memory`'s version or generation is announced on the channel
`memoryd_memory` when its transaction commits (migration 0008). A read process listens on one
connection; a stamp it read from Postgres is trusted until that memory is announced, while the
listening connection that was up when the stamp was read is still up and answered a ping
within `alive_within_s` (a half-open connection hangs on its next ping instead of failing, and
its announcements are lost meanwhile), and for at most `ttl_s`. So a turn on a memory read before
costs no round trip, and a consolidation or an erasure committed anywhere is seen by the next
turn that starts after its announcement arrives (milliseconds after the commit).

Read-your-writes, therefore: a turn that starts after a run's commit returned may still see
the previous version for as long as the announcement takes to arrive; a process that needs
the commit itself (a test, a CLI after `memoryd replay`) reads with the watch off.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from domain.ids import MemoryKey
from domain.reads import MemoryStamp

__all__ = ["CHANNEL", "MemoryChangeListener", "StampWatch", "watching"]

CHANNEL = "memoryd_memory"
APPLICATION = "memoryd-memory-changes"  # the listener's connection, as pg_stat_activity names it
_PING_FAILS_AFTER_S = 10.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Reading:
    """Taken before a stamp is read from Postgres; the stamp is kept only if still valid."""

    epoch: int
    changes: int


@dataclass(frozen=True)
class _Known:
    stamp: MemoryStamp
    epoch: int
    at: float


class StampWatch:
    """Memories' stamps known current, bounded, dropped when announced or stale."""

    def __init__(
        self,
        ttl_s: float,
        max_memories: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        alive_within_s: float = 5.0,
    ) -> None:
        self._ttl = ttl_s
        self._max = max_memories
        self._clock = clock
        self._alive_within = alive_within_s
        self._alive_at = 0.0
        self._known: OrderedDict[MemoryKey, _Known] = OrderedDict()
        self._lock = threading.Lock()
        self._epoch = 0
        self._listening = False
        self._changes = 0  # announcements so far: a read that saw one start is not kept

    def current(self, key: MemoryKey) -> MemoryStamp | None:
        """The memory's stamp if known current, else None (ask Postgres)."""
        with self._lock:
            known = self._known.get(key)
            if known is None or not self._heard() or known.epoch != self._epoch:
                return None
            if self._clock() - known.at > self._ttl:
                del self._known[key]
                return None
            return known.stamp

    def reading(self) -> _Reading | None:
        """Call before reading a stamp from Postgres; None while not listening."""
        with self._lock:
            return _Reading(self._epoch, self._changes) if self._heard() else None

    def read(self, key: MemoryKey, stamp: MemoryStamp, reading: _Reading) -> None:
        """The stamp read from Postgres since `reading`: kept unless something was announced
        or the listener reconnected in between (it might be older than the announcement)."""
        with self._lock:
            if reading.epoch != self._epoch or reading.changes != self._changes:
                return
            self._known[key] = _Known(stamp, reading.epoch, self._clock())
            self._known.move_to_end(key)
            while len(self._known) > self._max:
                self._known.popitem(last=False)

    def changed(self, key: MemoryKey) -> None:
        with self._lock:
            self._changes += 1
            self._known.pop(key, None)
            self._alive_at = self._clock()

    def alive(self) -> None:
        """The listening connection answered just now."""
        with self._lock:
            self._alive_at = self._clock()

    def _heard(self) -> bool:
        return self._listening and self._clock() - self._alive_at <= self._alive_within

    def listening(self, up: bool) -> None:
        """The listener's connection is up (LISTEN done) or lost: either way, a new epoch,
        so nothing read before it is trusted (announcements may have been missed)."""
        with self._lock:
            self._epoch += 1
            self._listening = up
            self._alive_at = self._clock()
            self._known.clear()


class MemoryChangeListener:
    """A daemon thread that LISTENs on `CHANNEL` and tells the watch; reconnects with backoff."""

    def __init__(
        self, dsn: str, watch: StampWatch, *, ping_s: float = 1.0, max_backoff_s: float = 5.0
    ) -> None:
        self._dsn = dsn
        self._watch = watch
        self._ping_s = ping_s
        self._max_backoff = max_backoff_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-changes", daemon=True)

    def start(self) -> MemoryChangeListener:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._ping_s + 5)
        self._watch.listening(False)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._listen()
            except psycopg.Error as e:
                # Not the data path: the watch is off until the connection is back, and turns
                # ask Postgres for their stamps meanwhile.
                self._watch.listening(False)
                log.warning("memory change listener lost its connection: %s", e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            else:
                backoff = 0.1

    def _listen(self) -> None:
        with psycopg.connect(
            self._dsn,
            autocommit=True,
            application_name=APPLICATION,
            # A half-open connection fails its ping after this, instead of hanging for as long
            # as the kernel retransmits (the watch stops trusting it after alive_within_s).
            tcp_user_timeout=int(_PING_FAILS_AFTER_S * 1000),
        ) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self._watch.listening(True)
            while not self._stop.is_set():
                for note in conn.notifies(timeout=self._ping_s):
                    key = _key_of(note.payload)
                    if key is None:  # not ours: which memory changed is unknown, so all did
                        self._watch.listening(True)
                    else:
                        self._watch.changed(key)
                conn.execute("SELECT 1")  # a dead connection fails here, not silently
                self._watch.alive()


def _key_of(payload: str) -> MemoryKey | None:
    try:
        found = json.loads(payload)
        return MemoryKey(str(found["o"]), str(found["u"]))
    except (ValueError, TypeError, KeyError):
        log.warning("unexpected payload on %s: %.200s", CHANNEL, payload)
        return None


@contextmanager
def watching(dsn: str, ttl_s: float, max_memories: int) -> Iterator[StampWatch | None]:
    """A watch with its listener running for the block; None (no watch) when ttl_s is 0."""
    if ttl_s <= 0:
        yield None
        return
    watch = StampWatch(ttl_s, max_memories)
    listener = MemoryChangeListener(dsn, watch).start()
    try:
        yield watch
    finally:
        listener.close()
