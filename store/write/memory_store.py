"""Memory state in Postgres: W, S, learned info, facts, runs and the credit ledger.

`apply` is the heart of exactly-once: the memory update, the run record, the ledger entries
and the list of consumed events commit together or not at all, and it refuses to apply a run
planned on a stale version or over events another run already consumed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from domain.model import (
    ConnectionContext,
    Fact,
    FactStatus,
    FlushReads,
    LedgerEntry,
    MemoryState,
    MemoryUpdate,
    RunRecord,
)
from domain.ports import PendingBacklog, Pricing
from store import fact_rows
from store.candidate_ranking import CONSOLIDATION_STATUS_VALUES, COUNT_CONSOLIDATION_FACTS
from store.errors import EventsAlreadyConsolidated, MemoryBusy, StaleMemoryVersion, StoreError
from store.postgres import fenced_transaction, memory_params, statement, transaction, translated
from store.write import flush_sql, index_marks, index_outbox
from store.write.flush_sql import MEMORY as _MEMORY
from store.write.locks import (
    HeldSessionLock,
    memory_lock_key,
    release_session_lock,
    take_session_lock,
)
from store.write.run_rows import append_connections, insert_ledger, insert_run

_LOCK = "SELECT pg_advisory_lock(%s::bigint)"
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s::bigint)"
_APPLIED = (
    "SELECT EXISTS (SELECT 1 FROM consolidation_runs WHERE run_id = %s AND started_at = %s"
    " AND status = 'succeeded')"
)

# Pool connections never held by a memory lock, so lock holders always find one for their work.
LOCK_FREE_CONNECTIONS = 2


class PostgresMemoryStore:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        # A flush holds its lock's connection through the whole LLM call and needs a second
        # one meanwhile. Were every pool connection held by a lock, all holders would wait for
        # a connection none of them frees (a 30 s PoolTimeout, then retries, forever): so at
        # most max_size - 2 locks are held at once, and more concurrent flushes wait here.
        self._lock_slots = threading.BoundedSemaphore(max(1, pool.max_size - LOCK_FREE_CONNECTIONS))

    # -- reads ----------------------------------------------------------------------------

    def load_state(self, key: MemoryKey) -> MemoryState:
        with statement(self._pool) as conn:
            row = conn.execute(flush_sql.STATE, memory_params(key)).fetchone()
        state, _generation = _state(key, row)
        return state

    def facts(
        self, key: MemoryKey, statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,)
    ) -> list[Fact]:
        with statement(self._pool) as conn:
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} WHERE {_MEMORY}"
                " AND status = ANY(%s) ORDER BY created_at, fact_id",
                (key.organization_id, key.user_id, [s.value for s in statuses]),
            ).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def facts_with_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        if not fact_ids:
            return []
        with statement(self._pool) as conn:
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} WHERE {_MEMORY}"
                " AND fact_id = ANY(%s) ORDER BY fact_id",
                (key.organization_id, key.user_id, list(fact_ids)),
            ).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def facts_by_id(self, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        if not fact_ids:
            return []
        with statement(self._pool) as conn:
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} WHERE fact_id = ANY(%s)",
                (list(fact_ids),),
            ).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """The ids among these that no row holds (erased, or never written)."""
        if not fact_ids:
            return []
        with statement(self._pool) as conn:
            return fact_rows.missing(conn, fact_ids)

    def connections(self, key: MemoryKey, connection_ids: Sequence[str]) -> list[ConnectionContext]:
        if not connection_ids:
            return []
        with statement(self._pool) as conn:
            rows = conn.execute(
                "SELECT connection_id, persistent_learned_info FROM connections"
                f" WHERE {_MEMORY} AND connection_id = ANY(%s) ORDER BY connection_id",
                (key.organization_id, key.user_id, list(connection_ids)),
            ).fetchall()
        return [ConnectionContext(r[0], tuple(r[1])) for r in rows]

    def already_consolidated(
        self, key: MemoryKey, event_ids: Iterable[uuid.UUID]
    ) -> frozenset[uuid.UUID]:
        ids = list(event_ids)
        if not ids:
            return frozenset()
        with statement(self._pool) as conn:
            rows = conn.execute(flush_sql.CONSUMED, (*memory_params(key), ids)).fetchall()
        return frozenset(r[0] for r in rows)

    @contextmanager
    def locked_reads(
        self, key: MemoryKey, subject: str, event_ids: Sequence[uuid.UUID], *, wait: bool = True
    ) -> Iterator[FlushReads]:
        """Hold the memory lock (as `memory_lock`) and read what a flush needs under it.

        The lock and the seven reads go out in one pipeline on the lock's connection: Postgres
        runs the reads once the lock is granted, and the flush waits for one round trip
        instead of two on two connections (nothing else changes them while the lock is held).
        """
        lock = memory_lock_key(key)
        if not self._lock_slots.acquire(blocking=wait):
            raise MemoryBusy(f"no lock slot free for memory {key}")
        refused = False  # known not held: anything else (an error midway) is released
        try:
            with translated("memory lock"), self._pool.connection() as conn:
                conn.autocommit = True
                try:
                    with conn.pipeline():
                        got = conn.execute(_LOCK if wait else _TRY_LOCK, (lock,))
                        erasure = conn.execute(flush_sql.ERASURE_OPEN, memory_params(key))
                        cutoffs = conn.execute(flush_sql.CUTOFFS, (subject,))
                        of_events = (*memory_params(key), list(event_ids))
                        consumed = conn.execute(flush_sql.CONSUMED, of_events)
                        erased = conn.execute(flush_sql.ERASED_EVENTS, of_events)
                        state = conn.execute(flush_sql.STATE, memory_params(key))
                        balance = conn.execute(flush_sql.BALANCE, memory_params(key))
                        known = conn.execute(
                            COUNT_CONSOLIDATION_FACTS,
                            (*memory_params(key), CONSOLIDATION_STATUS_VALUES),
                        )
                        # The lock answers an empty value once granted; the try-lock, whether.
                        row = got.fetchone()
                        refused = not wait and not (row and row[0])
                        memory, generation = _state(key, state.fetchone())
                        reads = FlushReads(
                            erasure_open=_exists(erasure.fetchone()),
                            cutoffs=_cutoffs(cutoffs.fetchall()),
                            consumed=frozenset(r[0] for r in consumed.fetchall()),
                            erased=frozenset(r[0] for r in erased.fetchall()),
                            state=memory,
                            balance=_balance(balance.fetchone()),
                            known_facts=_count(known.fetchone()),
                            generation=generation,
                        )
                    if refused:  # the reads went out with the try and are of no use
                        raise MemoryBusy(f"memory {key} is locked")
                    yield reads
                finally:
                    if not refused:
                        release_session_lock(conn, lock)
                    elif not conn.broken:
                        conn.autocommit = False
        finally:
            self._lock_slots.release()

    # -- erasures -------------------------------------------------------------------------

    def forgotten_before(self, subject: str) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the first offset not forgotten, for an erased memory's digest.

        Empty for a memory never erased. A flush reads it under the memory lock (in
        `locked_reads`), so events read from Kafka before an erasure cannot bring the memory
        back after it.
        """
        with statement(self._pool) as conn:
            return _cutoffs(conn.execute(flush_sql.CUTOFFS, (subject,)).fetchall())

    def erased_events(self, key: MemoryKey, event_ids: Sequence[uuid.UUID]) -> frozenset[uuid.UUID]:
        """Of these events of the memory, those a fact erasure redacted in the log: what a
        flush drops (`FlushReads.erased`), read on its own."""
        with statement(self._pool) as conn:
            rows = conn.execute(flush_sql.ERASED_EVENTS, (*memory_params(key), list(event_ids)))
            return frozenset(r[0] for r in rows.fetchall())

    def memory_erasure_open(self, key: MemoryKey) -> bool:
        with statement(self._pool) as conn:
            return _exists(conn.execute(flush_sql.ERASURE_OPEN, memory_params(key)).fetchone())

    # -- the memory lock ------------------------------------------------------------------

    @contextmanager
    def memory_lock(self, key: MemoryKey, wait_s: float | None = None) -> Iterator[HeldSessionLock]:
        """Hold a session advisory lock on the memory for the whole flush (or erasure).

        Two processor instances can briefly both own a memory's partition during a rebalance;
        the lock makes the second wait instead of consolidating the same memory concurrently.
        With `wait_s`, waits that long at most (for a lock slot, then for the lock), then
        raises MemoryBusy holding nothing. Yields the lock, to `check()` before a step that
        must not run once the lock's session ended.
        """
        lock, started = memory_lock_key(key), time.monotonic()
        if not self._lock_slots.acquire(timeout=wait_s):
            raise MemoryBusy(f"memory {key}: no lock slot free within {wait_s}s")
        try:
            with translated("memory lock"), self._pool.connection() as conn:
                conn.autocommit = True
                left = None if wait_s is None else wait_s - (time.monotonic() - started)
                if not take_session_lock(conn, lock, left):
                    conn.autocommit = False
                    raise MemoryBusy(f"memory {key} is locked: waited {wait_s}s")
                held = HeldSessionLock(conn, lock, f"memory {key}")
                try:
                    yield held
                finally:
                    held.released()
                    release_session_lock(conn, lock)
        finally:
            self._lock_slots.release()

    # -- writes ---------------------------------------------------------------------------

    def apply(self, update: MemoryUpdate) -> None:
        """Write one run's effect atomically.

        Raises StaleMemoryVersion or EventsAlreadyConsolidated, having written nothing.
        """
        run = update.run
        state = update.state
        if strangers := update.strangers():
            raise StoreError(f"run {run.run_id} of {run.key} writes into {strangers}")
        # Pipelined: the statements go out together, and the transaction waits for Postgres
        # only where an answer decides what comes next (the version, the consumed events, the
        # facts written) and at COMMIT: 4 round trips instead of 10.
        with (
            translated(f"applying run {run.run_id}"),
            self._pool.connection() as conn,
            conn.pipeline(),
            fenced_transaction(conn),
        ):
            conn.execute(
                "INSERT INTO user_memory (organization_id, user_id) VALUES (%s, %s)"
                " ON CONFLICT (organization_id, user_id) DO NOTHING",
                (state.organization_id, state.user_id),
            )
            row = conn.execute(
                f"SELECT version FROM user_memory WHERE {_MEMORY} FOR UPDATE",
                (state.organization_id, state.user_id),
            ).fetchone()
            current = row[0] if row else 0
            if current != run.base_version:
                raise StaleMemoryVersion(
                    f"memory {state.key}: planned on {run.base_version}, now {current}"
                )
            conn.execute(
                "UPDATE user_memory SET working_memory = %s, information_scaffold = %s,"
                f" persistent_learned_info = %s, version = %s, updated_at = %s WHERE {_MEMORY}",
                (
                    state.working_memory,
                    Jsonb(dict(state.scaffold)),
                    Jsonb(list(state.learned_info)),
                    state.version,
                    state.updated_at,
                    state.organization_id,
                    state.user_id,
                ),
            )
            self._consume(conn, run)  # its answer brings the memory's with it
            fact_rows.write_changes(conn, run.run_id, update.fact_changes)
            append_connections(conn, state, update)
            insert_ledger(conn, update.ledger)
            # Last: its finished_at (clock_timestamp()) is then the commit's time, or nearly.
            insert_run(conn, run)

    def record_run(self, run: RunRecord, ledger: Sequence[LedgerEntry] = ()) -> None:
        """Record a run that changed nothing (failed, deferred, discarded) and what its call
        cost, in one transaction; idempotent on run_id and entry ids."""
        with transaction(self._pool, f"recording run {run.run_id}") as conn:
            insert_run(conn, run)
            insert_ledger(conn, ledger)

    def run_applied(self, run_id: uuid.UUID, started_at: datetime) -> bool:
        with statement(self._pool) as conn:
            found = conn.execute(_APPLIED, (run_id, started_at)).fetchone()
        return _exists(found)

    def insert_facts(self, facts: Sequence[Fact]) -> int:
        """Bulk-load facts made elsewhere (an import, a bench); an id already stored is left
        as it is. Returns how many were new. They are pending: the index drain embeds them."""
        with transaction(self._pool, f"inserting {len(facts)} fact(s)") as conn:
            return fact_rows.insert_new(conn, facts)

    def record_ledger(self, entries: Sequence[LedgerEntry]) -> None:
        with transaction(self._pool) as conn:
            insert_ledger(conn, entries)

    def pending_index(self, limit: int = 500, *, skip_out_of_credit: bool = False) -> list[Fact]:
        """Facts whose current version is not yet in the vector index, oldest change first."""
        return index_outbox.pending_index(self._pool, limit, skip_out_of_credit)

    def pending_backlog(self, *, skip_out_of_credit: bool = False) -> PendingBacklog:
        return index_outbox.pending_backlog(self._pool, skip_out_of_credit)

    def mark_indexed(self, facts: Sequence[Fact], at: datetime, ledger_for: Pricing) -> list[Fact]:
        """Mark these fact versions indexed and book their cost, in one transaction.

        Only versions still pending are marked (a newer version stays pending, one another
        indexer marked first is left alone), and `ledger_for` is asked to price exactly the
        ones marked here: however many indexers race, a fact version is booked once.
        Returns the facts marked.
        """
        return index_marks.mark_indexed(self._pool, facts, at, ledger_for)

    def rewrite_overtaken(
        self, written: Sequence[Fact], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        return index_marks.rewrite_overtaken(self._pool, written, write)

    def set_credit(self, key: MemoryKey, credit_micro_usd: int) -> None:
        with transaction(self._pool) as conn:
            conn.execute(
                "INSERT INTO user_credits (organization_id, user_id, credit_micro_usd)"
                " VALUES (%s, %s, %s) ON CONFLICT (organization_id, user_id) DO UPDATE"
                " SET credit_micro_usd = EXCLUDED.credit_micro_usd, updated_at = now()",
                (key.organization_id, key.user_id, credit_micro_usd),
            )

    def balance(self, key: MemoryKey) -> int | None:
        """Credit minus spend, or None when the memory has no credit line (unlimited)."""
        with statement(self._pool) as conn:
            return _balance(conn.execute(flush_sql.BALANCE, memory_params(key)).fetchone())

    # -- statements -----------------------------------------------------------------------

    @staticmethod
    def _consume(conn: psycopg.Connection[Any], run: RunRecord) -> None:
        ids = list(run.input_event_ids)
        rows = conn.execute(
            "INSERT INTO consolidated_events (event_id, run_id, organization_id, user_id)"
            " SELECT unnest(%s::uuid[]), %s, %s, %s"
            " ON CONFLICT (organization_id, user_id, event_id) DO NOTHING RETURNING event_id",
            (ids, run.run_id, run.organization_id, run.user_id),
        ).fetchall()
        if len(rows) != len(ids):
            taken = frozenset(ids) - {r[0] for r in rows}
            raise EventsAlreadyConsolidated(frozenset(taken))


def _state(key: MemoryKey, row: tuple[Any, ...] | None) -> tuple[MemoryState, uuid.UUID | None]:
    """A `flush_sql.STATE` row's memory state and generation; a memory no row holds yet is
    empty and has no generation."""
    if row is None:
        return MemoryState.empty(key), None
    *state, generation = row
    return fact_rows.state_from_row(key.user_id, state), generation


def _count(row: tuple[Any, ...] | None) -> int:
    return int(row[0]) if row else 0


def _cutoffs(rows: Sequence[tuple[Any, ...]]) -> dict[tuple[str, int], int]:
    return {(r[0], r[1]): r[2] for r in rows}


def _exists(row: tuple[Any, ...] | None) -> bool:
    return bool(row and row[0])


def _balance(row: tuple[Any, ...] | None) -> int | None:
    return None if row is None else int(row[0])
