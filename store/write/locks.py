"""The advisory locks of a memory, as 64-bit keys every process derives the same way."""

from __future__ import annotations

import hashlib

from domain.ids import MemoryKey

MEMORY_LOCK_NAMESPACE = b"memoryd-memory"  # apart from the log locks (and from each other)
LOG_LOCK_NAMESPACE = b"memoryd-log"  # the log writer's inserts against an erasure


def _lock_key(namespace: bytes, key: MemoryKey) -> int:
    # A keyed hash of all 64 bits Postgres's advisory locks take: tenants choose their user
    # ids, and with a 32-bit checksum one could pick an id whose lock is another tenant's
    # (its flushes and erasures would then wait for theirs). blake2b is stable across
    # processes (unlike hash()), which is the whole point of the lock.
    digest = hashlib.blake2b(key.joined.encode(), digest_size=8, person=namespace).digest()
    return int.from_bytes(digest, "big", signed=True)


def memory_lock_key(key: MemoryKey) -> int:
    """The advisory lock a flush (and an erasure) holds on one memory."""
    return _lock_key(MEMORY_LOCK_NAMESPACE, key)


def log_lock_key(key: MemoryKey) -> int:
    """Taken shared by the log writer's insert of a memory's events, exclusively by its erasure."""
    return _lock_key(LOG_LOCK_NAMESPACE, key)
