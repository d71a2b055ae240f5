"""Caches of what is worked out from users' texts, bounded in time as well as in size.

A process works the same texts out more than once (a fact's words for every batch it is
compared with, a text's vector for the gate and then the indexer, a query's lexemes), so it
remembers the results; their keys are users' content. An entry therefore leaves
`CONTENT_MAX_AGE_S` after it was put, whether it was used since or not, dropped by a thread
of the cache's own that runs while the cache holds anything: erased content leaves every
process's caches within that time (README, Erasure), as it leaves the read path's per-memory
caches within their sweep, and an idle process holds none of it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import wraps
from typing import Generic, TypeVar

CONTENT_MAX_AGE_S = 60.0
# The expiry thread wakes at most this often however many entries fall due (each put has its
# own time): an entry may outlive its age by up to this much.
EXPIRY_GRANULARITY_S = 1.0

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
R = TypeVar("R")


class TimedCache(Generic[K, V]):
    """A thread-safe map whose entries leave `max_age_s` after they were put, and the oldest
    first when it holds `max_entries`."""

    def __init__(
        self,
        max_entries: int,
        max_age_s: float = CONTENT_MAX_AGE_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        expire_in_background: bool = True,
    ) -> None:
        """`expire_in_background=False`: no thread, the owner calls `expire` (a test on a clock
        of its own, which a sleeping thread could not follow)."""
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be > 0, got {max_age_s}")
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self._expiry: threading.Thread | None = None
        self._background = expire_in_background

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # Reads take no lock: one call of the C OrderedDict's `get` holds the GIL throughout, and
    # a hit costs a memoized function 0.2 us instead of 0.5 (a flush makes hundreds).
    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is None or self._clock() - found[0] >= self._max_age_s:
            return None
        return found[1]

    def get_many(self, keys: list[K]) -> dict[K, V]:
        now, entries = self._clock(), self._entries
        held = ((k, entries.get(k)) for k in keys)
        return {k: f[1] for k, f in held if f is not None and now - f[0] < self._max_age_s}

    def put(self, key: K, value: V) -> None:
        self.put_many({key: value})

    def put_many(self, items: dict[K, V]) -> None:
        """An entry already held keeps its value and its time: its age counts from when it
        first came in (two callers working out the same key at once put it twice)."""
        now = self._clock()
        with self._lock:
            self._expire(now)  # an entry due is put anew, not kept with its old time
            for key, value in items.items():
                self._entries.setdefault(key, (now, value))
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
            if self._background and self._expiry is None and self._entries:
                self._expiry = threading.Thread(
                    target=self._expire_while_held, name="content-cache-expiry", daemon=True
                )
                self._expiry.start()

    def expire(self) -> int:
        """Drop the entries older than `max_age_s` now; returns how many went."""
        with self._lock:
            return self._expire(self._clock())

    def _expire(self, now: float) -> int:
        """Pops from the front, where the oldest are. Lock held."""
        dropped = 0
        while self._entries:
            put_at, _ = next(iter(self._entries.values()))
            if now - put_at < self._max_age_s:
                break
            self._entries.popitem(last=False)
            dropped += 1
        return dropped

    def _expire_while_held(self) -> None:
        """Sleeps until the oldest entry is due, drops what is due, and ends once the cache
        is empty; the next put starts another."""
        while True:
            with self._lock:
                self._expire(self._clock())
                if not self._entries:
                    self._expiry = None
                    return
                oldest, _ = next(iter(self._entries.values()))
            due = oldest + self._max_age_s - self._clock()
            time.sleep(max(due, min(EXPIRY_GRANULARITY_S, self._max_age_s)) + 0.01)


def timed_memo(
    max_entries: int, max_age_s: float = CONTENT_MAX_AGE_S
) -> Callable[[Callable[[str], R]], Callable[[str], R]]:
    """Remember a function of a text for `max_age_s` (`functools.lru_cache` would keep the
    texts for as long as nothing newer pushed them out)."""

    def decorate(function: Callable[[str], R]) -> Callable[[str], R]:
        cache: TimedCache[str, R] = TimedCache(max_entries, max_age_s)

        @wraps(function)
        def remembered(text: str) -> R:
            found = cache.get(text)
            if found is None:
                found = function(text)
                cache.put(text, found)
            return found

        return remembered

    return decorate
