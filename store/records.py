"""The values memoryd keeps: facts, memory state, runs, ledger entries.

Plain frozen dataclasses shared by the processors (which compute them) and the adapters in
this package (which persist them). Nothing here does I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

FACT_NAMESPACE = uuid.UUID("2b0c8a8e-5b1e-4a8f-9a6e-8a3f4f0b9d21")
RUN_NAMESPACE = uuid.UUID("0f5e7c1a-2d4b-4c8e-9e1f-6a7b8c9d0e1f")
LEDGER_NAMESPACE = uuid.UUID("9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f")

# Chroma metadata cannot hold null: "no connection" is stored as this sentinel.
NO_CONNECTION = "__none__"


class FactType(StrEnum):
    PROFILE = "profile"
    PREFERENCE = "preference"
    EPISODIC = "episodic"
    OPEN_LOOP = "open_loop"
    LORE = "lore"
    PROTOCOL = "protocol"
    REFLECTION = "reflection"


class SurfacePolicy(StrEnum):
    SPEAK = "speak"
    ADAPT = "adapt"
    AVOID = "avoid"
    CONTINUE = "continue"
    FACTCHECK = "factcheck"


class FactStatus(StrEnum):
    ACTIVE = "active"
    HELD = "held"
    STALE = "stale"
    CONTRADICTED = "contradicted"
    ARCHIVED = "archived"


class RunStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEFERRED = "deferred"
    # A usable answer not applied: a probe while bisecting a batch to find the event at fault.
    DISCARDED = "discarded"


def normalize_content(content: str) -> str:
    """The form used for identity: case and whitespace do not make a new fact."""
    return " ".join(content.split()).casefold()


def fact_id_for(user_id: str, content: str, connection_id: str | None) -> uuid.UUID:
    """UUID5 of (user, content, scope): the same fact observed twice has one id."""
    scope = connection_id or NO_CONNECTION
    return uuid.uuid5(FACT_NAMESPACE, f"{user_id}\x1f{scope}\x1f{normalize_content(content)}")


def run_id_for(user_id: str, event_ids: frozenset[uuid.UUID], attempt: int = 0) -> uuid.UUID:
    """A run is identified by the events it consolidates, so a replayed batch is the same run."""
    joined = ",".join(sorted(str(e) for e in event_ids))
    return uuid.uuid5(RUN_NAMESPACE, f"{user_id}\x1f{attempt}\x1f{joined}")


def ledger_entry_id_for(run_id: uuid.UUID, operation: str, detail: str = "") -> uuid.UUID:
    return uuid.uuid5(LEDGER_NAMESPACE, f"{run_id}\x1f{operation}\x1f{detail}")


@dataclass(frozen=True)
class Provenance:
    """Where a fact came from, copied from the events that produced it."""

    context_type: str
    source: str
    connection_id: str | None = None
    tool_id: str | None = None
    message_id: str | None = None
    attachment_id: str | None = None
    filename: str | None = None
    source_event_ids: tuple[uuid.UUID, ...] = ()


@dataclass(frozen=True)
class Fact:
    fact_id: uuid.UUID
    user_id: str
    organization_id: str
    content: str
    fact_type: FactType
    surface: SurfacePolicy
    status: FactStatus
    confidence: float
    salience: float
    provenance: Provenance
    created_by_run: uuid.UUID
    created_at: datetime
    updated_at: datetime
    pinned: bool = False
    reinforce_count: int = 0
    last_reinforced_at: datetime | None = None
    recall_count: int = 0
    last_recalled_at: datetime | None = None
    superseded_by: uuid.UUID | None = None
    indexed_at: datetime | None = None
    version: int = 1


@dataclass(frozen=True)
class MemoryState:
    """W, S and learned info of one user, at one version."""

    user_id: str
    organization_id: str
    working_memory: str = ""
    scaffold: Mapping[str, Any] = field(default_factory=dict)
    learned_info: tuple[str, ...] = ()
    version: int = 0
    updated_at: datetime | None = None


@dataclass(frozen=True)
class ConnectionContext:
    connection_id: str
    learned_info: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class LedgerEntry:
    entry_id: uuid.UUID
    user_id: str
    organization_id: str
    run_id: uuid.UUID | None
    operation: str  # "llm" | "embedding"
    model: str
    units: int  # tokens for llm, texts for embeddings
    cost_micro_usd: int
    occurred_at: datetime


@dataclass(frozen=True)
class GateCounts:
    allowed: int = 0
    held: int = 0
    discarded: int = 0
    reinforced: int = 0


@dataclass(frozen=True)
class RunRecord:
    """One synthesis, append-only: enough to fold memory back together without the LLM."""

    run_id: uuid.UUID
    user_id: str
    organization_id: str
    input_event_ids: tuple[uuid.UUID, ...]
    backend: str
    model: str
    prompt_version: str
    status: RunStatus
    started_at: datetime
    duration_ms: int
    base_version: int
    output: Mapping[str, Any] | None = None
    raw_response: str | None = None
    gate: GateCounts = GateCounts()
    usage: TokenUsage = TokenUsage()
    cost_micro_usd: int = 0
    error: str | None = None
    attempt: int = 0


class FactChangeKind(StrEnum):
    ADD = "add"
    UPDATE = "update"
    REINFORCE = "reinforce"
    CONTRADICT = "contradict"
    CLOSE_LOOP = "close_loop"
    RETRACT = "retract"  # the user deleted or corrected the fact (a fact_retraction event)


@dataclass(frozen=True)
class FactChange:
    """The full new state of one fact after a run, and what it was before (None if new)."""

    kind: FactChangeKind
    after: Fact
    before: Fact | None = None


@dataclass(frozen=True)
class MemoryUpdate:
    """Everything one consolidation run writes, applied in one Postgres transaction."""

    run: RunRecord
    state: MemoryState
    fact_changes: tuple[FactChange, ...] = ()
    connection_additions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ledger: tuple[LedgerEntry, ...] = ()

    @property
    def consumed_event_ids(self) -> tuple[uuid.UUID, ...]:
        return self.run.input_event_ids
