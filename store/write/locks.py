"""The advisory locks of a memory, as 64-bit keys every process derives the same way."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from domain.ids import MemoryKey
from store.errors import MemoryLockLost

MEMORY_LOCK_NAMESPACE = b"memoryd-memory"  # apart from the log locks (and from each other)
LOG_LOCK_NAMESPACE = b"memoryd-log"  # the log writer's inserts against an erasure
ERASURE_LOCK_NAMESPACE = b"memoryd-erasure"  # audits of a memory's new erasures, one at a time
# A bigint key shows with objsubid 1 (two int4 keys with 2): see `pg_locks_tag`.
_HELD = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s"
    " AND objsubid = 1)"
)


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


def pg_locks_tag(lock: int) -> tuple[int, int]:
    """The (classid, objid) pg_locks shows a bigint advisory key as: its high and low 32 bits,
    unsigned (with objsubid 1)."""
    return (lock >> 32) & 0xFFFFFFFF, lock & 0xFFFFFFFF


def erasure_lock_key(key: MemoryKey) -> int:
    """Taken for the transaction that audits a new erasure of a memory that joins an open one."""
    return _lock_key(ERASURE_LOCK_NAMESPACE, key)


def take_session_lock(conn: psycopg.Connection[Any], lock: int, wait_s: float | None) -> bool:
    """Take the session advisory lock on conn (in autocommit), waiting at most `wait_s`
    (None: as long as another holds it); whether it was granted."""
    if wait_s is None:
        conn.execute("SELECT pg_advisory_lock(%s::bigint)", (lock,))
        return True
    try:
        # Postgres bounds the wait itself; SET LOCAL ends with this transaction, so the pool
        # gets the connection back without it, while the session lock outlives the commit.
        with conn.transaction():
            timeout = f"{max(1, round(wait_s * 1000))}ms"  # 0 would mean: no bound at all
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            conn.execute("SELECT pg_advisory_lock(%s::bigint)", (lock,))
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def release_session_lock(conn: psycopg.Connection[Any], lock: int) -> None:
    """Give back a session lock that may or may not have been granted (unlocking one not
    held only warns). A broken connection holds nothing: its session ended, and the pool
    discards it."""
    if not conn.broken:
        conn.execute("SELECT pg_advisory_unlock(%s::bigint)", (lock,))
        conn.autocommit = False


class HeldSessionLock:
    """A session advisory lock held on `conn`, for its holder to check before a step that
    must not run without it. Checked on that connection alone: the lock ends with its
    session, which another connection would not notice."""

    def __init__(self, conn: psycopg.Connection[Any], lock: int, name: str) -> None:
        self._conn: psycopg.Connection[Any] | None = conn
        self._tag = pg_locks_tag(lock)
        self._name = name

    def check(self) -> None:
        """Raise MemoryLockLost unless the lock is still held (not yet released, and its
        session alive and holding it)."""
        if self._conn is None:
            raise MemoryLockLost(f"{self._name}: the lock was released")
        try:
            row = self._conn.execute(_HELD, self._tag).fetchone()
        except psycopg.OperationalError as e:
            raise MemoryLockLost(f"{self._name}: the lock's connection failed: {e}") from e
        if not (row and row[0]):
            raise MemoryLockLost(f"{self._name}: the lock's session no longer holds it")

    def released(self) -> None:
        """The lock is given back (its connection goes back to the pool): never held again."""
        self._conn = None
