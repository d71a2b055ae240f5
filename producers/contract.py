"""The event contract every producer and consumer of memoryd agrees on.

A `ContextEvent` is one observation about one user of one organization. Producers assign
`event_id`; it is the idempotency key of the whole pipeline, so a producer that retries a send
must reuse it. Events are JSON on the wire, keyed by the pair (organization, user) so one
memory's events stay in one partition and in order.

A `MemoryTombstone` on the same topic, under the same key, says that memory was forgotten:
every consumer drops what it holds of it and ignores its events recorded before the tombstone.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    StringConstraints,
    ValidationInfo,
    model_validator,
)

SCHEMA_VERSION: Literal[1] = 1
MAX_CONTENT_CHARS = 8_000
MAX_ID_CHARS = 128
# How deep a scaffold value may nest: a profile is a few levels of objects and lists, and a
# fixed bound does not depend on how deep the interpreter's JSON parser can go.
MAX_SCAFFOLD_DEPTH = 32

ID_PATTERN = r"^[A-Za-z0-9_.:@\-]+$"
Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)
]
OptionalLabel = Annotated[str, StringConstraints(min_length=1, max_length=512)] | None

# What memoryd stores for "no connection" where null cannot be stored (Chroma's metadata,
# `domain.ids.NO_CONNECTION`). A connection of that id would be no connection: its facts
# would take the ids of the same texts outside every connection, and reach every turn.
RESERVED_CONNECTION_IDS = frozenset({"__none__"})


def _not_reserved(connection_id: str) -> str:
    if connection_id in RESERVED_CONNECTION_IDS:
        raise ValueError(f"{connection_id!r} is reserved by memoryd, not a connection id")
    return connection_id


ConnectionId = Annotated[Identifier, AfterValidator(_not_reserved)]

# What memoryd writes over the text of a logged event a fact erasure redacts (the marker of
# `domain.erasure`, which the contract cannot import, and for a scaffold update the marker as
# a JSON string). A flush drops a logged event of such a text as erased: sent by a producer,
# it would vanish with no dead letter and no consolidation.
RESERVED_CONTENTS = frozenset({"[erased]", '"[erased]"'})


def not_reserved_content(content: str) -> str:
    """A pydantic validator of text that becomes an event's content."""
    if content in RESERVED_CONTENTS:
        raise ValueError(f"{content!r} is reserved by memoryd (what an erasure leaves)")
    return content


# When an observation was made, in UTC, with a year's margin inside the calendar. Postgres
# stores times Python cannot load (year 10000, BC), and a reader in another time zone, a date
# a week from it or a grace period shifts them further: one event past the edge failed every
# later read of its memory.
EARLIEST_OCCURRED_AT = datetime(2, 1, 1, tzinfo=UTC)
LATEST_OCCURRED_AT = datetime(9999, 1, 1, tzinfo=UTC)


def _within_calendar(value: datetime) -> datetime:
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # year 0 or 10000 in UTC
        utc = None
    if utc is None or not EARLIEST_OCCURRED_AT <= utc < LATEST_OCCURRED_AT:
        raise ValueError(
            f"must lie in [{EARLIEST_OCCURRED_AT.isoformat()}, {LATEST_OCCURRED_AT.isoformat()})"
        )
    return value


ObservedAt = Annotated[AwareDatetime, AfterValidator(_within_calendar)]


class EventType(StrEnum):
    FACT = "fact"
    PREFERENCE = "preference"
    PROJECT_DETAILS = "project_details"
    CORRECTION = "correction"
    SCAFFOLD_UPDATE = "scaffold_update"
    LEARNED_FACT = "learned_fact"
    TOOL_OUTPUT = "tool_output"
    CONNECTION_UPDATE = "connection_update"
    # The user deleted or corrected one remembered fact; content is a `FactRetraction`.
    FACT_RETRACTION = "fact_retraction"


class Source(StrEnum):
    INTERACTIVE = "interactive"
    AUTONOMOUS = "autonomous"
    TOOL = "tool"


class SourceMetadata(BaseModel):
    """Where an observation came from; every id is optional and opaque to memoryd."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Source
    session_id: OptionalLabel = None
    connection_id: ConnectionId | None = None
    tool_id: OptionalLabel = None
    message_id: OptionalLabel = None
    attachment_id: OptionalLabel = None
    filename: OptionalLabel = None


class RetractionReason(StrEnum):
    DELETED = "deleted"  # the fact is archived
    CORRECTED = "corrected"  # the fact is contradicted; a correction event says what is true


class FactRetraction(BaseModel):
    """The content of a `fact_retraction` event, as JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fact_id: uuid.UUID
    reason: RetractionReason = RetractionReason.DELETED


# The validation context of data parsed from JSON text already known to hold no NUL.
NUL_CHECKED = object()
# The validation context of an event read back from the log: an erasure may have written a
# reserved content over its text, in whatever shape its type had.
FROM_LOG = object()


class ContextEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: uuid.UUID
    user_id: Identifier
    organization_id: Identifier
    event_type: EventType
    content: Annotated[str, StringConstraints(min_length=1, max_length=MAX_CONTENT_CHARS)]
    # Only for scaffold_update: the scaffold key the content (a JSON value) is written to.
    scaffold_key: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    source_metadata: SourceMetadata
    occurred_at: ObservedAt

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any, info: ValidationInfo) -> Any:
        # Postgres text cannot hold NUL: such an event would fail every write of its batch.
        # A decoder that found no NUL in the JSON text says so (`NUL_CHECKED`): the walk was
        # a fifth of the log writer's CPU.
        if info.context is not NUL_CHECKED and has_nul(data):
            raise ValueError("a string contains a NUL character")
        return data

    @model_validator(mode="after")
    def _shape_matches_type(self, info: ValidationInfo) -> Self:
        if self.content in RESERVED_CONTENTS:
            if info.context is FROM_LOG:
                return self  # redacted: its shape was checked when it was logged
            not_reserved_content(self.content)
        kind = self.event_type
        if kind is EventType.SCAFFOLD_UPDATE:
            if self.scaffold_key is None:
                raise ValueError("scaffold_update needs scaffold_key")
            problem = scaffold_problem(self.content)
            if problem is not None:
                raise ValueError(problem)
        elif self.scaffold_key is not None:
            raise ValueError(f"scaffold_key is only allowed on scaffold_update, not {kind}")
        if kind is EventType.CONNECTION_UPDATE and self.source_metadata.connection_id is None:
            raise ValueError("connection_update needs source_metadata.connection_id")
        if kind is EventType.TOOL_OUTPUT and self.source_metadata.tool_id is None:
            raise ValueError("tool_output needs source_metadata.tool_id")
        if kind is EventType.FACT_RETRACTION:
            FactRetraction.model_validate_json(self.content)
        return self

    def retraction(self) -> FactRetraction:
        """The decoded content of a fact_retraction."""
        if self.event_type is not EventType.FACT_RETRACTION:
            raise ValueError(f"{self.event_type} retracts nothing")
        return FactRetraction.model_validate_json(self.content)

    def scaffold_value(self) -> Any:
        """The decoded JSON value of a scaffold_update."""
        if self.event_type is not EventType.SCAFFOLD_UPDATE:
            raise ValueError(f"{self.event_type} carries no scaffold value")
        return json.loads(self.content)

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> ContextEvent:
        """Decode and validate; raises `pydantic.ValidationError` (a `ValueError`)."""
        return cls.model_validate_json(raw)

    @property
    def kafka_key(self) -> bytes:
        return memory_kafka_key(self.organization_id, self.user_id)


def memory_kafka_key(organization_id: str, user_id: str) -> bytes:
    """The Kafka key of a memory's records: organization and user joined by \\x1f, a byte no
    identifier may contain, so every memory has its own key and its events one partition."""
    return f"{organization_id}\x1f{user_id}".encode()


TOMBSTONE_KIND: Literal["memory_forgotten"] = "memory_forgotten"


class MemoryTombstone(BaseModel):
    """The record `memoryd forget` publishes: this memory's events before it are gone.

    Not a `ContextEvent` (its `kind` field is one no event may have), so a consumer that knows
    only events dead-letters it instead of consolidating it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["memory_forgotten"] = TOMBSTONE_KIND
    schema_version: Literal[1] = SCHEMA_VERSION
    organization_id: Identifier
    user_id: Identifier
    erasure_id: uuid.UUID
    forgotten_at: AwareDatetime

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @property
    def kafka_key(self) -> bytes:
        return memory_kafka_key(self.organization_id, self.user_id)


def scaffold_problem(content: str) -> str | None:
    """What makes `content` unfit as a scaffold value (JSON that jsonb takes, not too deep), or
    None. Python's parser takes more than JSON (NaN, Infinity, a number out of float range, a
    lone surrogate escape), and jsonb refuses each of them, as it refuses \\u0000: accepted,
    the value failed its memory's whole batch at the write."""
    try:
        value = json.loads(content, parse_constant=_not_json, parse_float=_finite)
    except ValueError as e:  # not JSON, or a number too long to convert
        return f"scaffold_update content must be a JSON value: {e}"
    except RecursionError:
        value = None  # deeper than the interpreter's parser goes: too deep, as below
    else:
        if has_nul(value):
            return "the scaffold value contains NUL"
        if has_lone_surrogate(value):
            return "the scaffold value contains a lone surrogate (an escape no character has)"
        if json_depth(value) <= MAX_SCAFFOLD_DEPTH:
            return None
    return f"scaffold_update content is nested too deeply (over {MAX_SCAFFOLD_DEPTH})"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:40]} is out of range")
    return number


def reject_nul(text: str) -> str:
    """A pydantic validator of text stored in Postgres."""
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    return text


def json_leaves(value: Any) -> Iterator[Any]:
    """Every key and scalar anywhere in a JSON-like value; iterative, so a deeply nested value
    cannot exhaust the stack."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
        else:
            yield item


def has_nul(value: Any) -> bool:
    """Whether any string (key or value) anywhere in a JSON-like value holds NUL."""
    return any(isinstance(x, str) and "\x00" in x for x in json_leaves(value))


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) anywhere in a JSON-like value holds a surrogate code
    point, which UTF-8 cannot encode."""
    return any(isinstance(x, str) and _SURROGATE.search(x) for x in json_leaves(value))


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_depth(value: Any) -> int:
    """How many lists and objects deep a decoded JSON value nests (a scalar is 0)."""
    depth, level = 0, [(value, 0)]
    while level:
        item, d = level.pop()
        if isinstance(item, dict):
            level.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            level.extend((v, d + 1) for v in item)
        else:
            continue
        depth = max(depth, d + 1)
    return depth


def new_event_id(idempotency_key: str | None = None) -> uuid.UUID:
    """A random id, or a stable one when the caller has its own idempotency key."""
    if idempotency_key is None:
        return uuid.uuid4()
    return uuid.uuid5(EVENT_NAMESPACE, idempotency_key)


EVENT_NAMESPACE = uuid.UUID("6f1c3a52-8a0e-4d4b-9a57-3f1f0f2a7c11")


def utc_now() -> datetime:
    return datetime.now(UTC)
