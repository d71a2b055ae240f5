"""A connection is back in the pool the moment its block ends, not when a pool thread runs."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from store.errors import DatabaseUnavailable
from store.postgres import make_pool, statement

pytestmark = pytest.mark.integration


def test_a_connection_is_idle_in_the_pool_as_soon_as_it_is_given_back(
    fresh_database: str,
) -> None:
    # psycopg_pool hands a return to its worker threads when the pool has a `reset` callback;
    # the connection is then missing from the pool until one of them runs, and a busy process
    # makes the next checkout wait for it or open another connection.
    pool = make_pool(fresh_database, min_size=2, max_size=2)
    try:
        for _ in range(50):
            with pool.connection() as first, pool.connection() as second:
                first.execute("SELECT 1")
                second.execute("SELECT 1")
            assert pool.get_stats()["pool_available"] == 2
    finally:
        pool.close()


def test_a_statement_on_a_connection_the_server_dropped_is_the_database_unavailable(
    fresh_database: str,
) -> None:
    # The pool's checkout skips the round-trip check for a connection used a moment ago, so
    # the statement meets the dropped connection; `statement` then resets `autocommit` on it.
    # Neither may turn the loss into anything but DatabaseUnavailable (503 at the API).
    pool = make_pool(fresh_database, min_size=1, max_size=1)
    try:
        with statement(pool) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        with psycopg.connect(fresh_database, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        with pytest.raises(DatabaseUnavailable), statement(pool) as conn:
            conn.execute("SELECT 1")
        with statement(pool) as conn:  # the pool replaced the dropped connection
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_pooled_connections_send_tcp_keepalives_unless_the_dsn_sets_its_own(
    fresh_database: str,
) -> None:
    # A flush's lock connection idles through the model's calls: without keepalives a server
    # gone meanwhile is found some 15 minutes late. A DSN's own values win.
    for dsn, idle in (
        (fresh_database, "30"),
        (make_conninfo(fresh_database, keepalives_idle=7), "7"),
    ):
        pool = make_pool(dsn, min_size=1, max_size=1)
        try:
            with pool.connection() as conn:
                params = conn.info.get_parameters()
                assert (params.get("keepalives"), params.get("keepalives_idle")) == ("1", idle)
                assert params.get("connect_timeout") == "10"
        finally:
            pool.close()
