"""Caches keyed by users' texts: bounded in size and in time, emptied while a process idles."""

from __future__ import annotations

import threading
import time

import pytest

from domain.timed_cache import TimedCache, timed_memo
from tests.support.fakes import MonotonicClock


def test_an_entry_leaves_its_max_age_after_it_was_put_used_or_not() -> None:
    clock = MonotonicClock()
    cache: TimedCache[str, int] = TimedCache(
        10, max_age_s=60, clock=clock, expire_in_background=False
    )
    cache.put("berlin", 1)
    clock.now += 30
    cache.put_many({"tea": 2, "berlin": 3})  # held already: keeps its value and its time
    assert cache.get("berlin") == 1
    clock.now += 29.9
    assert (cache.expire(), len(cache)) == (0, 2)
    clock.now += 0.1
    assert cache.get("berlin") is None  # its 60 s are up, tea's are not
    assert cache.get_many(["berlin", "tea"]) == {"tea": 2}
    cache.put("berlin", 4)
    clock.now += 30
    assert (cache.expire(), cache.get_many(["berlin", "tea"])) == (1, {"berlin": 4})


def test_the_oldest_entries_leave_first_when_full() -> None:
    cache: TimedCache[str, int] = TimedCache(2)
    cache.put_many({"a": 1, "b": 2})
    assert cache.get("a") == 1  # a hit does not make it younger
    cache.put("c", 3)
    assert cache.get_many(["a", "b", "c"]) == {"b": 2, "c": 3}


def test_an_idle_cache_empties_itself_and_its_thread_ends() -> None:
    before = _expiry_threads()
    cache: TimedCache[str, int] = TimedCache(10, max_age_s=1.0)
    cache.put("berlin", 1)
    cache.put("tea", 2)
    assert len(_expiry_threads() - before) == 1  # one thread, however many puts
    deadline = time.monotonic() + 10
    while (len(cache) or _expiry_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(cache) == 0  # nothing asked the cache anything meanwhile
    assert not _expiry_threads() - before
    cache.put("tea", 2)  # a new entry starts another
    assert len(_expiry_threads() - before) == 1


def test_a_memo_works_a_text_out_again_once_its_entry_is_gone() -> None:
    calls: list[str] = []

    @timed_memo(max_entries=10, max_age_s=0.2)
    def words(text: str) -> frozenset[str]:
        calls.append(text)
        return frozenset(text.split())

    assert words("likes green tea") == words("likes green tea") == {"likes", "green", "tea"}
    assert calls == ["likes green tea"]
    time.sleep(0.3)
    words("likes green tea")
    assert calls == ["likes green tea", "likes green tea"]


@pytest.mark.parametrize(("entries", "age"), [(0, 60.0), (10, 0.0), (10, -1.0)])
def test_bounds_must_be_positive(entries: int, age: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        TimedCache(entries, age)


def _expiry_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "content-cache-expiry"}
