"""What every turn is given regardless of its query, cached per (user, memory version).

Every change to W, S, learned info, connections and pinned facts is written by a
consolidation run, which increments `user_memory.version` in the same transaction. So a
cached injection is current exactly when its version is the stored one, and checking that is
one primary-key lookup; only a miss reads the rest.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from domain.model import MemoryState
from domain.ports import InjectionReads
from domain.reads import Injection


class InjectionCache:
    """A bounded LRU of users' injections; safe to share between threads."""

    def __init__(self, reads: InjectionReads, max_users: int = 10_000) -> None:
        if max_users < 1:
            raise ValueError(f"max_users must be >= 1, got {max_users}")
        self._reads = reads
        self._max = max_users
        self._entries: OrderedDict[str, Injection] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, user_id: str) -> tuple[Injection, bool]:
        """(the user's current injection, whether it came from the cache)."""
        version = self._reads.memory_version(user_id)
        if version is None:
            return Injection(MemoryState(user_id=user_id, organization_id="")), False
        with self._lock:
            cached = self._entries.get(user_id)
            if cached is not None and cached.state.version == version:
                self._entries.move_to_end(user_id)
                return cached, True
        fresh = self._reads.injection(user_id)
        if fresh is None:  # erased between the two reads
            return Injection(MemoryState(user_id=user_id, organization_id="")), False
        with self._lock:
            current = self._entries.get(user_id)
            # A slower reader must not replace a newer entry with an older one.
            if current is None or current.state.version <= fresh.state.version:
                self._entries[user_id] = fresh
                self._entries.move_to_end(user_id)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return fresh, False

    def invalidate(self, user_id: str) -> None:
        with self._lock:
            self._entries.pop(user_id, None)
