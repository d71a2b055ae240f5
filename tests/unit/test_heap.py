"""A serving process's heap settled after start-up: frozen, yet still collecting cycles."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from memoryd.ops import heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_settling_freezes_what_lives_and_later_cycles_are_still_collected() -> None:
    survivor = _Node()
    heap.settle((10_000, 20, 10))

    assert gc.get_threshold() == (10_000, 20, 10)
    assert gc.get_freeze_count() > 0
    # What lived at start-up is out of the collector's generations...
    assert not any(o is survivor for o in gc.get_objects())
    # ...while garbage made afterwards, cycles included, is still found by a collection.
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


@pytest.mark.usefixtures("restored_gc")
def test_settling_without_thresholds_freezes_and_keeps_the_interpreters() -> None:
    gc.set_threshold(700, 10, 10)
    survivor = _Node()
    heap.settle()

    assert gc.get_threshold() == (700, 10, 10)
    assert not any(o is survivor for o in gc.get_objects())
