from __future__ import annotations

import numpy as np

from store.embeddings import CachingEmbedder
from tests.support.fakes import BagOfWordsEmbedder


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


def test_least_recently_used_texts_are_forgotten_first() -> None:
    inner = BagOfWordsEmbedder()
    cached = CachingEmbedder(inner, max_entries=2)
    cached.embed(["a one", "b two"])
    cached.embed(["a one"])  # "a one" is now the most recent
    cached.embed(["c three"])  # evicts "b two"
    inner.calls.clear()
    cached.embed(["a one", "c three", "b two"])
    assert [list(c) for c in inner.calls] == [["b two"]]


def test_warming_runs_the_model_once_and_caches_nothing() -> None:
    inner = BagOfWordsEmbedder()
    cached = CachingEmbedder(inner, max_entries=1)
    cached.embed(["lives in Berlin"])
    cached.warm()
    cached.embed(["lives in Berlin"])
    assert len(inner.calls) == 2  # the remembered vector was not evicted by the warm-up
