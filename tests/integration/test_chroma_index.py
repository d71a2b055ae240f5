"""What only the Chroma adapter does: its filter, batching, persistence and outages.

The server variant uses the session's shared `chroma_url` (a fresh collection per test). The
outage tests need a server they may stop or freeze, so they start their own.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar, cast

import httpx
import numpy as np
import pytest
from chromadb.api import ClientAPI
from chromadb.errors import ChromaError

from domain.ids import NO_CONNECTION, MemoryKey
from domain.model import FactStatus
from domain.ports import Embedder, VectorHit
from domain.reads import Scope
from memoryd import wiring
from memoryd.dev import free_port
from memoryd.ops.runtime import refuse_another_models_index
from store.chroma import (
    ChromaVectorIndex,
    ReconnectingIndex,
    close_client,
    embedded_client,
    http_client,
)
from store.chroma.filters import build_where
from store.embedding_models import FLOAT_PRODUCTS_MODEL
from store.embeddings import MODEL_NAME, MiniLmEmbedder
from store.errors import EmbeddingModelMismatch, VectorIndexUnavailable
from tests.support.builders import key_of, make_fact, nearest
from tests.support.chroma import DisposableChroma
from tests.support.fakes import LetterCountEmbedder

integration = pytest.mark.integration

# Well past the client's 1 s timeout: an outage a call outlasts is ended then (see
# _unavailable_during), which the call must not have waited for.
OUTAGE_END_S = 20.0
_Index = TypeVar("_Index", ChromaVectorIndex, ReconnectingIndex)


def contents(hits: Sequence[VectorHit]) -> set[str]:
    return {h.content for h in hits}


# --- the where clause (pure, no Chroma) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("connections", "statuses", "context_types", "expected"),
    [
        (
            [],
            [FactStatus.ACTIVE],
            [],
            {
                "$and": [
                    {"organization_id": "o"},
                    {"user_id": "u"},
                    {"connection_id": {"$in": [NO_CONNECTION]}},
                    {"status": {"$in": ["active"]}},
                ]
            },
        ),
        (
            ["c2", "c1", "c1"],
            [FactStatus.CONTRADICTED, FactStatus.ACTIVE],
            ["email", "chat", "email"],
            {
                "$and": [
                    {"organization_id": "o"},
                    {"user_id": "u"},
                    {"connection_id": {"$in": [NO_CONNECTION, "c1", "c2"]}},
                    {"status": {"$in": ["active", "contradicted"]}},
                    {"context_type": {"$in": ["chat", "email"]}},
                ]
            },
        ),
        (
            [NO_CONNECTION],
            [FactStatus.HELD],
            ["chat"],
            {
                "$and": [
                    {"organization_id": "o"},
                    {"user_id": "u"},
                    {"connection_id": {"$in": [NO_CONNECTION]}},
                    {"status": {"$in": ["held"]}},
                    {"context_type": {"$in": ["chat"]}},
                ]
            },
        ),
    ],
)
def test_build_where(
    connections: list[str],
    statuses: list[FactStatus],
    context_types: list[str],
    expected: object,
) -> None:
    where = build_where(
        Scope(MemoryKey("o", "u"), tuple(connections), tuple(statuses), tuple(context_types))
    )
    assert where == expected


def test_build_where_refuses_empty_statuses() -> None:
    with pytest.raises(ValueError, match="statuses"):
        build_where(Scope(MemoryKey("o", "u"), statuses=()))


# --- Chroma ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedder() -> MiniLmEmbedder:
    e = MiniLmEmbedder()
    e.load()
    return e


@pytest.fixture(params=["embedded", "server"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClientAPI]:
    if request.param == "embedded":
        c = embedded_client(tmp_path / "chroma")
    else:
        c = http_client(request.getfixturevalue("chroma_url"))
    try:
        yield c
    finally:
        close_client(c)


@pytest.fixture
def collection_name(client: ClientAPI) -> Iterator[str]:
    # Unique per test: the server is shared by the whole session.
    name = f"facts-{uuid.uuid4().hex[:12]}"
    yield name
    if name in {c.name for c in client.list_collections()}:
        client.delete_collection(name)


@integration
def test_upsert_respects_the_batch_size(
    client: ClientAPI, embedder: MiniLmEmbedder, collection_name: str
) -> None:
    index = ChromaVectorIndex(client, embedder, collection_name, max_batch_size=2)
    facts = [make_fact("u1", f"fact number {i}") for i in range(5)]
    assert index.upsert(facts) == 5
    assert index.count(key_of("u1")) == 5
    index.update_status({f.fact_id: FactStatus.ARCHIVED for f in facts})
    assert nearest(index, key_of("u1"), "fact number") == []
    index.delete([f.fact_id for f in facts])
    assert index.count() == 0


@integration
def test_many_stored_vectors_come_back_whole_from_several_gets(
    client: ClientAPI, embedder: MiniLmEmbedder, collection_name: str
) -> None:
    index = ChromaVectorIndex(client, embedder, collection_name)
    facts = [make_fact("u1", f"note {i} of the reading list") for i in range(1_234)]
    vectors = np.random.default_rng(3).standard_normal((len(facts), 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # unit length, as the model's
    index.upsert_embedded(facts, list(vectors))
    absent = make_fact("u1", "a note never indexed")
    asked = [absent.fact_id, *(f.fact_id for f in reversed(facts))]
    stored = index.embeddings(asked)
    assert stored.keys() == {f.fact_id for f in facts}
    for fact, vector in zip(facts, vectors, strict=True):
        np.testing.assert_allclose(stored[fact.fact_id], vector, rtol=0, atol=1e-6)


def _with_berlin(index: _Index) -> _Index:
    """`index` holding one fact of u1, "lives in Berlin"."""
    index.upsert([make_fact("u1", "lives in Berlin")])
    return index


@integration
def test_a_second_index_reads_the_same_collection(
    client: ClientAPI, embedder: MiniLmEmbedder, collection_name: str
) -> None:
    _with_berlin(ChromaVectorIndex(client, embedder, collection_name))
    # A new index object reads the stored collection config back (our function, by name).
    again = ChromaVectorIndex(client, embedder, collection_name)
    assert again.count() == 1
    assert contents(nearest(again, key_of("u1"), "Berlin")) == {"lives in Berlin"}


@integration
def test_embedded_index_survives_reopening(tmp_path: Path, embedder: MiniLmEmbedder) -> None:
    first = embedded_client(tmp_path / "chroma")
    ChromaVectorIndex(first, embedder).upsert([make_fact("u1", "lives in Berlin")])
    close_client(first)
    second = embedded_client(tmp_path / "chroma")
    try:
        assert ChromaVectorIndex(second, embedder).count(key_of("u1")) == 1
    finally:
        close_client(second)


@integration
def test_any_embedder_can_back_the_index(client: ClientAPI, collection_name: str) -> None:
    index = ChromaVectorIndex(client, LetterCountEmbedder(), collection_name)
    index.upsert([make_fact("u1", "aaaa"), make_fact("u1", "zzzz")])
    (best, _) = nearest(index, key_of("u1"), "aaab")
    assert best.content == "aaaa"
    assert ChromaVectorIndex(client, LetterCountEmbedder(), collection_name).count() == 2


@integration
def test_a_collection_of_the_other_graph_is_refused_not_mixed(
    client: ClientAPI, embedder: MiniLmEmbedder, collection_name: str
) -> None:
    _with_berlin(ChromaVectorIndex(client, embedder, collection_name))
    float_graph = MiniLmEmbedder(model_name=FLOAT_PRODUCTS_MODEL)
    other = ChromaVectorIndex(client, float_graph, collection_name)
    with pytest.raises(EmbeddingModelMismatch, match=f"MEMORYD_EMBEDDING_MODEL={MODEL_NAME}"):
        nearest(other, key_of("u1"), "Berlin")
    with pytest.raises(EmbeddingModelMismatch):
        other.upsert([make_fact("u1", "likes green tea")])
    assert ChromaVectorIndex(client, embedder, collection_name).count() == 1


@integration
def test_a_process_refuses_to_start_on_the_other_graphs_collection(
    chroma_url: str, embedder: MiniLmEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    collection_name = f"facts-{uuid.uuid4().hex[:12]}"

    def connect() -> ClientAPI:
        return http_client(chroma_url)  # a client per index: a failing index closes its own

    def starting(model: Embedder, connect: Callable[[], ClientAPI] = connect) -> None:
        index = ReconnectingIndex(connect, model, collection_name)
        try:
            refuse_another_models_index(cast("wiring.Core", SimpleNamespace(index=index)))
        finally:
            index.close()

    _with_berlin(ReconnectingIndex(connect, embedder, collection_name)).close()

    starting(embedder)
    with pytest.raises(EmbeddingModelMismatch, match=collection_name):
        starting(MiniLmEmbedder(model_name=FLOAT_PRODUCTS_MODEL))
    # Chroma not answering is an outage the process may start in, not a reason to stop.
    with caplog.at_level(logging.WARNING, logger="memoryd.ops.runtime"):
        starting(embedder, lambda: http_client(f"http://127.0.0.1:{free_port()}"))
    assert "the embedding model is checked later" in caplog.text


# --- outages: a server of our own that the test may stop or freeze --------------------------------


def _unavailable_during(
    end_outage: Callable[[], object],
) -> Callable[[Callable[[], object]], None]:
    """A check that a call fails as unavailable while the outage lasts. A call still running
    after OUTAGE_END_S ends the outage (`end_outage`: the server back, or thawed), so one that
    waits for the server rather than giving up succeeds, or fails too late, and the check
    fails: it is the order that is checked, not the time the call took."""

    def check(call: Callable[[], object]) -> None:
        ended = threading.Event()

        def end() -> None:
            ended.set()
            end_outage()

        timer = threading.Timer(OUTAGE_END_S, end)
        timer.start()
        try:
            with pytest.raises(VectorIndexUnavailable) as caught:
                call()
        finally:
            timer.cancel()
            timer.join()
        assert not ended.is_set(), "the call gave up only once the outage had ended"
        assert isinstance(caught.value.__cause__, httpx.HTTPError | ChromaError | OSError)

    return check


@contextmanager
def _berlin_on(server: DisposableChroma, embedder: MiniLmEmbedder) -> Iterator[ClientAPI]:
    """A client of server (1 s timeout) whose default index holds "lives in Berlin"."""
    client = http_client(server.url, timeout_s=1.0)
    try:
        _with_berlin(ChromaVectorIndex(client, embedder))
        yield client
    finally:
        close_client(client)


@integration
def test_a_stopped_server_makes_every_call_unavailable(
    own_chroma: DisposableChroma, embedder: MiniLmEmbedder
) -> None:
    with _berlin_on(own_chroma, embedder) as client:
        index = ChromaVectorIndex(client, embedder)
        own_chroma.stop()
        unavailable = _unavailable_during(own_chroma.start)
        more = [make_fact("u1", "likes green tea")]
        unavailable(lambda: nearest(index, key_of("u1"), "Berlin"))
        unavailable(lambda: index.upsert(more))
        unavailable(lambda: index.update_status({uuid.uuid4(): FactStatus.HELD}))
        unavailable(lambda: index.delete([uuid.uuid4()]))
        unavailable(index.count)
        # An index built while Chroma is down constructs fine and fails per call.
        late = ChromaVectorIndex(client, embedder, "other-facts")
        unavailable(lambda: nearest(late, key_of("u1"), "Berlin"))
        # Back on the same port and data: the same index object recovers, nothing lost.
        own_chroma.start()
        assert contents(nearest(index, key_of("u1"), "Berlin")) == {"lives in Berlin"}
        assert index.upsert(more) == 1


@integration
def test_a_frozen_server_times_out_as_unavailable(
    own_chroma: DisposableChroma, embedder: MiniLmEmbedder
) -> None:
    with _berlin_on(own_chroma, embedder) as client:
        index = ChromaVectorIndex(client, embedder)
        own_chroma.freeze()
        unavailable = _unavailable_during(own_chroma.thaw)
        try:
            unavailable(lambda: nearest(index, key_of("u1"), "Berlin"))
            unavailable(lambda: index.upsert([make_fact("u1", "likes green tea")]))
        finally:
            own_chroma.stop()  # before the client closes, as a frozen server never answers


@integration
def test_connecting_to_no_server_is_unavailable() -> None:
    # No server comes back here: ending the outage only marks the call as late.
    _unavailable_during(lambda: None)(lambda: http_client(f"http://127.0.0.1:{free_port()}"))


def test_http_client_rejects_a_malformed_url() -> None:
    with pytest.raises(ValueError, match="chroma url"):
        http_client("localhost:8000")
