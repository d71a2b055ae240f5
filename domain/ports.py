"""The seams between the logic and the adapters: what each side may ask of the other.

`store` implements them twice, over Postgres and Chroma and in memory (`store.inmemory`);
`consumers` and the read path depend on these Protocols only, so they run on either. The same
contract suites (`tests/contracts/`) hold both implementations to one behaviour.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from domain.ids import MemoryKey
from domain.model import (
    ConnectionContext,
    Fact,
    FactStatus,
    FlushReads,
    KafkaCoordinates,
    LedgerEntry,
    LoggedEvent,
    LoggedRun,
    MemoryState,
    MemoryUpdate,
    RunRecord,
)
from domain.reads import ContextLogRow, FactCounters, Injection, MemoryStamp, Scope

__all__ = [
    "Appended",
    "Clock",
    "Embedder",
    "EventLog",
    "FactQuery",
    "FactSearch",
    "IndexContents",
    "IndexOutbox",
    "IndexedFacts",
    "InjectionReads",
    "MemoryStore",
    "MetadataValue",
    "Pricing",
    "ReadModel",
    "RelatedFacts",
    "RunLog",
    "StoredFact",
    "Vector",
    "VectorHit",
    "VectorIndex",
]

# The time as the logic sees it: injected, so tests and replays choose it.
Clock = Callable[[], datetime]
# The ledger entries that book exactly the facts given (those an indexer marked indexed).
Pricing = Callable[[Sequence[Fact]], Sequence[LedgerEntry]]
Vector = npt.NDArray[np.float32]
MetadataValue = str | int | float | bool

E = TypeVar("E")


@dataclass(frozen=True)
class Appended:
    inserted: int  # new rows
    forgotten: int  # events of an erased memory recorded before its tombstone: not stored


@dataclass(frozen=True)
class PendingBacklog:
    """The facts `IndexOutbox.pending_index` would return without a limit: how many, and
    the change (`updated_at`) of the first of them; None when none is pending."""

    count: int
    oldest: datetime | None


class Embedder(Protocol):
    """Texts to L2-normalised vectors; deterministic for a given model file."""

    model_name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[Vector]: ...


@dataclass(frozen=True)
class VectorHit:
    fact_id: uuid.UUID
    similarity: float  # cosine similarity, 1.0 = identical
    content: str
    metadata: Mapping[str, MetadataValue]


class VectorIndex(Protocol):
    """Tier V: facts embedded and filtered by memory, connection, status and context type.

    Derived from the memory store and rebuilt by upserting every fact again. Failures raise
    `store.errors.VectorIndexUnavailable`; the facts then stay pending in the store.
    """

    def upsert(self, facts: Sequence[Fact]) -> int:
        """Index facts under their fact id; idempotent. Returns how many texts were embedded."""
        ...

    def update_status(self, statuses: Mapping[uuid.UUID, FactStatus]) -> None:
        """Change the status of indexed facts without embedding them again; ids it does not
        hold are ignored."""
        ...

    def query(self, scope: Scope, text: str, n: int) -> list[VectorHit]:
        """The n facts of scope nearest to text (`Scope.admits` says which facts are in it).

        An empty `scope.statuses` matches nothing; empty `scope.context_types` do not filter.
        """
        ...

    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        """The stored vectors of these facts (those not indexed are absent)."""
        ...

    def score(
        self, text: str, fact_ids: Sequence[uuid.UUID], n: int
    ) -> tuple[list[VectorHit], dict[uuid.UUID, Vector]]:
        """Exact search over known fact ids: the n best hits, and every vector fetched."""
        ...

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None: ...

    def delete_memory(self, key: MemoryKey) -> None:
        """Delete every vector of the memory, whatever ids the store still knows."""
        ...

    def count(self, key: MemoryKey | None = None) -> int: ...


class HeldLock(Protocol):
    """A lock as its holder has it. A lock of the database can be lost while held (its
    session ends with a dropped connection), and another process take it meanwhile."""

    def check(self) -> None:
        """Raise (a `DatabaseUnavailable`: retried later) unless the lock is still held."""
        ...


class MemoryStore(Protocol):
    """The system of record as one flush uses it: W, S, facts, runs, credit.

    `apply` writes a run's whole effect atomically, or raises `StaleMemoryVersion` /
    `EventsAlreadyConsolidated` having written nothing; that is what makes redelivery harmless.
    """

    def memory_lock(
        self, key: MemoryKey, wait_s: float | None = None
    ) -> AbstractContextManager[HeldLock]:
        """Held for a whole flush (or erasure): no two of one memory run at once, anywhere.
        With `wait_s`, raises MemoryBusy holding nothing once another held it that long."""
        ...

    def load_state(self, key: MemoryKey) -> MemoryState: ...

    def facts(
        self, key: MemoryKey, statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,)
    ) -> list[Fact]:
        """The memory's facts with these statuses, by creation time then fact id."""
        ...

    def facts_with_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        """The memory's facts among these ids, whatever their status."""
        ...

    def connections(
        self, key: MemoryKey, connection_ids: Sequence[str]
    ) -> list[ConnectionContext]: ...

    def already_consolidated(
        self, key: MemoryKey, event_ids: Iterable[uuid.UUID]
    ) -> frozenset[uuid.UUID]: ...

    def balance(self, key: MemoryKey) -> int | None:
        """Credit minus spend in micro-USD, or None when the memory has no credit line."""
        ...

    def forgotten_before(self, subject: str) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the first offset an erasure of the memory with this digest
        did not forget; empty for a memory never erased."""
        ...

    def memory_erasure_open(self, key: MemoryKey) -> bool:
        """Whether an erasure of the whole memory is under way (its flushes wait)."""
        ...

    def locked_reads(
        self, key: MemoryKey, subject: str, event_ids: Sequence[uuid.UUID], *, wait: bool = True
    ) -> AbstractContextManager[FlushReads]:
        """`memory_lock`, and under it `memory_erasure_open`, `forgotten_before(subject)`,
        `already_consolidated`, `load_state` and `balance` of the memory, read together.
        Without `wait`, raises MemoryBusy instead of waiting for another holder of the lock."""
        ...

    def apply(self, update: MemoryUpdate) -> None: ...

    def record_run(self, run: RunRecord, ledger: Sequence[LedgerEntry] = ()) -> None:
        """Record a run that changed nothing (failed, deferred, discarded) and what its call
        cost, in one transaction; idempotent on run_id and entry ids."""
        ...

    def run_applied(self, run_id: uuid.UUID, started_at: datetime) -> bool:
        """Whether the run `run_id` started at `started_at` was applied: an `apply` that raised
        may have committed all the same (the connection lost in COMMIT)."""
        ...


@dataclass(frozen=True)
class FactQuery:
    """Facts related to `text`, among those of `connection_id` or of no connection."""

    text: str
    connection_id: str | None = None


@dataclass(frozen=True)
class RelatedFacts:
    """Per query, the facts most related to it, best first."""

    ranked: tuple[tuple[Fact, ...], ...]
    # Why a retriever was left out (the vector index was down): the rankings are keyword-only.
    degraded: str | None = None


class FactSearch(Protocol):
    """What consolidation may look up among one memory's active and held facts.

    Every method is scoped by the memory's key (organization, user): user ids are chosen by
    customers and collide across organizations.
    """

    def related(self, key: MemoryKey, queries: Sequence[FactQuery], limit: int) -> RelatedFacts:
        """At most `limit` facts per query (dense + keyword, fused), in query order."""
        ...

    def pinned(self, key: MemoryKey) -> list[Fact]: ...

    def by_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]: ...

    def count(self, key: MemoryKey) -> int: ...


class IndexOutbox(Protocol):
    """The facts the vector index has not got yet, and the booking of those it got."""

    def facts_by_id(self, fact_ids: Sequence[uuid.UUID]) -> list[Fact]: ...

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """The ids among these no row holds (erased while they were being indexed)."""
        ...

    def pending_index(self, limit: int = 500, *, skip_out_of_credit: bool = False) -> list[Fact]:
        """Facts whose current version is not indexed, oldest change first."""
        ...

    def pending_backlog(self, *, skip_out_of_credit: bool = False) -> PendingBacklog:
        """The backlog `pending_index` with the same `skip_out_of_credit` reads from, counted
        and dated in one read, so the count and the age describe the same rows."""
        ...

    def mark_indexed(self, facts: Sequence[Fact], at: datetime, ledger_for: Pricing) -> list[Fact]:
        """Mark the versions still pending as indexed and book `ledger_for(marked)` with them,
        atomically; returns the facts marked (a version is marked, and booked, once)."""
        ...

    def rewrite_overtaken(
        self, written: Sequence[Fact], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        """Hand `write` the current rows of those of these facts (versions an indexer wrote
        to the index but did not mark) that are not indexed at the version written, with no
        new version written or marked meanwhile; returns those rows. Books nothing: the
        version the index gets back is booked by whoever marks it."""
        ...


@dataclass(frozen=True)
class StoredFact:
    """What the vector index holds under a fact id besides its vector."""

    document: str
    metadata: Mapping[str, MetadataValue]


class IndexContents(Protocol):
    """The vector index read back, to check it against the store (`memoryd index-verify`)."""

    def stored(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, StoredFact]:
        """The text and metadata held for these facts (those it does not hold are absent)."""
        ...

    def ids_page(self, offset: int, limit: int) -> list[str]:
        """Up to `limit` of the ids it holds, from `offset` in its own stable order."""
        ...

    def upsert(self, facts: Sequence[Fact]) -> int: ...

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None: ...


class IndexedFacts(Protocol):
    """The facts the store has marked indexed, walked in id order, and their repair."""

    def indexed_after(self, after: uuid.UUID | None, limit: int) -> list[Fact]:
        """Up to `limit` facts marked indexed, of id greater than `after`, in id order."""
        ...

    def repair(
        self, fact_ids: Sequence[uuid.UUID], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        """Hand `write` the current rows of these facts that are still marked indexed, with
        no new version of them written meanwhile, and mark them written again so that a
        memory's cached entries take them up at its next version; returns those rows. A fact
        another writer is writing at that moment is left out, not waited for."""
        ...

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """The ids among these no row holds."""
        ...


class InjectionReads(Protocol):
    """What every turn is given whatever its query, and the version that says it changed."""

    def memory_stamp(self, key: MemoryKey) -> MemoryStamp | None: ...

    def memory_stamps(self, keys: Sequence[MemoryKey]) -> dict[MemoryKey, MemoryStamp]: ...

    def injection(self, key: MemoryKey) -> Injection | None: ...


class ReadModel(InjectionReads, Protocol):
    """The read side of memory a chat turn needs; every fact query is bounded by a `Scope`."""

    def keyword_search(self, scope: Scope, text: str, limit: int) -> list[Fact]:
        """Facts in scope sharing a word with text, best match first."""
        ...

    def keyword_searches(
        self, searches: Sequence[tuple[Scope, str]], limit: int
    ) -> list[list[Fact]]:
        """`keyword_search` of each (scope, text), answered together."""
        ...

    def indexed_ids(self, scope: Scope, limit: int) -> list[uuid.UUID]:
        """Ids of facts in scope whose current version is in the vector index."""
        ...

    def facts_in_scope(self, scope: Scope, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        """The current rows of these facts that are still in scope (the index may lag)."""
        ...

    def fact_counters(
        self, scope: Scope, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, FactCounters]:
        """The version and recall counters of these facts that are still in scope."""
        ...

    def write_context_logs(self, rows: Sequence[ContextLogRow]) -> None:
        """Idempotent on log_id; counts the recalls of the rows it writes."""
        ...


class EventLog(Protocol[E]):
    """The append-only log of raw events.

    Generic over the event type: the event contract belongs to `producers`, which sits beside
    `domain`, not below it, so the domain cannot name it.
    """

    def append(self, events: Sequence[tuple[E, KafkaCoordinates | None]]) -> Appended:
        """Insert in one transaction what no erasure forgot; duplicates insert nothing."""
        ...

    def user_events(
        self, key: MemoryKey, *, until: datetime | None = None
    ) -> list[LoggedEvent[E]]: ...


class RunLog(Protocol):
    """The append-only log of consolidation runs, the derived log that replay folds."""

    def runs(self, key: MemoryKey) -> list[LoggedRun]:
        """Every run of the memory (all statuses), in log order."""
        ...
