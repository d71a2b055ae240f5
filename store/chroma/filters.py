"""The filter that scopes a Chroma query to what one turn may see.

Chroma has no `$exists` (so "no connection" is the `NO_CONNECTION` sentinel of the metadata,
`domain.codec.fact_metadata`), `$and` needs two clauses or more and `$in` a non-empty list.
"""

from __future__ import annotations

from collections.abc import Iterable

from chromadb.api.types import Where
from chromadb.base_types import InclusionExclusionOperator, LiteralValue

from domain.ids import NO_CONNECTION, MemoryKey
from domain.reads import Scope


def memory_where(key: MemoryKey) -> Where:
    """organization AND user: the vectors of one memory."""
    return {"$and": [{"organization_id": key.organization_id}, {"user_id": key.user_id}]}


def build_where(scope: Scope) -> Where:
    """Scope.admits as a Chroma filter: organization AND user AND connection IN (active +
    none) AND status IN statuses [AND context_type IN ...].

    Always an `$and` of at least four clauses, and every `$in` list is non-empty (Chroma
    rejects `$and` with fewer than two clauses and `$in []`): NO_CONNECTION is always in the
    connection list, the caller checks `statuses`, and context types only add a clause when
    given. Lists are deduplicated and sorted so equal queries build equal filters.
    """
    if not scope.statuses:
        raise ValueError("statuses must not be empty: nothing could match")
    clauses: list[Where] = [
        {"organization_id": scope.key.organization_id},
        {"user_id": scope.key.user_id},
        {"connection_id": _one_of([*scope.connection_ids, NO_CONNECTION])},
        {"status": _one_of(s.value for s in scope.statuses)},
    ]
    if scope.context_types:
        clauses.append({"context_type": _one_of(scope.context_types)})
    return {"$and": clauses}


def _one_of(values: Iterable[str]) -> dict[InclusionExclusionOperator, list[LiteralValue]]:
    return {"$in": sorted(set(values))}
