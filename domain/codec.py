"""JSON forms of the records, for run outputs (folded by replay) and exports, and the flat
form a vector index keeps beside a fact's vector."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from domain.ids import NO_CONNECTION
from domain.model import Fact, FactStatus, FactType, Provenance, SurfacePolicy
from domain.ports import MetadataValue


def _dt(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_dt(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


def _parse_date(value: Any) -> date | None:
    # Postgres' to_jsonb writes a date as "2023-05-07"; a timestamp would not parse as one.
    return None if value is None else date.fromisoformat(str(value)[:10])


def fact_to_json(fact: Fact) -> dict[str, Any]:
    p = fact.provenance
    return {
        "fact_id": str(fact.fact_id),
        "user_id": fact.user_id,
        "organization_id": fact.organization_id,
        "content": fact.content,
        "fact_type": fact.fact_type.value,
        "surface": fact.surface.value,
        "status": fact.status.value,
        "pinned": fact.pinned,
        "confidence": fact.confidence,
        "salience": fact.salience,
        "context_type": p.context_type,
        "source": p.source,
        "connection_id": p.connection_id,
        "tool_id": p.tool_id,
        "message_id": p.message_id,
        "attachment_id": p.attachment_id,
        "filename": p.filename,
        "source_event_ids": [str(e) for e in p.source_event_ids],
        "created_by_run": str(fact.created_by_run),
        "created_at": _dt(fact.created_at),
        "updated_at": _dt(fact.updated_at),
        "reinforce_count": fact.reinforce_count,
        "last_reinforced_at": _dt(fact.last_reinforced_at),
        "recall_count": fact.recall_count,
        "last_recalled_at": _dt(fact.last_recalled_at),
        "superseded_by": None if fact.superseded_by is None else str(fact.superseded_by),
        "version": fact.version,
        "observed_at": _dt(fact.observed_at),
        "event_date": None if fact.event_date is None else fact.event_date.isoformat(),
        "subject": fact.subject,
    }


def fact_from_json(data: dict[str, Any]) -> Fact:
    created_at = _parse_dt(data["created_at"])
    updated_at = _parse_dt(data["updated_at"])
    if created_at is None or updated_at is None:
        raise ValueError("a fact needs created_at and updated_at")
    superseded = data.get("superseded_by")
    return Fact(
        fact_id=uuid.UUID(data["fact_id"]),
        user_id=data["user_id"],
        organization_id=data["organization_id"],
        content=data["content"],
        fact_type=FactType(data["fact_type"]),
        surface=SurfacePolicy(data["surface"]),
        status=FactStatus(data["status"]),
        pinned=bool(data["pinned"]),
        confidence=float(data["confidence"]),
        salience=float(data["salience"]),
        provenance=Provenance(
            context_type=data["context_type"],
            source=data["source"],
            connection_id=data.get("connection_id"),
            tool_id=data.get("tool_id"),
            message_id=data.get("message_id"),
            attachment_id=data.get("attachment_id"),
            filename=data.get("filename"),
            source_event_ids=tuple(uuid.UUID(e) for e in data.get("source_event_ids", [])),
        ),
        created_by_run=uuid.UUID(data["created_by_run"]),
        created_at=created_at,
        updated_at=updated_at,
        reinforce_count=int(data.get("reinforce_count", 0)),
        last_reinforced_at=_parse_dt(data.get("last_reinforced_at")),
        recall_count=int(data.get("recall_count", 0)),
        last_recalled_at=_parse_dt(data.get("last_recalled_at")),
        superseded_by=None if superseded is None else uuid.UUID(superseded),
        version=int(data.get("version", 1)),
        # Runs recorded before these fields existed fold to facts without them.
        observed_at=_parse_dt(data.get("observed_at")),
        event_date=_parse_date(data.get("event_date")),
        subject=data.get("subject"),
    )


def fact_metadata(fact: Fact) -> dict[str, MetadataValue]:
    """Scalars only, never null (Chroma metadata cannot hold it): absent values become "" and
    no connection the NO_CONNECTION sentinel, which the scoping filters match."""
    p = fact.provenance
    return {
        "user_id": fact.user_id,
        "organization_id": fact.organization_id,
        "connection_id": p.connection_id or NO_CONNECTION,
        "context_type": p.context_type,
        "source": p.source,
        "tool_id": p.tool_id or "",
        "message_id": p.message_id or "",
        "attachment_id": p.attachment_id or "",
        "filename": p.filename or "",
        "fact_type": fact.fact_type.value,
        "surface": fact.surface.value,
        "status": fact.status.value,
        "pinned": fact.pinned,
        "confidence": float(fact.confidence),
        "salience": float(fact.salience),
        "created_at": fact.created_at.timestamp(),
        "updated_at": fact.updated_at.timestamp(),
        "source_event_ids": ",".join(str(e) for e in p.source_event_ids),
    }
