from __future__ import annotations

import numpy as np

from store.embedding_cache import CachingEmbedder
from tests.support.fakes import BagOfWordsEmbedder, MonotonicClock


def test_each_distinct_text_is_embedded_once_and_order_is_kept() -> None:
    inner = BagOfWordsEmbedder()
    cached = CachingEmbedder(inner)
    first = cached.embed(["lives in Berlin", "likes tea", "lives in Berlin"])
    second = cached.embed(["likes tea", "works at Initech"])
    assert [list(c) for c in inner.calls] == [
        ["lives in Berlin", "likes tea"],
        ["works at Initech"],
    ]
    assert np.array_equal(first[1], second[0])
    assert np.array_equal(first[0], first[2])
    assert np.array_equal(first[0], inner.embed(["lives in Berlin"])[0])


def test_the_oldest_texts_are_dropped_first_when_full() -> None:
    inner = BagOfWordsEmbedder()
    cached = CachingEmbedder(inner, max_entries=2)
    cached.embed(["a one", "b two"])
    cached.embed(["a one"])  # a hit: its age still counts from when it was computed
    cached.embed(["c three"])  # full: "a one" goes, the oldest
    inner.calls.clear()
    cached.embed(["b two", "c three", "a one"])
    assert [list(c) for c in inner.calls] == [["a one"]]


def test_an_entry_is_dropped_its_max_age_after_it_was_computed_used_or_not() -> None:
    inner, clock = BagOfWordsEmbedder(), MonotonicClock()
    cached = CachingEmbedder(inner, max_age_s=60, clock=clock, expire_in_background=False)
    cached.embed(["lives in Berlin"])
    clock.now += 30
    cached.embed(["likes tea", "lives in Berlin"])  # a hit does not make it younger
    clock.now += 29.9
    assert (cached.expire(), len(cached)) == (0, 2)
    clock.now += 0.1
    assert (cached.expire(), len(cached)) == (1, 1)  # Berlin's 60 s are up, tea's are not
    inner.calls.clear()
    cached.embed(["lives in Berlin", "likes tea"])
    assert [list(c) for c in inner.calls] == [["lives in Berlin"]]  # computed again
    clock.now += 30
    assert (cached.expire(), len(cached)) == (1, 1)  # tea went; Berlin's new entry stays


def test_warming_runs_the_model_once_and_caches_nothing() -> None:
    inner = BagOfWordsEmbedder()
    cached = CachingEmbedder(inner, max_entries=1)
    cached.embed(["lives in Berlin"])
    cached.warm()
    cached.embed(["lives in Berlin"])
    assert len(inner.calls) == 2  # the remembered vector was not evicted by the warm-up
