"""The vector index checked against `memory_facts`, and repaired (`memoryd index-verify`).

Postgres is the system of record; Chroma is derived from it. A collection restored from an
older backup, recreated, or written by hand can lose vectors of facts Postgres marks indexed
(the indexer never looks at them again, and the read path cannot score them), hold them with
another text or metadata, or hold vectors of facts Postgres no longer has (an erased user's
text, in clear). Two passes:

1. every fact marked indexed, in id order, against what the index holds under its id: an
   absent or differing one is written again from its current row (`IndexedFacts.repair`);
2. every id the index holds, page by page, against the rows: one no row holds, still none
   once the walk is over, is deleted.

A fact or vector written or removed while a pass runs may be counted on the wrong side or
missed; running the check again settles it. Ids that are not fact ids (not a UUID) are
counted and left alone: they are not memoryd's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from domain.codec import fact_metadata
from domain.model import Fact
from domain.ports import IndexContents, IndexedFacts, StoredFact

log = logging.getLogger(__name__)

# Facts a page of pass 1 reads (their text and metadata from the index).
PAGE = 500
# Ids a page of pass 2 lists (ids only). Chroma lists a page at an offset by stepping over
# every id before it (2-3.5 us each here), so the walk costs the square of the collection
# over this page: 100,000 vectors listed in 22.1 s by 500, 4.6 s by 2,000, 2.4 s by 10,000;
# 1,000,000 in 121 s by 20,000, 51 s by 50,000, 30 s by 100,000. A page of 100,000 ids
# costs the checking process some 90 MB while it is decoded (50,000: 85; 20,000: 40).
ID_PAGE = 100_000
# Facts repaired a transaction: their rows stay locked while the index is written.
REPAIR_BATCH = 64


@dataclass(frozen=True)
class IndexCheck:
    indexed: int = 0  # facts marked indexed, checked
    absent: int = 0  # of those, not held by the index
    differing: int = 0  # held with another text or other metadata
    repaired: int = 0  # written to the index again
    held: int = 0  # ids the index holds, checked
    orphans: int = 0  # of those, of facts no row holds
    removed: int = 0  # orphans deleted
    foreign: int = 0  # ids that are not fact ids, left alone

    @property
    def consistent(self) -> bool:
        return not (self.absent or self.differing or self.orphans)


class IndexChecker:
    def __init__(
        self,
        facts: IndexedFacts,
        index: IndexContents,
        *,
        page: int = PAGE,
        id_page: int = ID_PAGE,
    ) -> None:
        if page < 1 or id_page < 1:
            raise ValueError(f"pages must be >= 1, got {page} and {id_page}")
        self._facts = facts
        self._index = index
        self._page = page
        self._id_page = id_page

    def check(self, *, repair: bool) -> IndexCheck:
        """Both passes; with `repair` false nothing is written, only counted."""
        indexed, absent, differing, repaired = self._check_facts(repair)
        held, orphans, foreign = self._check_vectors()
        orphans = self._still_orphans(orphans)
        if repair and orphans:
            self._index.delete(orphans)
            log.warning("deleted %d vector(s) of facts no row holds", len(orphans))
        result = IndexCheck(
            indexed=indexed,
            absent=absent,
            differing=differing,
            repaired=repaired,
            held=held,
            orphans=len(orphans),
            removed=len(orphans) if repair else 0,
            foreign=foreign,
        )
        log.info("index check: %s", result)
        return result

    def _check_facts(self, repair: bool) -> tuple[int, int, int, int]:
        indexed = absent = differing = repaired = 0
        after: uuid.UUID | None = None
        while page := self._facts.indexed_after(after, self._page):
            after = page[-1].fact_id
            stored = self._index.stored([f.fact_id for f in page])
            lost = [f.fact_id for f in page if f.fact_id not in stored]
            other = [
                f.fact_id for f in page if f.fact_id in stored and not _same(f, stored[f.fact_id])
            ]
            indexed += len(page)
            absent += len(lost)
            differing += len(other)
            if repair:
                repaired += self._repair([*lost, *other])
        return indexed, absent, differing, repaired

    def _repair(self, fact_ids: Sequence[uuid.UUID]) -> int:
        done = 0
        for start in range(0, len(fact_ids), REPAIR_BATCH):
            batch = fact_ids[start : start + REPAIR_BATCH]
            done += len(self._facts.repair(batch, self._index.upsert))
        return done

    def _check_vectors(self) -> tuple[int, list[uuid.UUID], int]:
        """Ids held, those of no row, and how many are not fact ids. Deleting waits for the
        end of the walk: deleting while paging by offset would skip ids."""
        held = foreign = offset = 0
        orphans: list[uuid.UUID] = []
        while True:
            ids = self._index.ids_page(offset, self._id_page)
            offset += len(ids)
            held += len(ids)
            fact_ids = []
            for text in ids:
                try:
                    fact_ids.append(uuid.UUID(text))
                except ValueError:
                    foreign += 1
            orphans += self._facts.missing_facts(fact_ids)
            # A short page is the end: asking past it would step over the whole collection
            # once more (3.4 s at 1,000,000 vectors) to learn that nothing follows.
            if len(ids) < self._id_page:
                return held, orphans, foreign

    def _still_orphans(self, orphans: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """Those still of no row once the walk is over. A page's orphans were found before the
        rest of the walk, which can take minutes: an erased fact written again meanwhile (its
        id is a digest of its memory and content) has its row back, and its vector, which the
        indexer has written since, is its own again."""
        left: list[uuid.UUID] = []
        for start in range(0, len(orphans), self._id_page):
            left += self._facts.missing_facts(orphans[start : start + self._id_page])
        return left


def _same(fact: Fact, stored: StoredFact) -> bool:
    """The text, and every metadata field this version writes: a key an older version wrote
    and this one does not is left alone (Chroma merges metadata on update, so a repair could
    not remove it, and no filter reads it)."""
    if stored.document != fact.content:
        return False
    held = stored.metadata
    return all(k in held and held[k] == v for k, v in fact_metadata(fact).items())
