"""Request and response bodies of the HTTP API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from domain.erasure import ErasureAccepted, ErasureOutcome
from domain.ids import TurnRequest
from domain.model import Fact, FactStatus, FactType, SurfacePolicy
from producers.contract import (
    MAX_CONTENT_CHARS,
    ConnectionId,
    ContextEvent,
    Identifier,
    not_reserved_content,
    reject_nul,
)
from store.read.bundle import ContextBundle, RetrievedFact
from store.read.ranking import Budget
from store.read.rendering import surface_group

MAX_CONNECTIONS = 50
MAX_EVENTS_PER_REQUEST = 500


def not_blank(text: str) -> str:
    """A pydantic validator of text that must say something: whitespace alone does not."""
    if not text.strip():
        raise ValueError("must not be blank")
    return text


# Text that reaches Postgres: no NUL, which it cannot store. A correction of whitespace only
# would retract the fact and put nothing in its place: deleting is the other route's work.
# It becomes an event's content, so not one the contract reserves: a 422, not a failed publish.
Text = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_CONTENT_CHARS),
    AfterValidator(reject_nul),
    AfterValidator(not_blank),
    AfterValidator(not_reserved_content),
]
Key = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(reject_nul)]
Query = Annotated[str, StringConstraints(max_length=MAX_CONTENT_CHARS), AfterValidator(reject_nul)]


class ContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: Identifier
    query: Query
    active_connection_ids: list[ConnectionId] = Field(default_factory=list, max_length=50)
    budget: Budget = Budget.BALANCED
    context_types: list[Key] = Field(default_factory=list, max_length=20)
    # The caller's id of the turn: a retried request then writes one audit row, not two.
    turn_id: Key | None = None

    def turn(self) -> TurnRequest:
        """What names the turn along with `turn_id`: a retry asks for the same."""
        return TurnRequest(
            self.query, self.active_connection_ids, self.budget.value, self.context_types
        )


class ProvenanceOut(BaseModel):
    context_type: str
    source: str
    connection_id: str | None
    tool_id: str | None
    message_id: str | None
    attachment_id: str | None
    filename: str | None
    source_event_ids: list[uuid.UUID]


class FactOut(BaseModel):
    fact_id: uuid.UUID
    content: str
    fact_type: FactType
    surface: SurfacePolicy
    status: FactStatus
    pinned: bool
    confidence: float
    salience: float
    provenance: ProvenanceOut
    created_at: datetime
    updated_at: datetime
    reinforce_count: int
    recall_count: int
    last_recalled_at: datetime | None
    superseded_by: uuid.UUID | None
    version: int

    @classmethod
    def of(cls, fact: Fact) -> FactOut:
        p = fact.provenance
        return cls(
            fact_id=fact.fact_id,
            content=fact.content,
            fact_type=fact.fact_type,
            surface=fact.surface,
            status=fact.status,
            pinned=fact.pinned,
            confidence=fact.confidence,
            salience=fact.salience,
            provenance=ProvenanceOut(
                context_type=p.context_type,
                source=p.source,
                connection_id=p.connection_id,
                tool_id=p.tool_id,
                message_id=p.message_id,
                attachment_id=p.attachment_id,
                filename=p.filename,
                source_event_ids=list(p.source_event_ids),
            ),
            created_at=fact.created_at,
            updated_at=fact.updated_at,
            reinforce_count=fact.reinforce_count,
            recall_count=fact.recall_count,
            last_recalled_at=fact.last_recalled_at,
            superseded_by=fact.superseded_by,
            version=fact.version,
        )


class RetrievedFactOut(BaseModel):
    fact: FactOut
    group: str  # the prompt block's group: always known, relevant for this turn, ...
    pinned: bool
    score: float
    similarity: float
    dense_rank: int | None
    keyword_rank: int | None

    @classmethod
    def of(cls, r: RetrievedFact) -> RetrievedFactOut:
        return cls(
            fact=FactOut.of(r.fact),
            group=surface_group(r).value,
            pinned=r.pinned,
            score=r.score,
            similarity=r.similarity,
            dense_rank=r.dense_rank,
            keyword_rank=r.keyword_rank,
        )


class ContextResponse(BaseModel):
    organization_id: str
    user_id: str
    memory_version: int
    prompt_block: str
    working_memory: str
    scaffold: dict[str, Any]
    learned_info: list[str]
    connection_info: dict[str, list[str]]
    facts: list[RetrievedFactOut]
    degraded: bool
    degraded_reason: str | None
    latency_ms: float
    log_id: uuid.UUID | None

    @classmethod
    def of(cls, b: ContextBundle) -> ContextResponse:
        return cls(
            organization_id=b.organization_id,
            user_id=b.user_id,
            memory_version=b.memory_version,
            prompt_block=b.prompt_block,
            working_memory=b.working_memory,
            scaffold=b.scaffold,
            learned_info=list(b.learned_info),
            connection_info={k: list(v) for k, v in b.connection_info.items()},
            facts=[RetrievedFactOut.of(r) for r in b.facts],
            degraded=b.degraded,
            degraded_reason=b.degraded_reason,
            latency_ms=b.latency_ms,
            log_id=b.log_id,
        )


class MemoryResponse(BaseModel):
    user_id: str
    organization_id: str
    memory_version: int
    working_memory: str
    scaffold: dict[str, Any]
    learned_info: list[str]
    connection_info: dict[str, list[str]]
    facts: list[FactOut]
    # The `cursor` of the next page of facts; None on the last.
    next_cursor: str | None = None


class CorrectionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: Text
    # Without one, the correction's content and the fact's version name its events: the
    # same correction sent again before the pipeline applied it is the same correction.
    idempotency_key: Key | None = None


class EventsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[ContextEvent] = Field(min_length=1, max_length=MAX_EVENTS_PER_REQUEST)

    @model_validator(mode="after")
    def _one_event_per_id(self) -> Self:
        # Downstream the first event of an id is kept and the others dropped: two different
        # events under one id in a request would be accepted and one of them never seen.
        # The same event twice is harmless (a retried part of a request, say).
        seen: dict[tuple[str, str, uuid.UUID], ContextEvent] = {}
        for event in self.events:
            first = seen.setdefault((event.organization_id, event.user_id, event.event_id), event)
            if first != event:
                raise ValueError(f"event_id {event.event_id} names two different events")
        return self


class Accepted(BaseModel):
    """The events were acknowledged by Kafka; memory changes once the pipeline ran."""

    event_ids: list[uuid.UUID]


class NotAccepted(BaseModel):
    """An event Kafka did not acknowledge. `retriable` false: the broker refused the event as it
    is (too large for the topic, say), and refuses it again. True: it was not acknowledged in
    time, or the broker was away; it may even be on the topic, and sending it again is safe."""

    event_id: uuid.UUID
    reason: str
    retriable: bool


class EventsNotAccepted(BaseModel):
    """Not every event was acknowledged. Those of `event_ids` were, and go through the pipeline
    as if alone: the request is not all or none. Send those of `not_accepted` again, or the
    whole request (an `event_id` is taken once). A user's accepted events keep their order; one
    sent again lands after those accepted."""

    detail: str
    event_ids: list[uuid.UUID]
    not_accepted: list[NotAccepted]


class ValidationProblem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationProblems(BaseModel):
    """The request is invalid: where and why (see `memoryd.api.errors`)."""

    detail: list[ValidationProblem]


class TombstoneOut(BaseModel):
    topic: str
    partition: int
    offset: int


class ErasureOut(BaseModel):
    """The receipt of an erasure: what was removed where. memoryd keeps the same receipt in
    its erasure audit, without the user id (a keyed digest, `subject`, stands for it).

    `status` is "completed" for a receipt (200). An erasure whose memory was being
    consolidated is answered "started" (202): audited, and finished by memoryd, with no
    tombstone, nothing `removed` and no `digest` yet; the same request again answers the
    receipt once it is completed."""

    user_id: str
    erasure_id: uuid.UUID
    scope: str
    subject: str
    tombstone: TombstoneOut | None
    removed: dict[str, Any]
    digest: str | None
    status: Literal["completed", "started"]

    @classmethod
    def of(cls, outcome: ErasureOutcome, user_id: str) -> ErasureOut:
        if isinstance(outcome, ErasureAccepted):
            return cls(
                user_id=user_id,
                erasure_id=outcome.erasure_id,
                scope=outcome.scope.value,
                subject=outcome.subject,
                tombstone=None,
                removed={},
                digest=None,
                status="started",
            )
        t = outcome.tombstone
        return cls(
            user_id=user_id,
            erasure_id=outcome.erasure_id,
            scope=outcome.scope.value,
            subject=outcome.subject,
            tombstone=None
            if t is None
            else TombstoneOut(topic=t.topic, partition=t.partition, offset=t.offset),
            removed=dict(outcome.removed),
            digest=outcome.digest,
            status="completed",
        )


class Problem(BaseModel):
    detail: str
