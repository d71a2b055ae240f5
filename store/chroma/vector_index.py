"""The vector index (tier V): facts embedded and filtered by user, connection and status.

Postgres `memory_facts` is the system of record; this index is derived from it and can be
rebuilt by upserting every fact again. `ChromaVectorIndex` is the Chroma adapter: it works
the same over an embedded `PersistentClient` and a `chroma run` server, and turns every
chromadb, httpx or socket failure into `VectorIndexUnavailable`.
"""

from __future__ import annotations

import threading
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, cast

import chromadb
import httpx
import numpy as np
from chromadb.api import ClientAPI
from chromadb.api.client import Client
from chromadb.api.fastapi import FastAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import (
    Embeddable,
    EmbeddingFunction,
    Metadata,
    Where,
)
from chromadb.base_types import InclusionExclusionOperator, LiteralValue
from chromadb.config import Settings
from chromadb.errors import ChromaError

from domain.ids import NO_CONNECTION
from domain.model import Fact, FactStatus
from domain.ports import Embedder, Vector
from store.embeddings import ChromaEmbeddingFunction
from store.errors import VectorIndexUnavailable

MetadataValue = str | int | float | bool

DEFAULT_COLLECTION = "memory_facts"
DEFAULT_HTTP_TIMEOUT_S = 10.0

# What a failing Chroma looks like from the client: its own errors (HTTP error bodies and the
# embedded Rust engine), httpx transport errors and timeouts, and raw socket errors.
_CHROMA_FAILURES: tuple[type[Exception], ...] = (ChromaError, httpx.HTTPError, OSError)


@dataclass(frozen=True)
class VectorHit:
    fact_id: uuid.UUID
    similarity: float  # cosine similarity, 1.0 = identical
    content: str
    metadata: Mapping[str, MetadataValue]


class VectorIndex(Protocol):
    def upsert(self, facts: Sequence[Fact]) -> int:
        """Index facts under id str(fact_id); idempotent. Returns how many texts were embedded."""
        ...

    def update_status(self, statuses: Mapping[uuid.UUID, FactStatus]) -> None:
        """Change the status metadata of indexed facts without embedding them again."""
        ...

    def query(
        self,
        *,
        user_id: str,
        text: str,
        connection_ids: Sequence[str],
        n: int,
        statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,),
        context_types: Sequence[str] = (),
    ) -> list[VectorHit]:
        """The user's n facts nearest to text, from the active connections or none.

        An empty `statuses` matches nothing; an empty `context_types` does not filter.
        """
        ...

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None: ...

    def count(self, user_id: str | None = None) -> int: ...


def fact_metadata(fact: Fact) -> dict[str, MetadataValue]:
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


@contextmanager
def _translated(operation: str) -> Iterator[None]:
    try:
        yield
    except _CHROMA_FAILURES as e:
        raise VectorIndexUnavailable(f"chroma {operation} failed: {e!r}") from e
    except Exception as e:
        # chromadb's HTTP client raises a bare Exception(response text) for error responses
        # without a Chroma error body (a proxy's 502, say). Only that exact type is Chroma's
        # failure; subclasses (TypeError, ValueError...) are our bugs and must surface as is.
        if type(e) is Exception:
            raise VectorIndexUnavailable(f"chroma {operation} failed: {e!r}") from e
        raise


_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class ChromaVectorIndex:
    """`VectorIndex` over one Chroma collection (cosine space, our embedding function).

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
        with _translated("upsert"):
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
        with _translated("upsert"):
            collection = self._get_collection()
            for chunk in _chunks(list(range(len(facts))), self._max_batch_size()):
                collection.upsert(
                    ids=[str(facts[i].fact_id) for i in chunk],
                    embeddings=np.stack([vectors[i] for i in chunk]),
                    documents=[facts[i].content for i in chunk],
                    metadatas=[_as_metadata(facts[i]) for i in chunk],
                )

    def update_status(self, statuses: Mapping[uuid.UUID, FactStatus]) -> None:
        items = list(statuses.items())
        if not items:
            return
        with _translated("update_status"):
            collection = self._get_collection()
            for chunk in _chunks(items, self._max_batch_size()):
                # Chroma merges metadata on update and ignores ids it does not hold, so a fact
                # not indexed yet is skipped here and gets its status from its own upsert.
                patches: list[Metadata] = [{"status": status.value} for _, status in chunk]
                collection.update(ids=[str(fact_id) for fact_id, _ in chunk], metadatas=patches)

    def query(
        self,
        *,
        user_id: str,
        text: str,
        connection_ids: Sequence[str],
        n: int,
        statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,),
        context_types: Sequence[str] = (),
    ) -> list[VectorHit]:
        if n <= 0 or not statuses:
            return []
        where = build_where(
            user_id=user_id,
            connection_ids=connection_ids,
            statuses=statuses,
            context_types=context_types,
        )
        (vector,) = self._embedder.embed([text])
        with _translated("query"):
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

        Far cheaper than embedding the texts again: a get by id, no model run.
        """
        ids = sorted({str(f) for f in fact_ids})
        if not ids:
            return {}
        with _translated("embeddings"):
            result = self._get_collection().get(ids=ids, include=["embeddings"])
        vectors = result["embeddings"]
        if vectors is None:
            return {}
        return {
            uuid.UUID(i): np.asarray(v, dtype=np.float32)
            for i, v in zip(result["ids"], vectors, strict=True)
        }

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
        ids = sorted(stored, key=str)  # ties rank by fact id, as in the cached search
        (query,) = self._embedder.embed([text])
        similarity = np.stack([stored[i] for i in ids]) @ query
        best = np.argsort(-similarity, kind="stable")[:n]
        # The vectors go back too: the caller's diversity step (MMR) needs them as well.
        return [VectorHit(ids[k], float(similarity[k]), "", {}) for k in best], stored

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None:
        ids = [str(f) for f in fact_ids]
        if not ids:
            return  # never hand Chroma an empty id list: it is not a no-op everywhere
        with _translated("delete"):
            collection = self._get_collection()
            for chunk in _chunks(ids, self._max_batch_size()):
                collection.delete(ids=list(chunk))

    def count(self, user_id: str | None = None) -> int:
        with _translated("count"):
            collection = self._get_collection()
            if user_id is None:
                return collection.count()
            return len(collection.get(where={"user_id": user_id}, include=[])["ids"])

    def _get_collection(self) -> Collection:
        collection = self._collection
        if collection is not None:
            return collection
        with self._lock:
            if self._collection is None:
                self._collection = self._client.get_or_create_collection(
                    self._collection_name,
                    configuration={"hnsw": {"space": "cosine"}},
                    # chromadb types the parameter over Documents | Images while every
                    # function it ships is over Documents only, like ours.
                    embedding_function=cast(
                        "EmbeddingFunction[Embeddable]", self._embedding_function
                    ),
                )
            return self._collection

    def _max_batch_size(self) -> int:
        if self._batch_size is None:
            # A network call on the HTTP client, so asked once.
            self._batch_size = self._client.get_max_batch_size()
        return self._batch_size


