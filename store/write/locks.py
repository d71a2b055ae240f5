"""The advisory locks of a memory, as 64-bit keys every process derives the same way."""

from __future__ import annotations

import zlib

from domain.ids import MemoryKey

MEMORY_LOCK_NAMESPACE = 0x4D454D  # "MEM": keeps memory locks apart from the job locks
LOG_LOCK_NAMESPACE = 0x4C4F47  # "LOG": the log writer's inserts against an erasure


def _lock_key(namespace: int, key: MemoryKey) -> int:
    # crc32 is stable across processes (unlike hash()), which is the whole point of the lock;
    # two memories sharing a crc only wait for each other, they never share a memory.
    return (namespace << 32) | zlib.crc32(key.joined.encode())


def memory_lock_key(key: MemoryKey) -> int:
    """The advisory lock a flush (and an erasure) holds on one memory."""
    return _lock_key(MEMORY_LOCK_NAMESPACE, key)


def log_lock_key(key: MemoryKey) -> int:
    """Taken shared by the log writer's insert of a memory's events, exclusively by its erasure."""
    return _lock_key(LOG_LOCK_NAMESPACE, key)
