"""The VectorIndex contract, run unchanged against the in-memory index, an embedded Chroma and
a `chroma run` server (see conftest.py); the Chroma-only behaviour is in
tests/integration/test_chroma_index.py."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from domain.codec import fact_metadata
from domain.ids import NO_CONNECTION, MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import StoredFact, VectorHit, VectorIndex
from tests.contracts.conftest import Index
from tests.support.builders import make_fact, nearest

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def indexed_fact(user_id: str, content: str, org: str = "org-1", **changes: Any) -> Fact:
    """A fact as the index tests expect it: org-1, chat context, two source events."""
    changes.setdefault("context_type", "chat")
    return make_fact(
        user_id,
        content,
        org=org,
        at=T0,
        updated_at=T0 + timedelta(hours=1),
        source_event_ids=(uuid.UUID(int=1), uuid.UUID(int=2)),
        **changes,
    )


def contents(hits: Sequence[VectorHit]) -> set[str]:
    return {h.content for h in hits}


def key(user_id: str, org: str = "org-1") -> MemoryKey:
    return MemoryKey(org, user_id)


def test_upsert_is_idempotent_and_embeds_only_new_text(vector_index: VectorIndex) -> None:
    facts = [indexed_fact("u1", "lives in Berlin"), indexed_fact("u1", "likes green tea")]
    assert vector_index.upsert(facts) == 2
    assert vector_index.count() == 2
    assert vector_index.upsert(facts) == 0
    assert vector_index.count() == 2
    assert vector_index.upsert([*facts, indexed_fact("u1", "has a cat named Miso")]) == 1
    assert vector_index.count() == 3


def test_stored_gives_the_text_and_metadata_of_held_facts_only(vector_index: Index) -> None:
    berlin = indexed_fact("u1", "lives in Berlin", salience=0.25, pinned=True)
    tea = indexed_fact("u2", "likes green tea", org="org-2", status=FactStatus.HELD)
    vector_index.upsert([berlin, tea])
    never = indexed_fact("u1", "was never indexed")
    stored = vector_index.stored([berlin.fact_id, tea.fact_id, never.fact_id])
    assert stored == {
        berlin.fact_id: StoredFact(berlin.content, fact_metadata(berlin)),
        tea.fact_id: StoredFact(tea.content, fact_metadata(tea)),
    }
    vector_index.upsert([replace(berlin, salience=0.75)])
    assert vector_index.stored([berlin.fact_id])[berlin.fact_id].metadata["salience"] == 0.75
    assert vector_index.stored([]) == {}


def test_ids_pages_list_every_held_id_once_in_a_stable_order(vector_index: Index) -> None:
    facts = [indexed_fact("u1", f"finished chapter {n} of the novel") for n in range(7)]
    vector_index.upsert(facts)
    pages = [vector_index.ids_page(offset, 3) for offset in (0, 3, 6, 9)]
    assert [len(p) for p in pages] == [3, 3, 1, 0]
    assert sorted(i for p in pages for i in p) == sorted(str(f.fact_id) for f in facts)
    assert vector_index.ids_page(3, 3) == pages[1]
    vector_index.delete([facts[0].fact_id])
    assert str(facts[0].fact_id) not in vector_index.ids_page(0, 10)


def test_upsert_of_known_text_refreshes_metadata(vector_index: VectorIndex) -> None:
    fact = indexed_fact("u1", "lives in Berlin", salience=0.2)
    vector_index.upsert([fact])
    assert vector_index.upsert([replace(fact, salience=0.8, pinned=True)]) == 0
    (hit,) = nearest(vector_index, key("u1"), "lives in Berlin")
    assert hit.metadata["salience"] == pytest.approx(0.8)
    assert hit.metadata["pinned"] is True


def test_duplicate_ids_in_one_upsert_are_indexed_once(vector_index: VectorIndex) -> None:
    fact = indexed_fact("u1", "lives in Berlin")
    assert vector_index.upsert([fact, fact]) == 1
    assert vector_index.count() == 1


def test_query_returns_similarity_content_and_metadata(vector_index: VectorIndex) -> None:
    fact = indexed_fact("u1", "lives in Berlin")
    vector_index.upsert([fact, indexed_fact("u1", "likes green tea")])
    hits = nearest(vector_index, key("u1"), "lives in Berlin")
    assert [h.content for h in hits] == ["lives in Berlin", "likes green tea"]
    best = hits[0]
    assert best.fact_id == fact.fact_id
    assert best.similarity == pytest.approx(1.0, abs=1e-4)
    assert hits[1].similarity < best.similarity
    assert best.metadata == {
        "user_id": "u1",
        "organization_id": "org-1",
        "connection_id": NO_CONNECTION,
        "context_type": "chat",
        "source": "interactive",
        "tool_id": "",
        "message_id": "",
        "attachment_id": "",
        "filename": "",
        "fact_type": "profile",
        "surface": "speak",
        "status": "active",
        "pinned": False,
        "confidence": pytest.approx(0.9),
        "salience": pytest.approx(0.5),
        "created_at": pytest.approx(T0.timestamp()),
        "updated_at": pytest.approx(T0.timestamp() + 3600),
        "source_event_ids": f"{uuid.UUID(int=1)},{uuid.UUID(int=2)}",
    }


def test_n_limits_the_hits(vector_index: VectorIndex) -> None:
    vector_index.upsert([indexed_fact("u1", f"enjoys hobby number {i}") for i in range(4)])
    assert len(nearest(vector_index, key("u1"), "hobby", n=2)) == 2
    assert nearest(vector_index, key("u1"), "hobby", n=0) == []


def test_another_users_better_match_is_never_returned(vector_index: VectorIndex) -> None:
    vector_index.upsert(
        [
            indexed_fact("alice", "is based in Berlin"),
            indexed_fact("bob", "lives in Berlin"),
            indexed_fact("bob", "lives in Berlin, Germany"),
        ]
    )
    hits = nearest(vector_index, key("alice"), "lives in Berlin")
    assert contents(hits) == {"is based in Berlin"}
    assert all(h.metadata["user_id"] == "alice" for h in hits)
    assert vector_index.count(key("alice")) == 1
    assert vector_index.count(key("bob")) == 2


def test_the_same_user_id_in_another_organization_is_another_memory(
    vector_index: VectorIndex,
) -> None:
    ours = indexed_fact("alice", "is based in Berlin")
    theirs = indexed_fact("alice", "lives in Berlin", org="org-2")
    vector_index.upsert(
        [ours, theirs, indexed_fact("alice", "lives in Berlin, Germany", org="org-2")]
    )
    assert ours.fact_id != indexed_fact("alice", "is based in Berlin", org="org-2").fact_id
    hits = nearest(vector_index, key("alice"), "lives in Berlin")
    assert contents(hits) == {"is based in Berlin"}
    assert {h.metadata["organization_id"] for h in hits} == {"org-1"}
    assert contents(nearest(vector_index, key("alice", "org-2"), "lives in Berlin")) == {
        "lives in Berlin",
        "lives in Berlin, Germany",
    }
    vector_index.delete_memory(key("alice", "org-2"))
    vector_index.delete_memory(key("alice", "org-2"))  # already gone: still fine
    assert vector_index.count(key("alice", "org-2")) == 0
    assert vector_index.count(key("alice")) == 1
    assert vector_index.embeddings([ours.fact_id, theirs.fact_id]).keys() == {ours.fact_id}


def test_connection_scoping(vector_index: VectorIndex) -> None:
    vector_index.upsert(
        [
            indexed_fact("u1", "uses Jira for sprint planning", connection_id="c1"),
            indexed_fact("u1", "uses Linear for bug tracking", connection_id="c2"),
            indexed_fact("u1", "prefers short answers"),
        ]
    )
    no_connections = contents(nearest(vector_index, key("u1"), "tools", connection_ids=[]))
    assert no_connections == {"prefers short answers"}
    with_c1 = contents(nearest(vector_index, key("u1"), "tools", connection_ids=["c1"]))
    assert with_c1 == {"prefers short answers", "uses Jira for sprint planning"}
    with_both = contents(
        nearest(vector_index, key("u1"), "tools", connection_ids=["c1", "c2", "c9"])
    )
    assert len(with_both) == 3


def test_status_filter(vector_index: VectorIndex) -> None:
    berlin = indexed_fact("u1", "lives in Berlin")
    vector_index.upsert([berlin, indexed_fact("u1", "likes green tea")])
    vector_index.update_status({berlin.fact_id: FactStatus.CONTRADICTED})
    assert contents(nearest(vector_index, key("u1"), "Berlin")) == {"likes green tea"}
    both = nearest(
        vector_index, key("u1"), "Berlin", statuses=[FactStatus.ACTIVE, FactStatus.CONTRADICTED]
    )
    assert contents(both) == {"lives in Berlin", "likes green tea"}
    (only,) = nearest(vector_index, key("u1"), "Berlin", statuses=[FactStatus.CONTRADICTED])
    assert only.metadata["status"] == "contradicted"
    assert only.metadata["user_id"] == "u1"  # the status update left the rest alone
    assert nearest(vector_index, key("u1"), "Berlin", statuses=[]) == []


def test_update_status_of_an_unindexed_fact_is_ignored(vector_index: VectorIndex) -> None:
    vector_index.update_status({uuid.uuid4(): FactStatus.ARCHIVED})
    vector_index.update_status({})
    assert vector_index.count() == 0


def test_context_type_filter(vector_index: VectorIndex) -> None:
    vector_index.upsert(
        [
            indexed_fact("u1", "lives in Berlin", context_type="chat"),
            indexed_fact("u1", "flight to Berlin on Friday", context_type="email"),
            indexed_fact("u1", "Berlin office wiki page", context_type="tool_output"),
        ]
    )
    assert contents(nearest(vector_index, key("u1"), "Berlin", context_types=["email"])) == {
        "flight to Berlin on Friday"
    }
    assert len(nearest(vector_index, key("u1"), "Berlin", context_types=["email", "chat"])) == 2
    assert len(nearest(vector_index, key("u1"), "Berlin")) == 3


def test_delete(vector_index: VectorIndex) -> None:
    berlin = indexed_fact("u1", "lives in Berlin")
    vector_index.upsert([berlin, indexed_fact("u1", "likes green tea")])
    vector_index.delete([berlin.fact_id])
    vector_index.delete([berlin.fact_id])  # already gone: still fine
    vector_index.delete([])
    assert contents(nearest(vector_index, key("u1"), "Berlin")) == {"likes green tea"}
    assert vector_index.count() == 1


def test_empty_collection_and_new_user_return_nothing(vector_index: VectorIndex) -> None:
    assert nearest(vector_index, key("nobody"), "anything") == []
    assert vector_index.count() == 0
    assert vector_index.count(key("nobody")) == 0
    assert vector_index.upsert([]) == 0
    vector_index.upsert([indexed_fact("u1", "lives in Berlin")])
    assert nearest(vector_index, key("new-user"), "lives in Berlin") == []


def test_embeddings_are_the_stored_vectors(vector_index: VectorIndex) -> None:
    berlin, tea = indexed_fact("u1", "lives in Berlin"), indexed_fact("u1", "likes green tea")
    vector_index.upsert([berlin, tea])
    vectors = vector_index.embeddings([berlin.fact_id, uuid.uuid4()])
    assert set(vectors) == {berlin.fact_id}  # one not indexed is absent
    assert float(np.linalg.norm(vectors[berlin.fact_id])) == pytest.approx(1.0, abs=1e-4)
    assert vector_index.embeddings([]) == {}


def test_score_ranks_the_given_facts_exactly(vector_index: VectorIndex) -> None:
    facts = [
        indexed_fact("u1", "lives in Berlin"),
        indexed_fact("u1", "likes green tea"),
        indexed_fact("u2", "lives in Berlin, Germany"),
    ]
    vector_index.upsert(facts)
    ids = [f.fact_id for f in facts[:2]]
    hits, vectors = vector_index.score("lives in Berlin", ids, n=1)
    assert [h.fact_id for h in hits] == [facts[0].fact_id]
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-4)
    assert set(vectors) == set(ids)  # every vector fetched goes back, for MMR
    both, _ = vector_index.score("green tea", ids, n=5)
    assert [h.fact_id for h in both] == [facts[1].fact_id, facts[0].fact_id]
    assert vector_index.score("anything", [], n=5) == ([], {})
    assert vector_index.score("anything", ids, n=0) == ([], {})
