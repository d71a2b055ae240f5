"""Ranking shared by the two `FactSearch` implementations (Postgres + Chroma, in memory), so
they order candidates alike: reciprocal rank fusion, exact nearest neighbours, ties by id."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from domain.model import FactStatus
from domain.ports import Vector
from store.exact_search import nearest
from store.read.ranking import reciprocal_rank_fusion

# What a consolidation works with: a held fact observed again is what earns it its place.
CONSOLIDATION_STATUSES = (FactStatus.ACTIVE, FactStatus.HELD)
CONSOLIDATION_STATUS_VALUES = [s.value for s in CONSOLIDATION_STATUSES]
# How many of a memory's facts a consolidation works with (the candidate search's count, a
# flush's locked reads); parameters: organization, user, CONSOLIDATION_STATUS_VALUES.
COUNT_CONSOLIDATION_FACTS = (
    "SELECT count(*) FROM memory_facts"
    " WHERE organization_id = %s AND user_id = %s AND status = ANY(%s)"
)


def fuse(dense: Sequence[uuid.UUID], keyword: Sequence[uuid.UUID], limit: int) -> list[uuid.UUID]:
    """Reciprocal rank fusion of the two rankings, ties by fact id: the best `limit`."""
    fused = reciprocal_rank_fusion([dense, keyword])
    return sorted(fused, key=lambda i: (-fused[i], str(i)))[:limit]


def nearest_ids(stored: Mapping[uuid.UUID, Vector], query: Vector, limit: int) -> list[uuid.UUID]:
    """The `limit` stored vectors nearest `query`; ties in fact id order, so it replays."""
    ordered = {k: stored[k] for k in sorted(stored, key=str)}
    return [h.fact_id for h in nearest(query, ordered, limit)]
