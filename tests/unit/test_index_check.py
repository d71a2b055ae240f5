"""The vector index checked against the facts marked indexed, on the in-memory adapters (the
same check on Postgres and Chroma: tests/integration/test_index_verify.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from consumers.index_check import IndexCheck, IndexChecker
from domain.codec import fact_metadata
from domain.model import Fact, FactStatus
from domain.ports import StoredFact
from store.inmemory import InMemoryDatabase, InMemoryIndexedFacts, InMemoryVectorIndex
from tests.support.builders import make_fact
from tests.support.fakes import BagOfWordsEmbedder

INDEXED_AT = datetime(2025, 3, 1, 13, 0, tzinfo=UTC)


def facts_of_two_organizations() -> list[Fact]:
    """Eight facts of the user id "omar" in two organizations."""
    return [
        make_fact("omar", f"omar plays {sport} on {day}", org=org)
        for org in ("org-a", "org-b")
        for sport, day in (("tennis", "mondays"), ("chess", "fridays"), ("golf", "sundays"))
    ] + [
        make_fact("omar", "omar lives in Porto"),
        make_fact("omar", "omar lives in Oslo", org="org-b"),
    ]


def indexed(db: InMemoryDatabase, index: InMemoryVectorIndex, facts: Sequence[Fact]) -> None:
    for fact in facts:
        db.facts[fact.fact_id] = replace(fact, indexed_at=INDEXED_AT)
    index.upsert(facts)


def held(index: InMemoryVectorIndex) -> set[str]:
    return set(index.ids_page(0, 1_000))


def test_a_consistent_index_is_reported_so_and_nothing_is_written() -> None:
    db, index = InMemoryDatabase(), InMemoryVectorIndex(BagOfWordsEmbedder())
    facts = facts_of_two_organizations()
    indexed(db, index, facts)
    result = IndexChecker(InMemoryIndexedFacts(db), index, page=3, id_page=2).check(repair=True)
    assert result == IndexCheck(indexed=8, held=8)
    assert result.consistent


def test_lost_differing_and_orphaned_vectors_are_counted_then_repaired() -> None:
    db, index = InMemoryDatabase(), InMemoryVectorIndex(BagOfWordsEmbedder())
    facts = facts_of_two_organizations()
    indexed(db, index, facts)
    lost = [facts[1].fact_id, facts[4].fact_id]  # one in each organization
    index.delete(lost)
    index.upsert([replace(facts[6], status=FactStatus.ARCHIVED)])  # a stale status
    ghost = make_fact("omar", "omar was erased from this memory", org="org-c")
    index.upsert([ghost])  # no row holds it
    checker = IndexChecker(InMemoryIndexedFacts(db), index, page=3, id_page=2)

    dry = checker.check(repair=False)
    assert dry == IndexCheck(indexed=8, absent=2, differing=1, held=7, orphans=1)
    assert not dry.consistent
    assert str(ghost.fact_id) in held(index)
    assert not index.stored(lost)

    repaired = checker.check(repair=True)  # the second pass sees the facts written again
    assert repaired == IndexCheck(
        indexed=8, absent=2, differing=1, repaired=3, held=9, orphans=1, removed=1
    )
    assert index.stored([f.fact_id for f in facts]) == {
        f.fact_id: StoredFact(f.content, fact_metadata(f)) for f in facts
    }
    assert held(index) == {str(f.fact_id) for f in facts}
    assert checker.check(repair=True) == IndexCheck(indexed=8, held=8)


def test_a_pending_fact_is_left_to_the_indexer() -> None:
    db, index = InMemoryDatabase(), InMemoryVectorIndex(BagOfWordsEmbedder())
    facts = facts_of_two_organizations()
    indexed(db, index, facts[:6])
    pending = facts[6]
    db.facts[pending.fact_id] = pending  # written, not indexed yet
    result = IndexChecker(InMemoryIndexedFacts(db), index).check(repair=True)
    assert result == IndexCheck(indexed=6, held=6)
    assert not index.stored([pending.fact_id])


class NewVersionMeanwhile(InMemoryIndexedFacts):
    """A run writes a new version of every fact between the check's read and its repair."""

    def __init__(self, db: InMemoryDatabase) -> None:
        super().__init__(db)
        self._db = db

    def repair(
        self, fact_ids: Sequence[uuid.UUID], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        for fact_id in fact_ids:
            old = self._db.facts[fact_id]
            self._db.facts[fact_id] = replace(old, version=old.version + 1, indexed_at=None)
        return super().repair(fact_ids, write)


def test_a_version_written_after_the_read_is_not_overwritten_by_the_repair() -> None:
    db, index = InMemoryDatabase(), InMemoryVectorIndex(BagOfWordsEmbedder())
    facts = facts_of_two_organizations()
    indexed(db, index, facts)
    index.delete([facts[0].fact_id])
    result = IndexChecker(NewVersionMeanwhile(db), index).check(repair=True)
    assert (result.absent, result.repaired) == (1, 0)
    assert not index.stored([facts[0].fact_id])  # the indexer writes the new version


class WithForeignIds(InMemoryVectorIndex):
    """An index whose collection also holds ids another application wrote."""

    def ids_page(self, offset: int, limit: int) -> list[str]:
        ids = [*super().ids_page(0, 10_000), "another-application-7"]
        return ids[offset : offset + limit]


def test_ids_that_are_not_fact_ids_are_counted_and_left_alone() -> None:
    db, index = InMemoryDatabase(), WithForeignIds(BagOfWordsEmbedder())
    facts = facts_of_two_organizations()
    indexed(db, index, facts)
    result = IndexChecker(InMemoryIndexedFacts(db), index, page=4, id_page=3).check(repair=True)
    assert result == IndexCheck(indexed=8, held=9, foreign=1)
    assert result.consistent


class CountingListings(InMemoryVectorIndex):
    """An index that records the offset of every listing of its ids."""

    def __init__(self) -> None:
        super().__init__(BagOfWordsEmbedder())
        self.offsets: list[int] = []

    def ids_page(self, offset: int, limit: int) -> list[str]:
        self.offsets.append(offset)
        return super().ids_page(offset, limit)


def test_the_listing_ends_at_a_short_page_without_asking_past_it() -> None:
    db, index = InMemoryDatabase(), CountingListings()
    indexed(db, index, facts_of_two_organizations())
    checker = IndexChecker(InMemoryIndexedFacts(db), index, page=4, id_page=3)
    assert checker.check(repair=False) == IndexCheck(indexed=8, held=8)
    assert index.offsets == [0, 3, 6]  # 3 + 3 + 2 ids: the third page is short
    index.offsets.clear()
    full_pages = IndexChecker(InMemoryIndexedFacts(db), index, page=4, id_page=4)
    assert full_pages.check(repair=False) == IndexCheck(indexed=8, held=8)
    assert index.offsets == [0, 4, 8]  # a full last page cannot tell it is the last


class WithLegacyMetadata(InMemoryVectorIndex):
    """An index whose vectors carry a metadata key an older version wrote."""

    def stored(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, StoredFact]:
        return {
            i: StoredFact(s.document, {**s.metadata, "legacy_rank": 3})
            for i, s in super().stored(fact_ids).items()
        }


def test_a_metadata_key_this_version_does_not_write_is_no_difference() -> None:
    db, index = InMemoryDatabase(), WithLegacyMetadata(BagOfWordsEmbedder())
    facts = facts_of_two_organizations()
    indexed(db, index, facts)
    index.upsert([replace(facts[0], salience=0.25)])  # a field this version writes differs
    result = IndexChecker(InMemoryIndexedFacts(db), index).check(repair=False)
    assert result == IndexCheck(indexed=8, differing=1, held=8)


class WrittenAgainDuringTheWalk(InMemoryVectorIndex):
    """An index whose listing of a later page comes after a fact had its row written again."""

    def __init__(self, db: InMemoryDatabase, fact: Fact) -> None:
        super().__init__(BagOfWordsEmbedder())
        self._db, self._fact = db, fact

    def ids_page(self, offset: int, limit: int) -> list[str]:
        if offset > 0:
            indexed(self._db, self, [self._fact])
        return super().ids_page(offset, limit)


def test_a_vector_whose_row_came_back_during_the_walk_is_not_deleted() -> None:
    db = InMemoryDatabase()
    facts = facts_of_two_organizations()
    again = facts[0]
    index = WrittenAgainDuringTheWalk(db, again)
    indexed(db, index, facts)
    del db.facts[again.fact_id]  # erased, its vector left behind; written again later
    assert index.ids_page(0, 1)[0] == str(again.fact_id)  # on the walk's first page

    result = IndexChecker(InMemoryIndexedFacts(db), index, page=4, id_page=3).check(repair=True)

    # Pass 1 ran before the row was back; pass 2 saw the vector as an orphan, at first.
    assert result == IndexCheck(indexed=7, held=8)
    assert str(again.fact_id) in held(index)
