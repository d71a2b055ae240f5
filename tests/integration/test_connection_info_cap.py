"""Migration 0018 cuts a connection's learned info written before the cap to its latest lines."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from domain.model import MAX_LEARNED_INFO
from store.migrate import migrate
from store.postgres import make_pool

pytestmark = pytest.mark.integration


def test_a_connection_over_the_cap_keeps_its_latest_lines_in_order(fresh_database: str) -> None:
    pool = make_pool(fresh_database, max_size=2)
    try:
        migrate(pool, target=17)
        lines = [f"line {i}" for i in range(MAX_LEARNED_INFO + 50)]
        with pool.connection() as conn:
            conn.execute(
                "INSERT INTO connections (user_id, connection_id, organization_id,"
                " persistent_learned_info) VALUES ('ada', 'gmail', 'org-a', %s),"
                " ('ada', 'crm', 'org-a', %s)",
                (Jsonb(lines), Jsonb(lines[:3])),
            )
        assert [m.name for m in migrate(pool, target=18)] == ["connection_info_cap"]
        with pool.connection() as conn:
            kept = dict(
                conn.execute(
                    "SELECT connection_id, persistent_learned_info FROM connections"
                ).fetchall()
            )
    finally:
        pool.close()
    assert kept == {"gmail": lines[-MAX_LEARNED_INFO:], "crm": lines[:3]}
