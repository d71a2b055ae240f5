"""The seams between the logic and the storage adapters."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from store.records import Fact

Vector = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Texts to L2-normalised vectors; deterministic for a given model file."""

    model_name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[Vector]: ...


@dataclass(frozen=True)
class FactQuery:
    """Facts related to `text`, among those of `connection_id` or of no connection."""

    text: str
    connection_id: str | None = None


@dataclass(frozen=True)
class RelatedFacts:
    """Per query, the facts most related to it, best first."""

    ranked: tuple[tuple[Fact, ...], ...]
    # Why a retriever was left out (the vector index was down): the rankings are keyword-only.
    degraded: str | None = None


class FactSearch(Protocol):
    """What consolidation may look up among one user's active and held facts.

    Every method is scoped by (organization_id, user_id): user ids are chosen by customers and
    collide across organizations.
    """

    def related(
        self, user_id: str, organization_id: str, queries: Sequence[FactQuery], limit: int
    ) -> RelatedFacts:
        """At most `limit` facts per query (dense + keyword, fused), in query order."""
        ...

    def pinned(self, user_id: str, organization_id: str) -> list[Fact]: ...

    def by_ids(
        self, user_id: str, organization_id: str, fact_ids: Sequence[uuid.UUID]
    ) -> list[Fact]: ...

    def count(self, user_id: str, organization_id: str) -> int: ...
