"""The store never lets memory locks take the pool's last connections."""

from __future__ import annotations

import threading
import time

import pytest

from store.migrate import migrate
from store.postgres import make_pool
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import key_of

pytestmark = pytest.mark.integration


def test_at_most_pool_size_minus_two_memory_locks_are_held_at_once(fresh_database: str) -> None:
    pool = make_pool(fresh_database, max_size=4)
    try:
        migrate(pool)
        store = PostgresMemoryStore(pool)
        holding = 0
        peak = 0
        guard = threading.Lock()

        def flush(user: str) -> None:
            nonlocal holding, peak
            with store.memory_lock(key_of(user)):
                with guard:
                    holding += 1
                    peak = max(peak, holding)
                # A flush needs a second connection while it holds its lock.
                assert store.load_state(key_of(user)).version == 0
                time.sleep(0.2)
                with guard:
                    holding -= 1

        threads = [threading.Thread(target=flush, args=(f"u{i}",)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a flush deadlocked"
        assert peak == 2
    finally:
        pool.close()
