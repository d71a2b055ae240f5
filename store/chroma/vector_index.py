"""`ChromaVectorIndex`: tier V over one Chroma collection, `domain.ports.VectorIndex`.

Postgres `memory_facts` is the system of record; this index is derived from it and can be
rebuilt by upserting every fact again. It works the same over an embedded `PersistentClient`
and a `chroma run` server (`store.chroma._client`), and turns every chromadb, httpx or socket
failure into `VectorIndexUnavailable`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar, cast

import numpy as np
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Embeddable, EmbeddingFunction, Metadata

from domain.codec import fact_metadata
from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Embedder, MetadataValue, StoredFact, Vector, VectorHit
from domain.reads import Scope
from store.chroma._translate import translated
from store.chroma.filters import build_where, memory_where
from store.embeddings import ChromaEmbeddingFunction
from store.errors import EmbeddingModelMismatch
from store.exact_search import nearest

DEFAULT_COLLECTION = "memory_facts"
# Vectors a get by id asks for (`embeddings`).
_GET_CHUNK = 500

_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class ChromaVectorIndex:
    """`domain.ports.VectorIndex` over one Chroma collection (cosine space, our embedding function).

    The collection is fetched on first use, not in the constructor, so a process can start
    while Chroma is down and report the index as unavailable per call.
    """

    def __init__(
        self,
        client: ClientAPI,
        embedder: Embedder,
        collection_name: str = DEFAULT_COLLECTION,
        *,
        max_batch_size: int | None = None,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._client = client
        self._embedder = embedder
        self._collection_name = collection_name
        self._embedding_function = ChromaEmbeddingFunction(embedder)
        self._batch_size = max_batch_size
        self._collection: Collection | None = None
        self._lock = threading.Lock()

    def upsert(self, facts: Sequence[Fact]) -> int:
        # The last occurrence of an id wins; Chroma rejects duplicate ids within one request.
        by_id = {str(f.fact_id): f for f in facts}
        if not by_id:
            return 0
        embedded = 0
        with translated("upsert"):
            collection = self._get_collection()
            for chunk in _chunks(list(by_id), self._max_batch_size()):
                embedded += self._upsert_chunk(collection, [by_id[i] for i in chunk])
        return embedded

    def _upsert_chunk(self, collection: Collection, facts: list[Fact]) -> int:
        ids = [str(f.fact_id) for f in facts]
        stored = collection.get(ids=ids, include=["documents"])
        stored_text = dict(zip(stored["ids"], stored["documents"] or [], strict=True))
        # A fact id is derived from its normalized content, so an indexed fact with the same
        # text only needs its metadata refreshed: embedding it again would cost for nothing.
        fresh = [f for f in facts if stored_text.get(str(f.fact_id)) != f.content]
        known = [f for f in facts if stored_text.get(str(f.fact_id)) == f.content]
        if fresh:
            vectors = self._embedder.embed([f.content for f in fresh])
            collection.upsert(
                ids=[str(f.fact_id) for f in fresh],
                embeddings=np.stack(vectors),
                documents=[f.content for f in fresh],
                metadatas=[_as_metadata(f) for f in fresh],
            )
        if known:
            collection.update(
                ids=[str(f.fact_id) for f in known],
                metadatas=[_as_metadata(f) for f in known],
            )
        return len(fresh)

    def upsert_embedded(self, facts: Sequence[Fact], vectors: Sequence[Vector]) -> None:
        """Index facts with vectors computed elsewhere (a bulk load, a rebuild from a dump)."""
        if len(facts) != len(vectors):
            raise ValueError(f"{len(facts)} facts but {len(vectors)} vectors")
        with translated("upsert"):
            collection = self._get_collection()
            for chunk in _chunks(list(range(len(facts))), self._max_batch_size()):
                collection.upsert(
                    ids=[str(facts[i].fact_id) for i in chunk],
                    embeddings=np.stack([vectors[i] for i in chunk]),
                    documents=[facts[i].content for i in chunk],
                    metadatas=[fact_metadata(facts[i]) for i in chunk],
                )

    def update_status(self, statuses: Mapping[uuid.UUID, FactStatus]) -> None:
        items = list(statuses.items())
        if not items:
            return
        with translated("update_status"):
            collection = self._get_collection()
            for chunk in _chunks(items, self._max_batch_size()):
                # Chroma merges metadata on update and ignores ids it does not hold, so a fact
                # not indexed yet is skipped here and gets its status from its own upsert.
                patches: list[Metadata] = [{"status": status.value} for _, status in chunk]
                collection.update(ids=[str(fact_id) for fact_id, _ in chunk], metadatas=patches)

    def query(self, scope: Scope, text: str, n: int) -> list[VectorHit]:
        if n <= 0 or not scope.statuses:
            return []
        where = build_where(scope)
        (vector,) = self._embedder.embed([text])
        with translated("query"):
            result = self._get_collection().query(
                query_embeddings=vector[np.newaxis, :],
                n_results=n,
                where=where,
                include=["documents", "metadatas", "distances"],
            )
        ids = result["ids"][0]
        distances = (result["distances"] or [[]])[0]
        documents = (result["documents"] or [[]])[0]
        metadatas = (result["metadatas"] or [[]])[0]
        return [
            VectorHit(
                fact_id=uuid.UUID(fact_id),
                similarity=1.0 - float(distance),
                content=document or "",
                metadata=_plain_metadata(metadata),
            )
            for fact_id, distance, document, metadata in zip(
                ids, distances, documents, metadatas, strict=True
            )
        ]

    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        """The stored vectors of these facts (those not indexed are absent).

        Far cheaper than embedding the texts again: a get by id, no model run. Many ids go
        in gets of `_GET_CHUNK`: a `chroma run` server answered 10,000 ids in 749 ms as two
        gets, 548 ms as twenty (BENCHMARKS.md, "A memory's vectors fetched in smaller gets";
        two gets at once were faster still, but grew a reading process by 270 MB).
        """
        ids = sorted({str(f) for f in fact_ids})
        if not ids:
            return {}
        vectors: dict[uuid.UUID, Vector] = {}
        with translated("embeddings"):
            collection = self._get_collection()
            for start in range(0, len(ids), _GET_CHUNK):
                vectors |= _stored_vectors(collection, ids[start : start + _GET_CHUNK])
        return vectors

    def stored(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, StoredFact]:
        """The text and metadata held for these facts (those not indexed are absent)."""
        ids = sorted({str(f) for f in fact_ids})
        if not ids:
            return {}
        with translated("stored"):
            result = self._get_collection().get(ids=ids, include=["documents", "metadatas"])
        documents = result["documents"] or [""] * len(result["ids"])
        metadatas = result["metadatas"] or [{}] * len(result["ids"])
        return {
            uuid.UUID(i): StoredFact(document or "", _plain_metadata(metadata))
            for i, document, metadata in zip(result["ids"], documents, metadatas, strict=True)
        }

    def ids_page(self, offset: int, limit: int) -> list[str]:
        """Up to `limit` ids from `offset`, in the collection's own order."""
        with translated("ids_page"):
            result = self._get_collection().get(include=[], offset=offset, limit=limit)
        return list(result["ids"])

    def score(
        self, text: str, fact_ids: Sequence[uuid.UUID], n: int
    ) -> tuple[list[VectorHit], dict[uuid.UUID, Vector]]:
        """Exact search over a known candidate set: a get by id and one matrix product.

        A user's facts are a few hundred vectors; fetching them by id and scoring them here is
        far cheaper than a filtered ANN query over the whole collection, which Chroma answers
        by scanning the metadata of every tenant (measured: 9 ms against 265 ms at 100k facts).
        """
        if n <= 0 or not fact_ids:
            return [], {}
        stored = self.embeddings(fact_ids)
        if not stored:
            return [], {}
        # Ties rank by fact id, as in the cached dense search.
        stored = {k: stored[k] for k in sorted(stored, key=str)}
        (query,) = self._embedder.embed([text])
        # The vectors go back too: the caller's diversity step (MMR) needs them as well.
        return nearest(query, stored, n), stored

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None:
        ids = [str(f) for f in fact_ids]
        if not ids:
            return  # never hand Chroma an empty id list: it is not a no-op everywhere
        with translated("delete"):
            collection = self._get_collection()
            for chunk in _chunks(ids, self._max_batch_size()):
                collection.delete(ids=list(chunk))

    def delete_memory(self, key: MemoryKey) -> None:
        with translated("delete_memory"):
            self._get_collection().delete(where=memory_where(key))

    def count(self, key: MemoryKey | None = None) -> int:
        with translated("count"):
            collection = self._get_collection()
            if key is None:
                return collection.count()
            return len(collection.get(where=memory_where(key), include=[])["ids"])

    def check_model(self) -> None:
        """Raises `EmbeddingModelMismatch` if the collection holds another model's vectors."""
        with translated("get_collection"):
            self._get_collection()

    def _get_collection(self) -> Collection:
        collection = self._collection
        if collection is not None:
            return collection
        with self._lock:
            if self._collection is None:
                collection = self._client.get_or_create_collection(
                    self._collection_name,
                    configuration={"hnsw": {"space": "cosine"}},
                    # chromadb types the parameter over Documents | Images while every
                    # function it ships is over Documents only, like ours.
                    embedding_function=cast(
                        "EmbeddingFunction[Embeddable]", self._embedding_function
                    ),
                )
                _check_model(collection, self._embedder.model_name)
                self._collection = collection
            return self._collection

    def _max_batch_size(self) -> int:
        if self._batch_size is None:
            # A network call on the HTTP client, so asked once.
            self._batch_size = self._client.get_max_batch_size()
        return self._batch_size


