"""How a fact looks in Chroma: its metadata, and the filter that scopes a query.

Chroma metadata cannot hold null and has no `$exists`, so absent values become "" and "no
connection" is the `NO_CONNECTION` sentinel; `$and` needs two clauses or more, `$in` a
non-empty list.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from chromadb.api.types import Metadata, Where
from chromadb.base_types import InclusionExclusionOperator, LiteralValue

from domain.ids import NO_CONNECTION
from domain.model import Fact, FactStatus
from domain.ports import MetadataValue


def fact_metadata(fact: Fact) -> Metadata:
    """Chroma metadata for a fact; Chroma has no null, so absent values become "" or
    NO_CONNECTION (the sentinel the scoping filter matches)."""
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


def build_where(
    *,
    user_id: str,
    connection_ids: Sequence[str],
    statuses: Sequence[FactStatus],
    context_types: Sequence[str] = (),
) -> Where:
    """user AND connection IN (active + none) AND status IN statuses [AND context_type IN ...].

    Always an `$and` of at least three clauses, and every `$in` list is non-empty (Chroma
    rejects `$and` with fewer than two clauses and `$in []`): NO_CONNECTION is always in the
    connection list, the caller checks `statuses`, and context types only add a clause when
    given. Lists are deduplicated and sorted so equal queries build equal filters.
    """
    if not statuses:
        raise ValueError("statuses must not be empty: nothing could match")
    clauses: list[Where] = [
        {"user_id": user_id},
        {"connection_id": _one_of([*connection_ids, NO_CONNECTION])},
        {"status": _one_of(s.value for s in statuses)},
    ]
    if context_types:
        clauses.append({"context_type": _one_of(context_types)})
    return {"$and": clauses}


def _one_of(values: Iterable[str]) -> dict[InclusionExclusionOperator, list[LiteralValue]]:
    return {"$in": sorted(set(values))}


def plain_metadata(metadata: Mapping[str, object] | None) -> dict[str, MetadataValue]:
    if metadata is None:
        return {}
    return {k: v for k, v in metadata.items() if isinstance(v, str | int | float | bool)}
