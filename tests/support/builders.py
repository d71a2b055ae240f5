"""Values for tests, with one set of defaults: events, facts, runs, seeded memory."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from consumers.batching import BufferedEvent, TopicPartition
from domain.codec import fact_to_json
from domain.ids import MemoryKey, fact_id_for
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    FactType,
    LoggedRun,
    MemoryUpdate,
    Provenance,
    RunRecord,
    RunStatus,
    SurfacePolicy,
)
from domain.ports import MemoryStore, VectorHit, VectorIndex
from domain.reads import ContextLogRow, Scope
from producers.contract import ContextEvent, EventType, Source, SourceMetadata

BASE_TIME = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
SEED_RUN = uuid.UUID(int=1)


def key_of(user_id: str, org: str = "org-a") -> MemoryKey:
    """The memory of a user of an organization (org-a, as every builder's default)."""
    return MemoryKey(org, user_id)


def nearest(
    index: VectorIndex, key: MemoryKey, text: str, n: int = 10, **scope: Any
) -> list[VectorHit]:
    """`index.query` in key's scope: active facts of no connection unless `scope` sets the
    other fields of the Scope (`connection_ids=`, `statuses=`, `context_types=`)."""
    return index.query(Scope(key, **{k: tuple(v) for k, v in scope.items()}), text, n)


_PROVENANCE = frozenset(f.name for f in fields(Provenance))


def make_event(
    user_id: str,
    content: str,
    event_type: EventType = EventType.FACT,
    *,
    minutes: int = 0,
    org: str = "org-a",
    source: Source = Source.INTERACTIVE,
    connection_id: str | None = None,
    at: datetime | None = None,
    **extra: Any,
) -> ContextEvent:
    """An event `minutes` after BASE_TIME (or `at`); `extra` sets any other field of the event
    or of its source metadata (`tool_id=`, `filename=`, `scaffold_key=`...)."""
    meta = {
        k: extra.pop(k)
        for k in ("tool_id", "attachment_id", "filename", "message_id", "session_id")
        if k in extra
    }
    return ContextEvent(
        event_id=uuid.uuid4(),
        user_id=user_id,
        organization_id=org,
        event_type=event_type,
        content=content,
        source_metadata=SourceMetadata(source=source, connection_id=connection_id, **meta),
        occurred_at=BASE_TIME + timedelta(minutes=minutes) if at is None else at,
        **extra,
    )


def buffered(
    events: Sequence[ContextEvent], topic: str = "context-events", partition: int = 0
) -> list[BufferedEvent]:
    """Events as a processor holds them: read from one partition, at offsets 0, 1, 2..."""
    return [BufferedEvent(TopicPartition(topic, partition), i, e) for i, e in enumerate(events)]


def make_fact(
    user_id: str,
    content: str,
    *,
    org: str = "org-a",
    connection_id: str | None = None,
    at: datetime = BASE_TIME,
    **changes: Any,
) -> Fact:
    """An active profile fact with its deterministic id; `changes` set any field of the fact
    or of its provenance (`status=`, `pinned=`, `context_type=`, `source_event_ids=`...)."""
    on_provenance = {k: changes.pop(k) for k in list(changes) if k in _PROVENANCE}
    fact = Fact(
        fact_id=fact_id_for(MemoryKey(org, user_id), content, connection_id),
        user_id=user_id,
        organization_id=org,
        content=content,
        fact_type=FactType.PROFILE,
        surface=SurfacePolicy.SPEAK,
        status=FactStatus.ACTIVE,
        confidence=0.9,
        salience=0.5,
        provenance=Provenance(
            context_type="fact", source="interactive", connection_id=connection_id
        ),
        created_by_run=SEED_RUN,
        created_at=at,
        updated_at=at,
    )
    return replace(fact, provenance=replace(fact.provenance, **on_provenance), **changes)


def make_run(
    user_id: str,
    *,
    seq: int,
    version: int,
    facts: Sequence[tuple[FactChangeKind, Fact]] = (),
    working_memory: str = "",
    scaffold: Mapping[str, Any] | None = None,
    learned: Sequence[str] = (),
    connections: Mapping[str, Sequence[str]] | None = None,
    status: RunStatus = RunStatus.SUCCEEDED,
    base: int | None = None,
    at: datetime | None = None,
    org: str = "org-a",
) -> LoggedRun:
    """A logged run whose recorded `applied` effect a fold can replay."""
    at = BASE_TIME + timedelta(minutes=seq) if at is None else at
    applied = {
        "working_memory": working_memory,
        "scaffold": dict(scaffold or {}),
        "learned_info": list(learned),
        "version": version,
        "facts": [{"kind": k.value, "after": fact_to_json(f)} for k, f in facts],
        "connection_additions": {k: list(v) for k, v in (connections or {}).items()},
    }
    record = RunRecord(
        run_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{org}-{user_id}-{seq}"),
        user_id=user_id,
        organization_id=org,
        input_event_ids=(uuid.uuid5(uuid.NAMESPACE_OID, f"{user_id}-event-{seq}"),),
        backend="offline",
        model="offline-deterministic-v1",
        prompt_version="offline-v1",
        status=status,
        started_at=at,
        duration_ms=5,
        base_version=version - 1 if base is None else base,
        output={"applied": applied} if status is RunStatus.SUCCEEDED else None,
    )
    return LoggedRun(seq=seq, finished_at=at, run=record)


def seed_update(
    store: MemoryStore,
    user_id: str,
    facts: Sequence[Fact],
    *,
    org: str = "org-a",
    working_memory: str = "",
    learned_info: Sequence[str] = (),
    connections: Mapping[str, tuple[str, ...]] | None = None,
    at: datetime = BASE_TIME,
) -> MemoryUpdate:
    """One run's worth of memory for a user, planned on what the store holds now (not
    applied: `seed` applies it)."""
    state = store.load_state(MemoryKey(org, user_id))
    run_id = uuid.uuid4()
    run = RunRecord(
        run_id=run_id,
        user_id=user_id,
        organization_id=org,
        input_event_ids=(uuid.uuid4(),),
        backend="seed",
        model="seed",
        prompt_version="seed",
        status=RunStatus.SUCCEEDED,
        started_at=at,
        duration_ms=0,
        base_version=state.version,
    )
    return MemoryUpdate(
        run=run,
        state=replace(
            state,
            organization_id=org,
            working_memory=working_memory or state.working_memory,
            learned_info=(*state.learned_info, *learned_info),
            version=state.version + 1,
            updated_at=at,
        ),
        fact_changes=tuple(
            FactChange(FactChangeKind.ADD, replace(f, created_by_run=run_id)) for f in facts
        ),
        connection_additions=dict(connections or {}),
    )


def seed(store: MemoryStore, user_id: str, facts: Sequence[Fact], **kw: Any) -> MemoryUpdate:
    """Memory written through the store as a consolidation run would write it."""
    update = seed_update(store, user_id, facts, **kw)
    store.apply(update)
    return update


def log_row(
    key: MemoryKey,
    *,
    generation: uuid.UUID | None,
    recalled: Sequence[Fact] = (),
    at: datetime = BASE_TIME,
    log_id: uuid.UUID | None = None,
    read_at: datetime | None = None,
) -> ContextLogRow:
    """A chat turn's audit row on the memory `key` at `generation`, which recalled `recalled`,
    written `at` of a turn that read `read_at` (by default `at`)."""
    return ContextLogRow(
        log_id=log_id or uuid.uuid4(),
        user_id=key.user_id,
        organization_id=key.organization_id,
        query="where does ada live?",
        rewritten_query=None,
        memory_version=1,
        budget="balanced",
        connection_ids=("mail",),
        injected={"working_memory_chars": 10},
        retrieved=[{"fact_id": str(f.fact_id)} for f in recalled],
        latency_ms=3.5,
        degraded=False,
        degraded_reason=None,
        created_at=at,
        read_at=at if read_at is None else read_at,
        generation=generation,
        recalled=tuple(f.fact_id for f in recalled),
    )
