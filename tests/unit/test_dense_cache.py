"""The dense stage's per-memory matrices: scope masks and the byte-bounded LRU."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from domain.ids import NO_CONNECTION
from domain.model import FactStatus
from domain.reads import Scope
from store.read.dense import DenseCache, MemoryVectors

ROWS = [  # connection, status, context type
    (None, FactStatus.ACTIVE, "fact"),
    ("gh", FactStatus.ACTIVE, "fact"),
    ("mail", FactStatus.ACTIVE, "tool_output"),
    (None, FactStatus.ARCHIVED, "fact"),
]


def _memory(version: int = 1, facts: int = len(ROWS)) -> MemoryVectors:
    ids = tuple(uuid.UUID(int=i) for i in range(facts))
    rows = [ROWS[i % len(ROWS)] for i in range(facts)]
    return MemoryVectors(
        version=version,
        ids=ids,
        fact_versions=np.ones(facts, dtype=np.int64),
        matrix=np.eye(facts, 8, dtype=np.float32),
        connections=np.array([c or NO_CONNECTION for c, _, _ in rows], dtype=np.str_),
        statuses=np.array([list(FactStatus).index(s) for _, s, _ in rows], dtype=np.int8),
        context_types=np.array([t for _, _, t in rows], dtype=object),
        row_of={f: i for i, f in enumerate(ids)},
        pending={},
    )


@pytest.mark.parametrize(
    ("scope", "visible"),
    [
        (Scope("u"), [0]),
        (Scope("u", ("gh",)), [0, 1]),
        (Scope("u", ("gh", "mail")), [0, 1, 2]),
        (Scope("u", ("mail",), context_types=("tool_output",)), [2]),
        (Scope("u", statuses=(FactStatus.ACTIVE, FactStatus.ARCHIVED)), [0, 3]),
        (Scope("u", ("other",), statuses=(FactStatus.ARCHIVED,)), [3]),
    ],
)
def test_mask_follows_the_scope(scope: Scope, visible: list[int]) -> None:
    assert list(np.flatnonzero(_memory().mask(scope))) == visible


def test_cache_evicts_least_recently_used_by_bytes() -> None:
    one = _memory().nbytes
    cache = DenseCache(max_bytes=2 * one)
    cache.put(("org", "a"), _memory())
    cache.put(("org", "b"), _memory())
    assert cache.get(("org", "a")) is not None  # a is now the most recently used
    cache.put(("org", "c"), _memory())
    assert cache.get(("org", "b")) is None
    assert cache.get(("org", "a")) is not None
    assert cache.nbytes == 2 * one


def test_same_user_in_two_organizations_are_two_memories() -> None:
    cache = DenseCache(max_bytes=2**20)
    cache.put(("org-a", "u"), _memory(version=3))
    assert cache.get(("org-b", "u")) is None


def test_an_older_version_never_replaces_a_newer_one() -> None:
    cache = DenseCache(max_bytes=2**20)
    cache.put(("org", "u"), _memory(version=5))
    cache.put(("org", "u"), _memory(version=4))
    entry = cache.get(("org", "u"))
    assert entry is not None
    assert entry.version == 5


def test_a_memory_larger_than_the_bound_is_kept_alone() -> None:
    cache = DenseCache(max_bytes=1)
    cache.put(("org", "a"), _memory())
    cache.put(("org", "b"), _memory(facts=8))
    assert len(cache) == 1
    assert cache.get(("org", "b")) is not None