def _as_metadata(fact: Fact) -> Metadata:
    return fact_metadata(fact)


def _plain_metadata(metadata: Mapping[str, object] | None) -> dict[str, MetadataValue]:
    if metadata is None:
        return {}
    return {k: v for k, v in metadata.items() if isinstance(v, str | int | float | bool)}


def embedded_client(path: Path) -> ClientAPI:
    """A Chroma engine inside this process, persisted under path."""
    with _translated("open"):
        return chromadb.PersistentClient(
            path=str(path), settings=Settings(anonymized_telemetry=False)
        )


def http_client(url: str, *, timeout_s: float = DEFAULT_HTTP_TIMEOUT_S) -> ClientAPI:
    """A client of a Chroma server at url (http(s)://host[:port]), with bounded request time.

    chromadb's HTTP client calls the server while it is constructed (tenant and database
    check), so this raises VectorIndexUnavailable when the server is down. Close it with
    `close_client`.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"chroma url must be http(s)://host[:port], got {url!r}")
    if parsed.path not in ("", "/"):
        raise ValueError(f"chroma url must not have a path, got {url!r}")
    ssl = parsed.scheme == "https"
    port = parsed.port or (443 if ssl else 8000)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
    # The construction-time check runs on a session we cannot give a timeout before it is
    # used; a bounded heartbeat first keeps a hung server from hanging the caller here.
    with _translated("heartbeat"):
        httpx.get(f"{url.rstrip('/')}/api/v2/heartbeat", timeout=timeout).raise_for_status()
    try:
        client = chromadb.HttpClient(
            host=parsed.hostname,
            port=port,
            ssl=ssl,
            settings=Settings(anonymized_telemetry=False),
        )
    except ValueError as e:
        # chromadb reports a refused connection here as ValueError("Could not connect to a
        # Chroma server"), raised while handling the httpx error.
        if isinstance(e.__context__, _CHROMA_FAILURES):
            raise VectorIndexUnavailable(f"chroma at {url} is unreachable: {e}") from e
        raise
    except _CHROMA_FAILURES as e:
        raise VectorIndexUnavailable(f"chroma at {url} is unreachable: {e!r}") from e
    # chromadb builds its httpx client with timeout=None, so a hung server would hang every
    # caller; the session is private, but httpx's `timeout` setter is public.
    _http_session(client).timeout = timeout
    return client


def close_client(client: ClientAPI) -> None:
    """Release a client, and for the HTTP client close its sockets.

    chromadb never closes the httpx sessions of an HTTP client (its own and its internal admin
    client's), so their keep-alive sockets leak and raise ResourceWarning when collected.
    Every HTTP client has its own System, so closing its sessions affects no other client.
    """
    sessions = [
        _http_session(c) for c in (client, getattr(client, "_admin_client", None)) if _is_http(c)
    ]
    if isinstance(client, Client):  # ClientAPI itself declares no close()
        client.close()
    for session in sessions:
        session.close()


def _is_http(client: object) -> bool:
    return isinstance(getattr(client, "_server", None), FastAPI)


def _http_session(client: object) -> httpx.Client:
    session = getattr(getattr(client, "_server", None), "_session", None)
    if not isinstance(session, httpx.Client):
        raise TypeError(
            f"chromadb {chromadb.__version__} no longer keeps an httpx.Client at "
            "client._server._session; update store.chroma.vector_index for it"
        )
    return session
