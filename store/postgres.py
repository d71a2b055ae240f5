"""Postgres for every adapter in `store`: one pool per process, and the one place where
psycopg's errors become the store's.

`OperationalError` (connection lost, server gone, pool timeout, deadlock, serialization
failure) becomes `DatabaseUnavailable`, which callers may retry; any other driver error (a
constraint, a type, a bug in a statement) becomes `StoreError`, which they must not.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from store.errors import DatabaseUnavailable, StoreError


def make_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, name: str = "memoryd"
) -> ConnectionPool:
    """Open a pool and wait until it has a working connection, or raise DatabaseUnavailable."""
    reuse = ReuseCheck()
    pool = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"autocommit": False},
        # A pooled connection that died with the server is replaced, not handed out.
        check=reuse.check,
        reset=reuse.returned,
    )
    try:
        pool.open(wait=True, timeout=15)
    except psycopg.OperationalError as e:  # PoolTimeout is one too
        pool.close()
        raise DatabaseUnavailable(f"cannot connect to Postgres: {e}") from e
    return pool


class ReuseCheck:
    """The pool's check at checkout: a round trip only for a connection that sat idle.

    A consolidation takes a connection some 30 times; checking each with a round trip
    lengthened every flush by as many (bench.processor). One given back less than
    `fresh_s` ago worked then; if the server went away since, its first statement fails with
    `OperationalError` (`DatabaseUnavailable`, retried) and the pool discards it.
    """

    def __init__(self, fresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._fresh_s = fresh_s
        self._clock = clock
        self._returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def returned(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            self._returned[conn] = self._clock()

    def check(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            at = self._returned.pop(conn, None)
        if conn.closed or conn.broken:
            raise psycopg.OperationalError("the pooled connection is closed")
        if at is None or self._clock() - at >= self._fresh_s:
            ConnectionPool.check_connection(conn)


@contextmanager
def translated(operation: str, error: type[StoreError] = StoreError) -> Iterator[None]:
    """Driver errors raised inside become `DatabaseUnavailable`, or `error` naming operation."""
    try:
        yield
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(str(e)) from e
    except psycopg.Error as e:
        raise error(f"{operation} failed: {e}") from e


@contextmanager
def transaction(
    pool: ConnectionPool, operation: str = "query"
) -> Iterator[psycopg.Connection[Any]]:
    """A connection inside one transaction, its driver errors translated."""
    with translated(operation), pool.connection() as conn, conn.transaction():
        yield conn
