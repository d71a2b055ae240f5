"""What the read path asks of the stores, and what it hands back to be written later."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus, MemoryState


@dataclass(frozen=True)
class Scope:
    """Which facts a read may see: the memory's (an organization's user), from its active
    connections or none, with these statuses and context types."""

    key: MemoryKey
    connection_ids: tuple[str, ...] = ()
    statuses: tuple[FactStatus, ...] = (FactStatus.ACTIVE,)
    context_types: tuple[str, ...] = ()

    def admits(self, fact: Fact) -> bool:
        """The rule every adapter's scope filter implements."""
        connection = fact.provenance.connection_id
        return (
            fact.key == self.key
            and (connection is None or connection in self.connection_ids)
            and fact.status in self.statuses
            and (not self.context_types or fact.provenance.context_type in self.context_types)
        )


@dataclass(frozen=True)
class MemoryStamp:
    """What says a cached injection is current: the same generation of the memory (a forget
    or a fact erasure starts a new one) at the same version (a run increments it)."""

    generation: uuid.UUID | None
    version: int


@dataclass(frozen=True)
class Injection:
    """What every turn gets whatever the query: W, S, learned info, connections, pinned facts."""

    state: MemoryState
    connections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pinned: tuple[Fact, ...] = ()
    generation: uuid.UUID | None = None  # None: the memory does not exist (yet, or any more)

    @property
    def stamp(self) -> MemoryStamp:
        return MemoryStamp(self.generation, self.state.version)


@dataclass(frozen=True)
class FactCounters:
    """A stored fact's version and recall counters: what a turn ranked on a memory entry's
    rows reads back of the facts it picked (the rest of a row changes only with its version)."""

    version: int
    recall_count: int
    last_recalled_at: datetime | None

    def applied_to(self, fact: Fact) -> Fact:
        """`fact` (a row at this version) with these counters."""
        return replace(fact, recall_count=self.recall_count, last_recalled_at=self.last_recalled_at)


@dataclass(frozen=True)
class ContextLogRow:
    """One AgentContextLog: what a read injected and retrieved, how fast, degraded or not."""

    log_id: uuid.UUID
    user_id: str
    organization_id: str
    query: str
    rewritten_query: str | None
    memory_version: int
    budget: str
    connection_ids: tuple[str, ...]
    injected: Mapping[str, Any]
    retrieved: Sequence[Mapping[str, Any]]
    latency_ms: float
    degraded: bool
    degraded_reason: str | None
    created_at: datetime
    # When the turn started reading the memory. A memory with no generation yet has none to
    # change: a row of such a turn is dropped when an erasure of the memory completed since.
    read_at: datetime
    # The memory's generation the turn read (None: the memory did not exist). A row written
    # once the memory was erased since (or while an erasure of it is open) is dropped: its
    # query may say what was erased.
    generation: uuid.UUID | None = None
    # The facts the turn retrieved: their recall counters go up when the row is first
    # written, so a retried turn (same log id) counts its recalls once.
    recalled: tuple[uuid.UUID, ...] = ()
