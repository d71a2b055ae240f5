"""A run's finished_at is when its transaction wrote it last, not when the transaction began:
"memory at T" (`memoryd history --at`) must not hold a run committed after T."""

from __future__ import annotations

from datetime import datetime

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from processors.fold import runs_until
from store.write.memory_store import PostgresMemoryStore
from store.write.run_log import PostgresRunLog
from store.write.run_rows import insert_run
from tests.support.builders import make_fact, seed_update

pytestmark = pytest.mark.integration

ADA = MemoryKey("org-a", "ada")


def _clock(pool: ConnectionPool) -> datetime:
    with pool.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def test_a_run_written_after_a_time_is_not_in_memory_at_that_time(
    migrated_pool: ConnectionPool,
) -> None:
    run = seed_update(PostgresMemoryStore(migrated_pool), "ada", []).run
    with migrated_pool.connection() as conn, conn.transaction():
        began = conn.execute("SELECT now()").fetchone()
        # A time after the transaction began, before the run's record is written: the run is
        # not committed then.
        at = conn.execute("SELECT clock_timestamp()").fetchone()
        insert_run(conn, run)
    assert began is not None
    assert at is not None
    runs = PostgresRunLog(migrated_pool).runs(ADA)
    assert [r.run.run_id for r in runs] == [run.run_id]
    assert runs[0].finished_at > at[0] > began[0]
    assert list(runs_until(runs, at[0])) == []
    assert [r.run.run_id for r in runs_until(runs, _clock(migrated_pool))] == [run.run_id]


def test_a_runs_record_is_the_last_row_its_transaction_writes(
    migrated_pool: ConnectionPool,
) -> None:
    # What a flush had written of a run when its record was inserted, seen by a trigger.
    with migrated_pool.connection() as conn:
        conn.execute(
            "CREATE TABLE written_before_run (run_id uuid, fact_changes bigint, consumed bigint)"
        )
        conn.execute(
            "CREATE FUNCTION note_run() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " INSERT INTO written_before_run SELECT NEW.run_id,"
            "  (SELECT count(*) FROM fact_history WHERE run_id = NEW.run_id),"
            "  (SELECT count(*) FROM consolidated_events WHERE run_id = NEW.run_id);"
            " RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER note_run BEFORE INSERT ON consolidation_runs"
            " FOR EACH ROW EXECUTE FUNCTION note_run()"
        )
    store = PostgresMemoryStore(migrated_pool)
    update = seed_update(store, "ada", [make_fact("ada", "I live in Lisbon")])
    store.apply(update)
    with migrated_pool.connection() as conn:
        noted = conn.execute("SELECT * FROM written_before_run").fetchall()
    assert noted == [(update.run.run_id, 1, len(update.run.input_event_ids))]
