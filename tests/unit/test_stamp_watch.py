"""The stamp watch: which memories' stamps a read process may trust without asking Postgres.

The listener on a real Postgres is checked in `tests/integration/test_read_path.py`."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from domain.ids import MemoryKey
from domain.model import MemoryState
from domain.reads import Injection, MemoryStamp
from store.read.injection import InjectionCache
from store.read.memory_changes import StampWatch

ADA = MemoryKey("org-a", "ada")
ADA_ELSEWHERE = MemoryKey("org-b", "ada")
V1 = MemoryStamp(uuid.UUID(int=1), 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watch(clock: Clock | None = None, max_memories: int = 10) -> StampWatch:
    watch = StampWatch(ttl_s=30.0, max_memories=max_memories, clock=clock or Clock())
    watch.listening(True)
    return watch


def _known(watch: StampWatch, key: MemoryKey = ADA, stamp: MemoryStamp = V1) -> StampWatch:
    reading = watch.reading()
    assert reading is not None
    watch.read(key, stamp, reading)
    return watch


def test_a_stamp_read_while_listening_is_trusted_for_its_memory_only() -> None:
    watch = _known(_watch())
    assert watch.current(ADA) == V1
    assert watch.current(ADA_ELSEWHERE) is None


def test_nothing_is_trusted_while_not_listening() -> None:
    watch = StampWatch(ttl_s=30.0, max_memories=10)
    assert watch.reading() is None
    assert watch.current(ADA) is None


@pytest.mark.parametrize(
    "event",
    [
        "announced",
        "announced elsewhere during the read",
        "reconnected",
        "lost",
        "expired",
        "not heard from",
    ],
)
def test_a_stamp_is_dropped_or_not_kept(event: str) -> None:
    clock = Clock()
    watch = _watch(clock)
    reading = watch.reading()
    assert reading is not None
    if event == "announced elsewhere during the read":
        # The read may have seen the memory before a commit announced since: not kept.
        watch.changed(ADA_ELSEWHERE)
    watch.read(ADA, V1, reading)
    if event == "announced":
        watch.changed(ADA)
    elif event == "reconnected":
        watch.listening(True)  # announcements may have been missed in between
    elif event == "lost":
        watch.listening(False)
    elif event == "expired":
        clock.now = 30.1
        watch.alive()
    elif event == "not heard from":
        # The listening connection went half-open: its ping hangs, its announcements are
        # lost, and it has not failed (yet).
        clock.now = 5.1
    assert watch.current(ADA) is None


def test_a_stamp_is_trusted_while_the_listener_answers_its_pings() -> None:
    clock = Clock()
    watch = _known(_watch(clock))
    for _ in range(10):
        clock.now += 1.0
        watch.alive()
    assert watch.current(ADA) == V1
    clock.now += 5.1
    assert watch.current(ADA) is None
    assert watch.reading() is None  # nor is a stamp read now kept


def test_the_watch_is_bounded_least_recently_read_first() -> None:
    watch = _watch(max_memories=2)
    keys = [MemoryKey("org-a", u) for u in ("a", "b", "c")]
    for key in keys:
        _known(watch, key)
    assert [watch.current(k) for k in keys] == [None, V1, V1]


class CountingReads:
    def __init__(self) -> None:
        self.stamps = 0
        self.version = 1

    def memory_stamp(self, key: MemoryKey) -> MemoryStamp | None:
        self.stamps += 1
        return MemoryStamp(V1.generation, self.version)

    def memory_stamps(self, keys: list[MemoryKey]) -> dict[MemoryKey, MemoryStamp]:
        return {k: MemoryStamp(V1.generation, self.version) for k in keys}

    def injection(self, key: MemoryKey) -> Injection:
        state = replace(MemoryState.empty(key), version=self.version)
        return Injection(state, generation=V1.generation)


def test_the_injection_cache_asks_for_the_stamp_only_until_it_is_watched() -> None:
    reads, watch = CountingReads(), _watch()
    cache = InjectionCache(reads, watch=watch)
    assert cache.get(ADA)[1] is False
    assert cache.get(ADA)[1] is True
    assert cache.get(ADA)[1] is True
    assert reads.stamps == 1
    reads.version = 2
    watch.changed(ADA)  # the run's commit, announced
    injection, hit = cache.get(ADA)
    assert (injection.state.version, hit, reads.stamps) == (2, False, 2)


def test_forgetting_a_memory_here_drops_its_watched_stamp() -> None:
    reads, watch = CountingReads(), _watch()
    cache = InjectionCache(reads, watch=watch)
    cache.get(ADA)
    cache.invalidate(ADA)
    assert watch.current(ADA) is None
