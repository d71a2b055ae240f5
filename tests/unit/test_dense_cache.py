"""The dense stage's per-memory matrices: scope masks and the byte-bounded LRU."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
import pytest

from domain.ids import NO_CONNECTION, MemoryKey
from domain.model import FactStatus
from domain.reads import MemoryStamp, Scope
from store.read.keyword_index import KeywordIndex, Terms
from store.read.memory_entry import DenseCache, MemoryVectors
from store.read.vector_rows import AppendOnlyMatrix
from tests.support.builders import make_fact

U = MemoryKey("org", "u")
GENERATION = uuid.UUID(int=1)
TERMS = Terms(("bee", "roof"), (1, 2))
ROWS = [  # connection, status, context type
    (None, FactStatus.ACTIVE, "fact"),
    ("gh", FactStatus.ACTIVE, "fact"),
    ("mail", FactStatus.ACTIVE, "tool_output"),
    (None, FactStatus.ARCHIVED, "fact"),
]


def _memory(
    version: int = 1, facts: int = len(ROWS), generation: uuid.UUID = GENERATION
) -> MemoryVectors:
    ids = tuple(uuid.UUID(int=i) for i in range(facts))
    rows = [ROWS[i % len(ROWS)] for i in range(facts)]
    return MemoryVectors(
        stamp=MemoryStamp(generation, version),
        ids=ids,
        fact_versions=np.ones(facts, dtype=np.int64),
        vectors=AppendOnlyMatrix(np.eye(facts, 8, dtype=np.float32)),
        slots=np.arange(facts, dtype=np.int64),
        extent=facts,
        vectored=np.ones(facts, dtype=np.bool_),
        connections=np.array([c or NO_CONNECTION for c, _, _ in rows], dtype=np.str_),
        statuses=np.array([list(FactStatus).index(s) for _, s, _ in rows], dtype=np.int8),
        context_types=np.array([t for _, _, t in rows], dtype=object),
        row_of={f: i for i, f in enumerate(ids)},
        pending={},
        terms=tuple(TERMS for _ in ids),
        keywords=KeywordIndex([TERMS] * facts),
        facts=tuple(
            make_fact(U.user_id, f"fact {i}", org=U.organization_id, fact_id=f)
            for i, f in enumerate(ids)
        ),
    )


@pytest.mark.parametrize(
    ("scope", "visible"),
    [
        (Scope(U), [0]),
        (Scope(U, ("gh",)), [0, 1]),
        (Scope(U, ("gh", "mail")), [0, 1, 2]),
        (Scope(U, ("mail",), context_types=("tool_output",)), [2]),
        (Scope(U, statuses=(FactStatus.ACTIVE, FactStatus.ARCHIVED)), [0, 3]),
        (Scope(U, ("other",), statuses=(FactStatus.ARCHIVED,)), [3]),
    ],
)
def test_mask_follows_the_scope(scope: Scope, visible: list[int]) -> None:
    assert list(np.flatnonzero(_memory().mask(scope))) == visible


def test_a_scope_s_mask_is_kept_read_only_and_masks_of_other_scopes_differ() -> None:
    memory = _memory()
    first = memory.mask(Scope(U, ("gh",)))
    assert memory.mask(Scope(U, ("gh",))) is first
    with pytest.raises(ValueError, match="read-only"):
        first &= False
    assert list(np.flatnonzero(memory.mask(Scope(U, ("mail",))))) == [0, 2]
    assert list(np.flatnonzero(first)) == [0, 1]


def test_masks_stay_right_when_a_memory_sees_more_scopes_than_it_keeps() -> None:
    memory = _memory()
    for i in range(100):
        assert list(np.flatnonzero(memory.mask(Scope(U, (f"c{i}",))))) == [0]
    assert list(np.flatnonzero(memory.mask(Scope(U, ("gh",))))) == [0, 1]


def test_cache_evicts_least_recently_used_by_bytes() -> None:
    one = _memory().nbytes
    cache = DenseCache(max_bytes=2 * one)
    cache.put(MemoryKey("org", "a"), _memory())
    cache.put(MemoryKey("org", "b"), _memory())
    assert cache.get(MemoryKey("org", "a")) is not None  # a is now the most recently used
    cache.put(MemoryKey("org", "c"), _memory())
    assert cache.get(MemoryKey("org", "b")) is None
    assert cache.get(MemoryKey("org", "a")) is not None
    assert cache.nbytes == 2 * one


def test_same_user_in_two_organizations_are_two_memories() -> None:
    cache = DenseCache(max_bytes=2**20)
    cache.put(MemoryKey("org-a", "u"), _memory(version=3))
    assert cache.get(MemoryKey("org-b", "u")) is None


def test_an_older_version_never_replaces_a_newer_one() -> None:
    cache = DenseCache(max_bytes=2**20)
    cache.put(MemoryKey("org", "u"), _memory(version=5))
    cache.put(MemoryKey("org", "u"), _memory(version=4))
    entry = cache.get(MemoryKey("org", "u"))
    assert entry is not None
    assert entry.stamp.version == 5


def test_a_memory_larger_than_the_bound_is_kept_alone() -> None:
    cache = DenseCache(max_bytes=1)
    cache.put(MemoryKey("org", "a"), _memory())
    cache.put(MemoryKey("org", "b"), _memory(facts=8))
    assert len(cache) == 1
    assert cache.get(MemoryKey("org", "b")) is not None


def test_a_new_generation_replaces_whatever_its_version() -> None:
    cache = DenseCache(max_bytes=2**20)
    cache.put(U, _memory(version=5))
    # After a forget the memory starts again: version 1 of a new generation is the current one.
    cache.put(U, _memory(version=1, generation=uuid.UUID(int=2)))
    entry = cache.get(U)
    assert entry is not None
    assert entry.stamp == MemoryStamp(uuid.UUID(int=2), 1)


def test_invalidate_drops_the_memory_and_its_bytes() -> None:
    cache = DenseCache(max_bytes=2**20)
    cache.put(U, _memory())
    cache.put(MemoryKey("org", "v"), _memory())
    cache.invalidate(U)
    cache.invalidate(U)  # twice is harmless
    assert cache.get(U) is None
    assert cache.nbytes == _memory().nbytes


def test_sweep_drops_memories_erased_or_changed_elsewhere() -> None:
    kept, changed, erased = (MemoryKey("org", n) for n in ("kept", "changed", "erased"))
    cache = DenseCache(max_bytes=2**20)
    for key in (kept, changed, erased):
        cache.put(key, _memory(version=3))
    asked: list[list[MemoryKey]] = []

    def stamps(keys: Sequence[MemoryKey]) -> dict[MemoryKey, MemoryStamp]:
        asked.append(list(keys))
        # `erased` no longer exists; `changed` has a new generation.
        return {kept: MemoryStamp(GENERATION, 3), changed: MemoryStamp(uuid.UUID(int=9), 3)}

    assert cache.sweep(stamps) == 2
    assert sorted(asked[0], key=str) == sorted([kept, changed, erased], key=str)
    assert cache.get(kept) is not None
    assert cache.get(changed) is None
    assert cache.get(erased) is None
    assert cache.nbytes == _memory().nbytes


def test_a_sweep_may_keep_entries_made_older_by_a_consolidation() -> None:
    older, erased, gone = (MemoryKey("org", n) for n in ("older", "erased", "gone"))
    cache = DenseCache(max_bytes=2**20)
    for key in (older, erased, gone):
        cache.put(key, _memory(version=3))

    def stamps(keys: Sequence[MemoryKey]) -> dict[MemoryKey, MemoryStamp]:
        return {older: MemoryStamp(GENERATION, 4), erased: MemoryStamp(uuid.UUID(int=9), 4)}

    assert cache.sweep(stamps, keep_older_versions=True) == 2
    assert cache.get(older) is not None
    assert cache.get(erased) is None
    assert cache.get(gone) is None
    assert cache.sweep(stamps) == 1  # without the option, a version behind is stale too
    assert cache.get(older) is None
