"""What the read path asks of the stores, and what it hands back to be written later."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from domain.model import Fact, FactStatus, MemoryState


@dataclass(frozen=True)
class Scope:
    """Which facts a read may see: the user's, from their active connections or none, with
    these statuses and context types, and of this organization when the caller names one."""

    user_id: str
    connection_ids: tuple[str, ...] = ()
    statuses: tuple[FactStatus, ...] = (FactStatus.ACTIVE,)
    context_types: tuple[str, ...] = ()
    organization_id: str | None = None

    def admits(self, fact: Fact) -> bool:
        """The rule every adapter's scope filter implements."""
        connection = fact.provenance.connection_id
        return (
            fact.user_id == self.user_id
            and (connection is None or connection in self.connection_ids)
            and fact.status in self.statuses
            and (not self.context_types or fact.provenance.context_type in self.context_types)
            and (self.organization_id is None or fact.organization_id == self.organization_id)
        )


@dataclass(frozen=True)
class Injection:
    """What every turn gets whatever the query: W, S, learned info, connections, pinned facts."""

    state: MemoryState
    connections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    pinned: tuple[Fact, ...] = ()


@dataclass(frozen=True)
class Recall:
    fact_id: uuid.UUID
    at: datetime


@dataclass(frozen=True)
class ContextLogRow:
    """One AgentContextLog: what a read injected and retrieved, how fast, degraded or not."""

    log_id: uuid.UUID
    user_id: str
    organization_id: str | None
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
