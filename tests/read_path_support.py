"""Seeding memory straight through the store (as a consolidation run would write it), so read
path tests control every fact's status, surface, scope and pinning."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from domain.ids import MemoryKey, fact_id_for
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    FactType,
    MemoryUpdate,
    Provenance,
    RunRecord,
    RunStatus,
    SurfacePolicy,
)
from memoryd import wiring

SEEDED_AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def make_fact(
    user_id: str,
    content: str,
    *,
    org: str = "org-a",
    connection_id: str | None = None,
    surface: SurfacePolicy = SurfacePolicy.SPEAK,
    status: FactStatus = FactStatus.ACTIVE,
    pinned: bool = False,
    salience: float = 0.6,
    context_type: str = "fact",
    fact_type: FactType = FactType.PROFILE,
) -> Fact:
    return Fact(
        fact_id=fact_id_for(MemoryKey(org, user_id), content, connection_id),
        user_id=user_id,
        organization_id=org,
        content=content,
        fact_type=fact_type,
        surface=surface,
        status=status,
        confidence=0.9,
        salience=salience,
        provenance=Provenance(
            context_type=context_type,
            source="interactive",
            connection_id=connection_id,
            message_id=f"msg-{zlib.crc32(content.encode())}",
        ),
        created_by_run=uuid.UUID(int=1),
        created_at=SEEDED_AT,
        updated_at=SEEDED_AT,
        pinned=pinned,
    )


def seed(
    c: wiring.Core,
    user_id: str,
    facts: Sequence[Fact],
    *,
    org: str = "org-a",
    working_memory: str = "",
    learned_info: Sequence[str] = (),
    connections: Mapping[str, tuple[str, ...]] | None = None,
    index: bool = True,
) -> MemoryUpdate:
    """One run's worth of memory for a user, applied and indexed like the processor does."""
    state = c.memory.load_state(MemoryKey(org, user_id))
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
        started_at=SEEDED_AT,
        duration_ms=0,
        base_version=state.version,
    )
    update = MemoryUpdate(
        run=run,
        state=replace(
            state,
            organization_id=org,
            working_memory=working_memory or state.working_memory,
            learned_info=(*state.learned_info, *learned_info),
            version=state.version + 1,
            updated_at=SEEDED_AT,
        ),
        fact_changes=tuple(
            FactChange(FactChangeKind.ADD, replace(f, created_by_run=run_id)) for f in facts
        ),
        connection_additions=dict(connections or {}),
    )
    c.memory.apply(update)
    if index:
        wiring.indexer(c).index_changes(update)
    return update
