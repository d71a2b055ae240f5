"""The adapters a contract suite runs against: each test runs once per implementation.

`memory` needs nothing; `postgres` a fresh database of the session's Postgres and the
`chroma-*` ones a Chroma (embedded in a temporary directory, or the session's server), which
is why those are marked `integration`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from chromadb.api import ClientAPI

from domain.erasure import ErasureScope
from domain.ids import MemoryKey, SubjectHasher
from domain.ports import (
    EventLog,
    IndexContents,
    IndexOutbox,
    MemoryStore,
    ReadModel,
    RunLog,
    VectorIndex,
)
from producers.contract import ContextEvent
from store.chroma import ChromaVectorIndex, close_client, embedded_client, http_client
from store.embeddings import MiniLmEmbedder
from store.inmemory import (
    InMemoryDatabase,
    InMemoryEventLog,
    InMemoryMemoryStore,
    InMemoryReadModel,
    InMemoryRunLog,
    InMemoryVectorIndex,
)
from store.migrate import migrate
from store.postgres import make_pool
from store.read.fact_queries import PostgresReadModel
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.memory_store import PostgresMemoryStore
from store.write.run_log import PostgresRunLog

integration = pytest.mark.integration


class Store(MemoryStore, IndexOutbox, Protocol):
    """Both ports of the memory store, and the credit line tests set."""

    def set_credit(self, key: MemoryKey, credit_micro_usd: int) -> None: ...


class Index(VectorIndex, IndexContents, Protocol):
    """The index as the read path and the indexer use it, and as its check reads it back."""


class Reads(ReadModel, Protocol):
    def context_logs(self, key: MemoryKey, limit: int | None = 100) -> list[dict[str, Any]]: ...


SUBJECTS = SubjectHasher(b"contract-subject-key")
# Record an erasure's cut-off of a memory: (memory, topic, partition, first offset kept).
Cut = Callable[[MemoryKey, str, int, int], None]
# Start an erasure of the whole memory and leave it running.
OpenErasure = Callable[[MemoryKey], None]
# Record an event an erased fact came from, as erase_fact does (migration 0014).
Redact = Callable[[MemoryKey, uuid.UUID], None]


@dataclass(frozen=True)
class Stores:
    """The adapters over one database, which see each other's writes."""

    memory: Store
    reads: Reads
    runs: RunLog
    events: EventLog[ContextEvent]
    cut: Cut  # what an erasure records; the stores must then forget what lies before it
    open_erasure: OpenErasure
    redact: Redact


@pytest.fixture(params=["memory", pytest.param("postgres", marks=integration)])
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    if request.param == "memory":
        db = InMemoryDatabase()

        def cut_in_memory(key: MemoryKey, topic: str, partition: int, offset: int) -> None:
            db.cutoffs.setdefault(SUBJECTS(key), {})[(topic, partition)] = offset

        yield Stores(
            InMemoryMemoryStore(db),
            InMemoryReadModel(db),
            InMemoryRunLog(db),
            InMemoryEventLog(db, SUBJECTS),
            cut_in_memory,
            db.erasing.add,
            lambda key, event_id: db.redacted.setdefault(SUBJECTS(key), set()).add(event_id),
        )
        return
    pool = make_pool(request.getfixturevalue("fresh_database"), max_size=4)

    def cut_in_postgres(key: MemoryKey, topic: str, partition: int, offset: int) -> None:
        with pool.connection() as conn:
            conn.execute(
                "INSERT INTO memory_cutoffs (subject, topic, partition, cutoff, erasure_id)"
                " VALUES (%s, %s, %s, %s, gen_random_uuid())",
                (SUBJECTS(key), topic, partition, offset),
            )

    def open_erasure_in_postgres(key: MemoryKey) -> None:
        PostgresErasureLog(pool).start(
            uuid.uuid4(),
            subject=SUBJECTS(key),
            scope=ErasureScope.MEMORY,
            key=key,
            fact_id=None,
            actor="contract test",
            reason="an erasure under way",
        )

    def redact_in_postgres(key: MemoryKey, event_id: uuid.UUID) -> None:
        with pool.connection() as conn:
            conn.execute(
                "INSERT INTO redacted_events (subject, event_id, erasure_id)"
                " VALUES (%s, %s, gen_random_uuid())",
                (SUBJECTS(key), event_id),
            )

    try:
        migrate(pool)
        yield Stores(
            PostgresMemoryStore(pool),
            PostgresReadModel(pool, SUBJECTS),
            PostgresRunLog(pool),
            # Two memories a transaction: every batch of the contract over more is appended
            # in parts, and must still read exactly as the in-memory log's.
            PostgresEventLog(pool, SUBJECTS, max_memories_per_transaction=2),
            cut_in_postgres,
            open_erasure_in_postgres,
            redact_in_postgres,
        )
    finally:
        pool.close()


@pytest.fixture(scope="session")
def embedder() -> MiniLmEmbedder:
    e = MiniLmEmbedder()
    e.load()
    return e


@pytest.fixture(
    params=[
        "memory",
        pytest.param("chroma-embedded", marks=integration),
        pytest.param("chroma-server", marks=integration),
    ]
)
def vector_index(
    request: pytest.FixtureRequest, embedder: MiniLmEmbedder, tmp_path: Path
) -> Iterator[Index]:
    if request.param == "memory":
        yield InMemoryVectorIndex(embedder)
        return
    client: ClientAPI
    if request.param == "chroma-embedded":
        client = embedded_client(tmp_path / "chroma")
    else:
        client = http_client(request.getfixturevalue("chroma_url"))
    # Unique per test: the server is shared by the whole session.
    name = f"facts-{uuid.uuid4().hex[:12]}"
    try:
        yield ChromaVectorIndex(client, embedder, name)
    finally:
        if name in {c.name for c in client.list_collections()}:
            client.delete_collection(name)
        close_client(client)
