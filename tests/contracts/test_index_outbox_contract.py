"""The index outbox's catch-up on versions an indexer wrote but could not mark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from domain.model import Fact
from tests.contracts.conftest import Stores
from tests.support.builders import BASE_TIME, make_fact, seed

LATER = BASE_TIME + timedelta(hours=1)


def test_only_facts_not_indexed_at_the_version_written_are_handed_back(stores: Stores) -> None:
    kept, moved, pending = (
        make_fact("ada", "Ada lives in Berlin"),
        make_fact("ada", "Ada likes tea"),
        make_fact("ada", "Ada plays chess"),
    )
    seed(stores.memory, "ada", [kept, moved, pending])
    read = stores.memory.facts_by_id([kept.fact_id, moved.fact_id, pending.fact_id])
    stores.memory.mark_indexed(
        [f for f in read if f.fact_id != pending.fact_id], LATER, lambda marked: []
    )
    seed(stores.memory, "ada", [replace(moved, content="Ada likes coffee", updated_at=LATER)])
    (current,) = stores.memory.facts_by_id([moved.fact_id])
    stores.memory.mark_indexed([current], LATER, lambda marked: [])
    gone = replace(read[0], fact_id=make_fact("ada", "never stored").fact_id)

    written: list[Sequence[Fact]] = []
    handed = stores.memory.rewrite_overtaken([*read, gone], written.append)

    # The one marked at the version read needs nothing; a newer version, or one left
    # pending, is handed back as it is now; a fact with no row is not the store's to give.
    assert sorted(f.content for f in handed) == ["Ada likes coffee", "Ada plays chess"]
    assert written == [handed]
    assert stores.memory.rewrite_overtaken([current], written.append) == []
    assert len(written) == 1


def test_a_text_redacted_in_place_is_neither_marked_nor_taken_as_indexed(stores: Stores) -> None:
    seed(stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin")])
    (stored,) = stores.memory.pending_index()
    unredacted = replace(stored, content="Ada lives in Berlin with Bramble")  # same version
    assert stores.memory.mark_indexed([unredacted], LATER, lambda marked: []) == []
    assert stores.memory.mark_indexed([stored], LATER, lambda marked: []) == [stored]
    written: list[Sequence[Fact]] = []
    (handed,) = stores.memory.rewrite_overtaken([unredacted], written.append)
    assert handed.content == "Ada lives in Berlin"
