"""A `VectorIndex` that connects on first use and again after Chroma went away.

Construction never touches the network, so a process starts (and the read path answers,
degraded) while Chroma is down, and picks Chroma up again once it is back.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from chromadb.api import ClientAPI

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Embedder, StoredFact, Vector, VectorHit
from domain.reads import Scope
from store.chroma._client import close_client
from store.chroma.vector_index import ChromaVectorIndex
from store.errors import VectorIndexUnavailable

_T = TypeVar("_T")


class ReconnectingIndex:
    def __init__(
        self, connect: Callable[[], ClientAPI], embedder: Embedder, collection: str
    ) -> None:
        self._connect = connect
        self._embedder = embedder
        self._collection = collection
        self._lock = threading.Lock()
        self._client: ClientAPI | None = None
        self._index: ChromaVectorIndex | None = None

    def _call(self, fn: Callable[[ChromaVectorIndex], _T]) -> _T:
        with self._lock:
            if self._index is None:
                self._client = self._connect()  # raises VectorIndexUnavailable
                self._index = ChromaVectorIndex(self._client, self._embedder, self._collection)
            index = self._index
        try:
            return fn(index)
        except VectorIndexUnavailable:
            self._reset()
            raise

    def _reset(self) -> None:
        with self._lock:
            client, self._client, self._index = self._client, None, None
        if client is not None:
            close_client(client)

    def check_model(self) -> None:
        """Raises `EmbeddingModelMismatch` when the collection holds another model's vectors,
        `VectorIndexUnavailable` when Chroma does not answer."""
        self._call(lambda i: i.check_model())

    def upsert(self, facts: Sequence[Fact]) -> int:
        return self._call(lambda i: i.upsert(facts))

    def update_status(self, statuses: Mapping[uuid.UUID, FactStatus]) -> None:
        self._call(lambda i: i.update_status(statuses))

    def query(self, scope: Scope, text: str, n: int) -> list[VectorHit]:
        return self._call(lambda i: i.query(scope, text, n))

    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        return self._call(lambda i: i.embeddings(fact_ids))

    def stored(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, StoredFact]:
        return self._call(lambda i: i.stored(fact_ids))

    def ids_page(self, offset: int, limit: int) -> list[str]:
        return self._call(lambda i: i.ids_page(offset, limit))

    def score(
        self, text: str, fact_ids: Sequence[uuid.UUID], n: int
    ) -> tuple[list[VectorHit], dict[uuid.UUID, Vector]]:
        return self._call(lambda i: i.score(text, fact_ids, n))

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None:
        self._call(lambda i: i.delete(fact_ids))

    def delete_memory(self, key: MemoryKey) -> None:
        self._call(lambda i: i.delete_memory(key))

    def count(self, key: MemoryKey | None = None) -> int:
        return self._call(lambda i: i.count(key))

    def close(self) -> None:
        self._reset()
