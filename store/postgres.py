"""Postgres for every adapter in `store`: one pool per process, and the one place where
psycopg's errors become the store's.

`OperationalError` (connection lost, server gone, pool timeout, deadlock, serialization
failure) becomes `DatabaseUnavailable`, which callers may retry; so does a refusal an operator
fixes (`DatabaseRefused`: a privilege revoked). Any other
driver error (a constraint, a type, a bug in a statement) becomes `StoreError`, which they
must not retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from store.errors import DatabaseRefused, DatabaseUnavailable, StoreError

# Insufficient resources (disk full, too many connections) are OperationalErrors already; a
# privilege revoked is not. It counts only as "permission denied": the append-only triggers
# raise the same SQLSTATE for a write no privilege allows. (A read-only transaction is no
# refusal: the analyst tools connect read-only on purpose.)
_NO_PRIVILEGE = "42501"


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
        if refused(e):
            raise DatabaseRefused(f"{operation} refused: {e}") from e
        raise error(f"{operation} failed: {e}") from e


def refused(e: psycopg.Error) -> bool:
    """Whether Postgres refused for a reason outside the work (see `DatabaseRefused`)."""
    return e.sqlstate == _NO_PRIVILEGE and str(e).startswith("permission denied")


@contextmanager
def transaction(
    pool: ConnectionPool, operation: str = "query"
) -> Iterator[psycopg.Connection[Any]]:
    """A connection inside one transaction, its driver errors translated."""
    with translated(operation), pool.connection() as conn, conn.transaction():
        yield conn