def _check_model(collection: Collection, model_name: str) -> None:
    """Refuses a collection filled by another embedding graph: chromadb hands an existing
    collection back whatever function it is asked with, and a query embedded by one graph
    against vectors of another would rank by close, not equal, vectors without a word."""
    recorded = (collection.configuration_json or {}).get("embedding_function") or {}
    stored = (recorded.get("config") or {}).get("model_name")
    if stored is not None and stored != model_name:
        raise EmbeddingModelMismatch(
            f"Chroma collection {collection.name} holds vectors of {stored}, this process "
            f"embeds with {model_name}: set MEMORYD_EMBEDDING_MODEL={stored}, or index into "
            f"a new collection"
        )


def _stored_vectors(collection: Collection, ids: list[str]) -> dict[uuid.UUID, Vector]:
    result = collection.get(ids=ids, include=["embeddings"])
    vectors = result["embeddings"]
    if vectors is None:
        return {}
    return {
        uuid.UUID(i): np.asarray(v, dtype=np.float32)
        for i, v in zip(result["ids"], vectors, strict=True)
    }


def _plain_metadata(metadata: Mapping[str, object] | None) -> dict[str, MetadataValue]:
    if metadata is None:
        return {}
    return {k: v for k, v in metadata.items() if isinstance(v, str | int | float | bool)}


def _as_metadata(fact: Fact) -> Metadata:
    return fact_metadata(fact)
