"""The values memoryd keeps: facts, memory state, runs, ledger entries.

Plain frozen dataclasses shared by the processors (which compute them) and the adapters in
`store` (which persist them). Nothing here does I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from domain.ids import MemoryKey, OfMemory

E = TypeVar("E")


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
class Fact(OfMemory):
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
    # When the events behind the fact happened (their occurred_at, latest first seen), not when
    # a run consolidated them; the date the fact's own words name ("yesterday" resolved), if
    # any; and who it is about when that is not the user (a transcript's speaker).
    observed_at: datetime | None = None
    event_date: date | None = None
    subject: str | None = None


# The latest lines of learned info a memory keeps, and each of its connections: all of it is
# shown in every prompt, so it must not grow with the memory's age.
MAX_LEARNED_INFO = 200


@dataclass(frozen=True)
class MemoryState(OfMemory):
    """W, S and learned info of one user, at one version."""

    user_id: str
    organization_id: str
    working_memory: str = ""
    scaffold: Mapping[str, Any] = field(default_factory=dict)
    learned_info: tuple[str, ...] = ()
    version: int = 0
    updated_at: datetime | None = None

    @classmethod
    def empty(cls, key: MemoryKey) -> MemoryState:
        return cls(user_id=key.user_id, organization_id=key.organization_id)


@dataclass(frozen=True)
class ConnectionContext:
    connection_id: str
    learned_info: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of prompt_tokens, those served from the provider's context cache (billed lower).
    cached_prompt_tokens: int = 0

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
class RunRecord(OfMemory):
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
    # Maintenance (processors/maintenance.py): time and the duplicate sweep, not a backend.
    EXPIRE = "expire"  # active -> stale
    ARCHIVE = "archive"  # stale -> archived
    MERGE = "merge"  # a duplicate superseded by its stronger twin, or the twin absorbing it


@dataclass(frozen=True)
class FactChange:
    """The full new state of one fact after a run, and what it was before (None if new)."""

    kind: FactChangeKind
    after: Fact
    before: Fact | None = None


@dataclass(frozen=True)
class FlushReads:
    """What a flush reads of its memory under the memory lock before it calls the backend."""

    erasure_open: bool  # an erasure of the whole memory is under way: the flush waits
    cutoffs: Mapping[tuple[str, int], int]  # (topic, partition) -> first offset not forgotten
    consumed: frozenset[uuid.UUID]  # of the events asked about, those a run consumed already
    state: MemoryState
    balance: int | None  # credit minus spend in micro-USD; None: no credit line
    known_facts: int  # active and held facts; 0: a first batch, with nothing to search
    # Of the events asked about, those a fact erasure redacted in the log since: not
    # consolidated from the copy a consumer holds, which still says what was erased.
    erased: frozenset[uuid.UUID] = frozenset()
    # Changed by every erasure, fact or memory, that the version does not count: an answer
    # planned before one is not applied after it.
    generation: uuid.UUID | None = None


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

    def strangers(self) -> list[MemoryKey]:
        """Memories other than the run's that this update would write into: a stored update
        has none (a run is one memory's), so a store refuses one that has any."""
        keys = {
            self.state.key,
            *(c.after.key for c in self.fact_changes),
            *(MemoryKey(e.organization_id, e.user_id) for e in self.ledger),
        }
        return sorted(keys - {self.run.key})


@dataclass(frozen=True)
class LoggedRun:
    """A run as stored: its place in the run log and when its transaction committed (up to
    the commit's own round trip: `processors.fold.runs_until`)."""

    seq: int
    finished_at: datetime
    run: RunRecord


@dataclass(frozen=True)
class KafkaCoordinates:
    """Where an event was read: kept with it in the event log, for audit."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class LoggedEvent(Generic[E]):
    """An event as stored in the event log (generic: see `domain.ports.EventLog`)."""

    seq: int
    event: E
    recorded_at: datetime
