"""Postgres for every adapter in `store`: one pool per process, and the one place where
psycopg's errors become the store's.

`OperationalError` (connection lost, server gone, pool timeout, deadlock, serialization
failure) becomes `DatabaseUnavailable`, which callers may retry; any other driver error (a
constraint, a type, a bug in a statement) becomes `StoreError`, which they must not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from store.errors import DatabaseUnavailable, StoreError


def make_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, name: str = "memoryd"
) -> ConnectionPool:
    """Open a pool and wait until it has a working connection, or raise DatabaseUnavailable."""
    pool = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"autocommit": False},
        # A pooled connection that died with the server is replaced, not handed out.
        check=ConnectionPool.check_connection,
    )
    try:
        pool.open(wait=True, timeout=15)
    except psycopg.OperationalError as e:  # PoolTimeout is one too
        pool.close()
        raise DatabaseUnavailable(f"cannot connect to Postgres: {e}") from e
    return pool


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
