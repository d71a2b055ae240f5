"""Deterministic stand-ins for the adapters, shared by the unit tests."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

from domain.ports import Vector

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset({"a", "an", "the", "i", "my", "me", "is", "am", "to", "of", "in", "and"})


class BagOfWordsEmbedder:
    """An `Embedder` that hashes words into a few dimensions: shared words, similar vectors.

    crc32 rather than `hash()` because string hashing is salted per process, and the tests
    need the same vector in every run.
    """

    model_name = "fake-bag-of-words"

    def __init__(self, dimension: int = 64) -> None:
        self.dimension = dimension
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        self.calls.append(list(texts))
        return [self._vector(t) for t in texts]

    def _vector(self, text: str) -> Vector:
        vector = np.zeros(self.dimension, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            if word not in _STOPWORDS:
                vector[zlib.crc32(word.encode()) % self.dimension] += 1.0
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm else vector
