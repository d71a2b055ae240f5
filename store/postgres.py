"""Postgres connections for every adapter in `store`: one pool per process, errors translated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from store.errors import DatabaseUnavailable


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
def transaction(pool: ConnectionPool) -> Iterator[psycopg.Connection[Any]]:
    """A connection inside one transaction; OperationalError becomes DatabaseUnavailable."""
    try:
        with pool.connection() as conn, conn.transaction():
            yield conn
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(str(e)) from e
