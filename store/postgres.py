"""Postgres for every adapter in `store`: one pool per process, and the one place where
psycopg's errors become the store's.

`OperationalError` (connection lost, server gone, pool timeout, deadlock, serialization
failure) becomes `DatabaseUnavailable`, which callers may retry; so does a refusal an operator
fixes (`DatabaseRefused`: a privilege revoked, a write to a read-only database). Any other
driver error (a constraint, a type, a bug in a statement) becomes `StoreError`, which they
must not retry.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from store.errors import DatabaseRefused, DatabaseUnavailable, StoreError

# Insufficient resources (disk full, too many connections) are OperationalErrors already; a
# privilege revoked is not. It counts only as "permission denied": the append-only triggers
# raise the same SQLSTATE for a write no privilege allows.
_NO_PRIVILEGE = "42501"
# A write in a read-only transaction (an InternalError): after a failover to a demoted node,
# or through a pooler routing to a replica, Postgres refuses every write until the DSN leads to
# the primary again. The pipeline waits that out rather than dead-lettering what it was
# writing. (The analyst tools connect read-only on purpose and never write; a command that
# tried would end on the refusal, with one line saying so, as on any other.)
_READ_ONLY = "25006"
LOCK_CONNECT_TIMEOUT_S = 10
# libpq's TCP keepalives, unless the DSN sets its own. A flush holds its memory's lock on a
# pooled connection through the model's calls (minutes), sending nothing: without probes, a
# server or a network path gone meanwhile is found only at the next statement, after the
# kernel's retransmissions (some 15 minutes), and a NAT or firewall on the way may drop the
# idle connection unseen. With them, a dead peer is known within about a minute (30 s idle,
# then 3 probes 10 s apart), and the connection's next use fails at once as
# DatabaseUnavailable. Client side only: a pooler (PgBouncer) refuses a server setting sent
# as a startup option.
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "connect_timeout": str(LOCK_CONNECT_TIMEOUT_S),
}

Fence = Callable[[psycopg.Connection[Any]], None]
# The fence of the cluster-job run this thread executes (store.write.cluster_jobs), checked by
# every `fenced_transaction`. A context value rather than a parameter: a job writes through
# whatever stores it uses, each write in a `fenced_transaction`; a token passed down would
# have to reach every one of their methods, and a method it missed would write unfenced.
_fence: ContextVar[Fence | None] = ContextVar("job_fence", default=None)


def make_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, name: str = "memoryd"
) -> ConnectionPool:
    """Open a pool and wait until it has a working connection, or raise DatabaseUnavailable."""
    pool = ConnectionPool(
        with_keepalives(dsn),
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"autocommit": False},
        # A pooled connection that died with the server is replaced, not handed out.
        check=ReuseCheck().check,
    )
    try:
        pool.open(wait=True, timeout=15)
    except psycopg.OperationalError as e:  # PoolTimeout is one too
        pool.close()
        raise DatabaseUnavailable(f"cannot connect to Postgres: {e}") from e
    return pool


def with_keepalives(dsn: str) -> str:
    """`dsn` with `KEEPALIVES` where neither it nor libpq's environment sets them; a DSN
    naming a service file (whose values the added ones would override) as it is. Raises
    StoreError (not to be retried) for a DSN libpq cannot parse."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise StoreError(f"the Postgres DSN cannot be parsed: {e}") from e
    if "service" in given or "PGSERVICE" in os.environ:
        return dsn
    if "PGCONNECT_TIMEOUT" in os.environ:
        given["connect_timeout"] = os.environ["PGCONNECT_TIMEOUT"]
    return make_conninfo(dsn, **{k: v for k, v in KEEPALIVES.items() if k not in given})


