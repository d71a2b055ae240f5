"""A connection is back in the pool the moment its block ends, not when a pool thread runs."""

from __future__ import annotations

import pytest

from store.postgres import make_pool

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
