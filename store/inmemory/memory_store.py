"""`MemoryStore` and `IndexOutbox` in memory: the behaviour of `store.write.memory_store`."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

from domain.ids import MemoryKey
from domain.model import (
    MAX_LEARNED_INFO,
    ConnectionContext,
    Fact,
    FactChange,
    FactStatus,
    FlushReads,
    LedgerEntry,
    LoggedRun,
    MemoryState,
    MemoryUpdate,
    RunRecord,
    RunStatus,
)
from domain.ports import PendingBacklog, Pricing
from domain.upsert import merge_fact, written_as
from store.candidate_ranking import CONSOLIDATION_STATUSES
from store.errors import (
    EventsAlreadyConsolidated,
    MemoryBusy,
    MemoryLockLost,
    StaleMemoryVersion,
    StoreError,
)
from store.inmemory.database import InMemoryDatabase


class HeldLock:
    """A memory lock of this process: held until its block ends (no session to lose)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.released = False

    def check(self) -> None:
        if self.released:
            raise MemoryLockLost(f"{self.name}: the lock was released")


class InMemoryMemoryStore:
    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db
        self._memory_locks: dict[MemoryKey, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    # -- reads ----------------------------------------------------------------------------

    def load_state(self, key: MemoryKey) -> MemoryState:
        with self._db.lock:
            state = self._db.memory.get(key)
        return state or MemoryState.empty(key)

    def facts(
        self, key: MemoryKey, statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,)
    ) -> list[Fact]:
        with self._db.lock:
            return [f for f in self._db.user_facts(key) if f.status in statuses]

    def facts_with_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        wanted = set(fact_ids)
        with self._db.lock:
            return [f for f in self._db.user_facts(key) if f.fact_id in wanted]

    def facts_by_id(self, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        with self._db.lock:
            return [self._db.facts[i] for i in dict.fromkeys(fact_ids) if i in self._db.facts]

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        with self._db.lock:
            return [i for i in fact_ids if i not in self._db.facts]

    def connections(self, key: MemoryKey, connection_ids: Sequence[str]) -> list[ConnectionContext]:
        with self._db.lock:
            return [
                ConnectionContext(c, self._db.connections[(key, c)])
                for c in sorted(set(connection_ids))
                if (key, c) in self._db.connections
            ]

    def already_consolidated(
        self, key: MemoryKey, event_ids: Iterable[uuid.UUID]
    ) -> frozenset[uuid.UUID]:
        with self._db.lock:
            return frozenset(e for e in event_ids if (key, e) in self._db.consolidated)

    def balance(self, key: MemoryKey) -> int | None:
        with self._db.lock:
            return self._db.balance(key)

    def forgotten_before(self, subject: str) -> dict[tuple[str, int], int]:
        with self._db.lock:
            return dict(self._db.cutoffs.get(subject, {}))

    def memory_erasure_open(self, key: MemoryKey) -> bool:
        with self._db.lock:
            return key in self._db.erasing

    @contextmanager
    def locked_reads(
        self, key: MemoryKey, subject: str, event_ids: Sequence[uuid.UUID], *, wait: bool = True
    ) -> Iterator[FlushReads]:
        with self._memory_lock(key, wait):
            yield FlushReads(
                erasure_open=self.memory_erasure_open(key),
                cutoffs=self.forgotten_before(subject),
                consumed=self.already_consolidated(key, event_ids),
                state=self.load_state(key),
                balance=self.balance(key),
                known_facts=len(self.facts(key, CONSOLIDATION_STATUSES)),
                generation=self._db.generations.get(key),
            )

    # -- the memory lock ------------------------------------------------------------------

    @contextmanager
    def memory_lock(self, key: MemoryKey, wait_s: float | None = None) -> Iterator[HeldLock]:
        held = HeldLock(f"memory {key}")
        with self._memory_lock(key, wait=True, wait_s=wait_s):
            try:
                yield held
            finally:
                held.released = True

    @contextmanager
    def _memory_lock(
        self, key: MemoryKey, wait: bool, wait_s: float | None = None
    ) -> Iterator[None]:
        with self._locks_lock:
            lock = self._memory_locks.setdefault(key, threading.Lock())
        if not lock.acquire(blocking=wait, timeout=-1 if not wait or wait_s is None else wait_s):
            raise MemoryBusy(f"memory {key} is locked")
        try:
            yield
        finally:
            lock.release()

    # -- writes ---------------------------------------------------------------------------

    def apply(self, update: MemoryUpdate) -> None:
        """All of the run's effect or, raising StaleMemoryVersion or EventsAlreadyConsolidated,
        none of it: every check comes before the first write."""
        run, state = update.run, update.state
        if strangers := update.strangers():
            raise StoreError(f"run {run.run_id} of {run.key} writes into {strangers}")
        key = state.key
        with self._db.lock:
            current = self._db.memory.get(key)
            version = 0 if current is None else current.version
            if version != run.base_version:
                raise StaleMemoryVersion(
                    f"memory {key}: planned on {run.base_version}, now {version}"
                )
            taken = frozenset(e for e in run.input_event_ids if (key, e) in self._db.consolidated)
            if taken:
                raise EventsAlreadyConsolidated(frozenset(taken))
            for event_id in run.input_event_ids:
                self._db.consolidated[(key, event_id)] = run.run_id
            self._insert_run(run)
            # Through JSON, as Postgres stores S (jsonb): what is read back is a copy.
            scaffold = json.loads(json.dumps(dict(state.scaffold)))
            self._db.memory[key] = replace(
                state, scaffold=scaffold, learned_info=tuple(state.learned_info)
            )
            self._db.generations.setdefault(key, uuid.uuid4())
            self._write_changes(update.fact_changes)
            for connection_id, additions in update.connection_additions.items():
                row = (key, connection_id)
                kept = (*self._db.connections.get(row, ()), *additions)
                self._db.connections[row] = kept[-MAX_LEARNED_INFO:]
            self._insert_ledger(update.ledger)

    def record_run(self, run: RunRecord, ledger: Sequence[LedgerEntry] = ()) -> None:
        with self._db.lock:
            self._insert_run(run)
            self._insert_ledger(ledger)

    def run_applied(self, run_id: uuid.UUID, started_at: datetime) -> bool:
        with self._db.lock:
            logged = self._db.runs.get(run_id)
        return (
            logged is not None
            and logged.run.started_at == started_at
            and logged.run.status is RunStatus.SUCCEEDED
        )

    def record_ledger(self, entries: Sequence[LedgerEntry]) -> None:
        with self._db.lock:
            self._insert_ledger(entries)

    def set_credit(self, key: MemoryKey, credit_micro_usd: int) -> None:
        with self._db.lock:
            self._db.credits[key] = credit_micro_usd

    # -- the index outbox -----------------------------------------------------------------

    def _pending(self, skip_out_of_credit: bool) -> list[Fact]:
        with self._db.lock:
            return [
                f
                for f in self._db.facts.values()
                if f.indexed_at is None and not (skip_out_of_credit and self._out_of_credit(f.key))
            ]

    def pending_index(self, limit: int = 500, *, skip_out_of_credit: bool = False) -> list[Fact]:
        pending = self._pending(skip_out_of_credit)
        return sorted(pending, key=lambda f: (f.updated_at, f.fact_id))[:limit]

    def pending_backlog(self, *, skip_out_of_credit: bool = False) -> PendingBacklog:
        changed = [f.updated_at for f in self._pending(skip_out_of_credit)]
        return PendingBacklog(count=len(changed), oldest=min(changed, default=None))

    def mark_indexed(self, facts: Sequence[Fact], at: datetime, ledger_for: Pricing) -> list[Fact]:
        with self._db.lock:
            marked = []
            for fact in facts:
                stored = self._db.facts.get(fact.fact_id)
                if (
                    stored is not None
                    and stored.indexed_at is None
                    and written_as(stored) == written_as(fact)
                ):
                    self._db.facts[fact.fact_id] = replace(stored, indexed_at=at)
                    marked.append(fact)
            self._insert_ledger(ledger_for(marked))
        return marked

    def rewrite_overtaken(
        self, written: Sequence[Fact], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        with self._db.lock:
            overtaken = [
                stored
                for fact in written
                if (stored := self._db.facts.get(fact.fact_id)) is not None
                and (stored.indexed_at is None or written_as(stored) != written_as(fact))
            ]
            if overtaken:
                write(overtaken)
        return overtaken

    # -- statements -----------------------------------------------------------------------

    def _insert_run(self, run: RunRecord) -> None:
        if run.run_id not in self._db.runs:
            seq = len(self._db.runs) + 1
            self._db.runs[run.run_id] = LoggedRun(seq, self._db.clock(), run)

    def _write_changes(self, changes: Sequence[FactChange]) -> None:
        for change in changes:
            after = change.after
            stored = self._db.facts.get(after.fact_id)
            # New rows are pending for the index whatever the caller's value says.
            written = merge_fact(stored, replace(after, indexed_at=None))
            self._db.facts[after.fact_id] = written

    def _insert_ledger(self, entries: Sequence[LedgerEntry]) -> None:
        for entry in entries:
            self._db.ledger.setdefault(entry.entry_id, entry)

    def _out_of_credit(self, key: MemoryKey) -> bool:
        balance = self._db.balance(key)
        return balance is not None and balance <= 0
