"""Exact nearest neighbours over a known set of vectors: one matrix product, no index."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import numpy as np

from domain.ports import Vector, VectorHit


def nearest(query: Vector, stored: Mapping[uuid.UUID, Vector], n: int) -> list[VectorHit]:
    """The n stored vectors most similar to query, best first (unit vectors: cosine = dot);
    ties keep the order of `stored`."""
    if n <= 0 or not stored:
        return []
    ids = list(stored)
    similarity = np.stack([stored[i] for i in ids]) @ query
    best = np.argsort(-similarity, kind="stable")[:n]
    return [VectorHit(ids[k], float(similarity[k]), "", {}) for k in best]
