"""What goes into a consolidation and what a backend must return.

`ConsolidationOutput` is the structured-output schema given to the LLM and the validator of
whatever comes back; every field is capped so a runaway model cannot write unbounded memory.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import StrEnum
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from domain.ids import OfMemory
from domain.model import Fact, FactStatus, FactType, MemoryState, SurfacePolicy, TokenUsage
from producers.contract import ContextEvent

MAX_WORKING_MEMORY_WORDS = 500
MAX_WORKING_MEMORY_CHARS = 6_000
MAX_FACTS_PER_RUN = 40
MAX_FACT_CHARS = 600
MAX_SCAFFOLD_CHARS = 20_000
# The facts a backend is shown, so it can reinforce or update them rather than add again.
REQUEST_STATUSES = (FactStatus.ACTIVE, FactStatus.HELD)


class FactOp(StrEnum):
    ADD = "add"
    UPDATE = "update"
    REINFORCE = "reinforce"
    CONTRADICT = "contradict"
    CLOSE_LOOP = "close_loop"


class FactProposal(BaseModel):
    """One change to long-term memory proposed by the backend."""

    model_config = ConfigDict(extra="ignore")

    op: FactOp = FactOp.ADD
    content: Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_FACT_CHARS)]
    type: FactType = FactType.PROFILE
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)
    salience: float = Field(default=0.5, ge=0.0, le=1.0)
    surface: SurfacePolicy = SurfacePolicy.SPEAK
    # Missing on an op that needs one, or naming no fact the run was shown: the proposal is
    # read as an add (processors.lifecycle), never a reason to refuse the whole answer.
    target_fact_id: str | None = None
    # Which observations (by their index label, e.g. "E3") the fact came from.
    evidence: list[str] = Field(default_factory=list, max_length=20)
    # Set by extractors that know them (the offline backend); not asked of an LLM, so they stay
    # out of the output schema a model is given.
    subject: SkipJsonSchema[str | None] = Field(default=None, max_length=80)
    event_date: SkipJsonSchema[date | None] = None


class ConsolidationOutput(BaseModel):
    """The validated answer of a backend. `facts_to_embed` is the older flat shape."""

    model_config = ConfigDict(extra="ignore")

    updated_working_memory: Annotated[str, StringConstraints(max_length=MAX_WORKING_MEMORY_CHARS)]
    # A JSON merge patch of S, not S: see processors.consolidate.patched_scaffold.
    updated_scaffold: dict[str, Any] = Field(default_factory=dict)
    facts: list[FactProposal] = Field(default_factory=list, max_length=MAX_FACTS_PER_RUN)
    facts_to_embed: list[Annotated[str, StringConstraints(max_length=MAX_FACT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_FACTS_PER_RUN
    )

    def all_proposals(self) -> list[FactProposal]:
        """`facts` plus the seed's `facts_to_embed` read as plain adds."""
        seen = {p.content for p in self.facts}
        legacy = [FactProposal(content=c) for c in self.facts_to_embed if c not in seen]
        return [*self.facts, *legacy]


@dataclass(frozen=True)
class Observation:
    """An event as the backend sees it: labelled, so facts can cite their evidence."""

    label: str
    event: ContextEvent


def in_request_order(events: Sequence[ContextEvent]) -> list[ContextEvent]:
    """The order observations are labelled in (E1, E2, ...): when they happened."""
    return sorted(events, key=lambda e: (e.occurred_at, str(e.event_id)))


@dataclass(frozen=True)
class ConsolidationRequest(OfMemory):
    """One batch and the memory it is consolidated into.

    `active_facts` are the existing facts the backend and the write gate work with: for a
    live run the candidates the batch is about (`processors.candidates`), not every fact the
    user has; `known_facts` counts those (active and held), shown or not.
    """

    user_id: str
    organization_id: str
    state: MemoryState
    active_facts: tuple[Fact, ...]
    observations: tuple[Observation, ...]
    now: datetime
    known_facts: int | None = None
    # What the connections the batch updates know already: an addition repeating it is none.
    connections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        state: MemoryState,
        active_facts: tuple[Fact, ...],
        events: list[ContextEvent],
        now: datetime,
        known_facts: int | None = None,
        connections: Mapping[str, tuple[str, ...]] | None = None,
    ) -> ConsolidationRequest:
        strangers = [
            e.event_id
            for e in events
            if (e.organization_id, e.user_id) != (state.organization_id, state.user_id)
        ]
        if strangers:
            # A batch is one memory's: an event of another organization (or user) reaching
            # this memory is the leak tenancy exists to prevent, so it fails loudly here.
            raise ValueError(
                f"{len(strangers)} event(s) are not of {state.organization_id}/{state.user_id}:"
                f" {strangers[:3]}"
            )
        ordered = in_request_order(events)
        return cls(
            user_id=state.user_id,
            organization_id=state.organization_id,
            state=state,
            active_facts=active_facts,
            observations=tuple(Observation(f"E{i + 1}", e) for i, e in enumerate(ordered)),
            now=now,
            known_facts=known_facts,
            connections=dict(connections or {}),
        )

    @property
    def fact_count(self) -> int:
        """The memory's facts, shown or not (at least those shown)."""
        return max(self.known_facts or 0, len(self.active_facts))

    @property
    def event_ids(self) -> frozenset[uuid.UUID]:
        return frozenset(o.event.event_id for o in self.observations)


@dataclass(frozen=True)
class BackendResponse:
    output: ConsolidationOutput
    raw_response: str
    usage: TokenUsage
    model: str


class ConsolidationBackend(Protocol):
    """An LLM (or the offline engine) that turns observations into memory changes.

    Raises `processors.errors.TransientBackendError` for what is worth retrying (rate limits,
    5xx, timeouts) and `processors.errors.BackendError` for the rest, e.g. unparseable output.
    """

    name: str
    model: str
    prompt_version: str

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse: ...


def scaffold_size(scaffold: Mapping[str, Any]) -> int:
    return len(json.dumps(scaffold, ensure_ascii=False, default=str))