class ReuseCheck:
    """The pool's check at checkout: a round trip only for a connection that sat idle.

    A consolidation takes a connection some 30 times; checking each with a round trip
    lengthened every flush by as many (bench.processor). One last checked out less than
    `fresh_s` ago has run statements since, so it worked less than `fresh_s` ago; if the server
    went away since, its first statement fails with `OperationalError` (`DatabaseUnavailable`,
    retried) and the pool discards it.

    Timed from the checkout, not the return: with a callback at return (`reset`) psycopg_pool
    hands every returned connection to its worker threads, and the connection is not back in
    the pool until one of them gets the GIL from a busy process (BENCHMARKS.md, "Connections
    given back at once").
    """

    def __init__(self, fresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._fresh_s = fresh_s
        self._clock = clock
        self._checked_out: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def check(self, conn: psycopg.Connection[Any]) -> None:
        now = self._clock()
        with self._lock:
            last = self._checked_out.get(conn)
            self._checked_out[conn] = now
        if conn.closed or conn.broken:
            raise psycopg.OperationalError("the pooled connection is closed")
        if last is None or now - last >= self._fresh_s:
            ConnectionPool.check_connection(conn)


@contextmanager
def translated(operation: str, error: type[StoreError] = StoreError) -> Iterator[None]:
    """Driver errors raised inside become `DatabaseUnavailable`, or `error` naming operation."""
    try:
        yield
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(str(e)) from e
    except psycopg.Error as e:
        if refused(e):
            raise DatabaseRefused(f"{operation} refused: {e}") from e
        raise error(f"{operation} failed: {e}") from e


def refused(e: psycopg.Error) -> bool:
    """Whether Postgres refused for a reason outside the work (see `DatabaseRefused`)."""
    if e.sqlstate == _READ_ONLY:
        return True
    return e.sqlstate == _NO_PRIVILEGE and str(e).startswith("permission denied")


@contextmanager
def transaction(
    pool: ConnectionPool, operation: str = "query"
) -> Iterator[psycopg.Connection[Any]]:
    """A connection inside one transaction, its driver errors translated."""
    with translated(operation), pool.connection() as conn, fenced_transaction(conn):
        yield conn


@contextmanager
def fenced_transaction(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """`conn.transaction()`, first checked (inside it) by the fence of the cluster-job run
    this thread executes, if any: every transaction of a store opens with it."""
    with conn.transaction():
        check = _fence.get()
        if check is not None:
            check(conn)
        yield


@contextmanager
def fenced(check: Fence) -> Iterator[None]:
    """Every transaction this thread opens in the block (`fenced_transaction`) is first
    checked by `check`, which raises to refuse it."""
    token = _fence.set(check)
    try:
        yield
    finally:
        _fence.reset(token)


# Rows a server-side cursor of `streamed` brings per round trip (the reader holds two pages
# while it fetches the next).
STREAM_ROWS = 200


def streamed(
    pool: ConnectionPool,
    query: str,
    params: Sequence[Any],
    operation: str = "query",
    *,
    rows: int = STREAM_ROWS,
    row_factory: RowFactory[Any] | None = None,
) -> Iterator[Any]:
    """The rows of one query through a server-side (named) cursor, `rows` at a time: a read
    as long as a memory's whole history, in bounded memory. Its transaction (a savepoint in a
    `snapshot`) stays open until the rows are read or the iterator is closed: read one
    stream to its end before the next starts."""
    name = f"streamed_{uuid.uuid4().hex}"
    with (
        transaction(pool, operation) as conn,
        conn.cursor(name, row_factory=row_factory or tuple_row) as cur,
    ):
        cur.itersize = rows
        cur.execute(query, params)
        yield from cur


@contextmanager
def statement(pool: ConnectionPool, operation: str = "query") -> Iterator[psycopg.Connection[Any]]:
    """A connection for one read-only statement, outside a transaction block: no BEGIN and
    COMMIT round trips. A single statement sees one snapshot whatever the mode. (Inside a
    `snapshot`, the statement is one more of its transaction.)"""
    with translated(operation), pool.connection() as conn:
        if conn.info.transaction_status is not TransactionStatus.IDLE:
            yield conn
            return
        conn.autocommit = True
        try:
            yield conn
        finally:
            conn.autocommit = False


@contextmanager
def held_lock(pool: ConnectionPool, key: int, operation: str) -> Iterator[bool]:
    """Try a session advisory lock, on a connection of its own rather than the pool's; yields
    whether it was got, and holds it until the block ends (the connection's end releases it).

    For a job that holds its lock while it runs (minutes, hours): a pooled connection held
    that long is one the flushes and reads the pool is sized for go without, and with all
    the cluster jobs due at once they waited out the pool's timeout.
    """
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else pool.conninfo()
    with (
        translated(operation),
        psycopg.connect(conninfo, autocommit=True, connect_timeout=LOCK_CONNECT_TIMEOUT_S) as conn,
    ):
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        yield bool(got and got[0])


class SnapshotPool(ConnectionPool):
    """Lends one connection, inside one REPEATABLE READ READ ONLY transaction, to whatever
    asks it for one: adapters built on it read the database as of one moment. Never opened
    as a pool (nothing else of a pool is used by the adapters)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        super().__init__("", open=False, name="snapshot")
        self._conn = conn

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        # `transaction` and `statement` nest in the snapshot's transaction (a savepoint, or
        # nothing), so it spans every read until `snapshot` ends.
        yield self._conn


@contextmanager
def snapshot(pool: ConnectionPool) -> Iterator[SnapshotPool]:
    """Reads through the SnapshotPool given see one snapshot of the database: what an analyst
    exports or verifies of a memory is consistent however the pipeline writes meanwhile.
    Held for the block: keep it to one memory (it holds back vacuum while open)."""
    with translated("snapshot"), pool.connection() as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        try:
            with conn.transaction():
                yield SnapshotPool(conn)
        finally:
            conn.isolation_level = None
            conn.read_only = None


def memory_params(key: MemoryKey) -> tuple[str, str]:
    """A memory's key as the parameters of `organization_id = %s AND user_id = %s`."""
    return (key.organization_id, key.user_id)
