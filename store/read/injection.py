"""What every turn is given regardless of its query, cached per memory and stamp.

Every change to W, S, learned info, connections and pinned facts is written by a
consolidation run, which increments `user_memory.version` in the same transaction; an erasure
(a forget, a fact erased) gives the memory a new `generation` instead. So a cached injection is
current exactly when its (generation, version) is the stored one, and checking that is one
primary-key lookup; only a miss reads the rest. With a `StampWatch` (the read path's
default, `store.read.memory_changes`) even that lookup is skipped for a memory whose stamp
was read before and has not been announced changed since. Keyed by (organization, user): two
organizations' users of the same id never share an entry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from domain.ids import MemoryKey
from domain.model import MemoryState
from domain.ports import InjectionReads
from domain.reads import Injection, MemoryStamp
from store.read.memory_changes import StampWatch


class InjectionCache:
    """A bounded LRU of memories' injections; safe to share between threads."""

    def __init__(
        self, reads: InjectionReads, max_users: int = 10_000, watch: StampWatch | None = None
    ) -> None:
        if max_users < 1:
            raise ValueError(f"max_users must be >= 1, got {max_users}")
        self._reads = reads
        self._watch = watch
        self._max = max_users
        self._entries: OrderedDict[MemoryKey, Injection] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: MemoryKey) -> tuple[Injection, bool]:
        """(the memory's current injection, whether it came from the cache)."""
        stamp = self._stamp(key)
        if stamp is None:
            # Unknown, or erased since it was cached: what the cache held must not outlive it.
            self.invalidate(key)
            return Injection(MemoryState.empty(key)), False
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None and cached.stamp == stamp:
                self._entries.move_to_end(key)
                return cached, True
        fresh = self._reads.injection(key)
        if fresh is None:  # erased between the two reads
            self.invalidate(key)
            return Injection(MemoryState.empty(key)), False
        with self._lock:
            current = self._entries.get(key)
            # A slower reader must not replace a newer entry of the same generation with an
            # older one; an entry of another generation is stale whatever its version.
            if (
                current is None
                or current.generation != fresh.generation
                or current.state.version <= fresh.state.version
            ):
                self._entries[key] = fresh
                self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return fresh, False

    def _stamp(self, key: MemoryKey) -> MemoryStamp | None:
        """The memory's stamp: from the watch when it knows it current, else from Postgres."""
        if self._watch is None:
            return self._reads.memory_stamp(key)
        known = self._watch.current(key)
        if known is not None:
            return known
        reading = self._watch.reading()
        stamp = self._reads.memory_stamp(key)
        if stamp is not None and reading is not None:
            self._watch.read(key, stamp, reading)
        return stamp

    def invalidate(self, key: MemoryKey) -> None:
        if self._watch is not None:
            self._watch.changed(key)
        with self._lock:
            self._entries.pop(key, None)

    def memories(self) -> list[MemoryKey]:
        """The memories cached now (for the sweep, and for tests that look inside)."""
        with self._lock:
            return list(self._entries)

    def entries(self) -> list[Injection]:
        with self._lock:
            return list(self._entries.values())

    def sweep(self) -> int:
        """Drop the entries whose memory is gone or changed; returns how many.

        A process only learns of an erasure done elsewhere on its next read of that memory:
        the sweep bounds how long erased content can stay in this process's memory.
        """
        keys = self.memories()
        stamps = self._reads.memory_stamps(keys) if keys else {}
        dropped = 0
        with self._lock:
            for key in keys:
                cached = self._entries.get(key)
                if cached is not None and cached.stamp != stamps.get(key):
                    del self._entries[key]
                    dropped += 1
        return dropped
