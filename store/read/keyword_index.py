"""The keyword stage of retrieval: Okapi BM25 over one memory's facts, held in process.

The SQL form (`store.read.fact_queries`) counts the documents and their mean length over all
the facts in scope on every search, so its cost follows the memory (147-190 ms for a user of
10,000 facts), not the answer. Here each fact's lexemes (Postgres's own `content_tsv`, so the
stemming and stop words are Postgres's) are read once per memory stamp, beside the dense
stage's matrix and with its eviction, and inverted: lexeme -> (rows, term frequencies). A
search masks the postings with the scope and scores only the facts that share a lexeme with
the query, with the statistics the SQL form uses (k1, b, document frequencies, count and mean
length over the facts in scope), so it ranks as the SQL does: ties by fact id.

A query's lexemes also come from Postgres (`to_tsvector('english', text)`, one round trip),
remembered per text in a bounded LRU: the dictionary does not change under a running process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import numpy.typing as npt

from domain.timed_cache import TimedCache
from store.read.fact_queries import BM25_B, BM25_K1
from store.read.ranking import top_n

__all__ = ["KeywordIndex", "QueryLexemes", "Terms"]

_POSTING_BYTES = 16  # a row number and a term frequency, plus the dict's share


@dataclass(frozen=True)
class Terms:
    """One fact's lexemes (as in its `content_tsv`) and how often each occurs."""

    lexemes: tuple[str, ...]
    counts: tuple[int, ...]

    @property
    def length(self) -> int:
        """BM25's document length: the tsvector's `length`, its number of distinct lexemes."""
        return len(self.lexemes)


class KeywordIndex:
    """An inverted index over one memory's facts, rows in the order of the dense matrix."""

    def __init__(self, rows: Sequence[Terms]) -> None:
        lengths = np.fromiter((t.length for t in rows), dtype=np.int64, count=len(rows))
        self._lengths = lengths.astype(np.float64)
        total = int(lengths.sum())
        # Every (row, lexeme, count) laid flat, then sorted by lexeme (stably, so each posting
        # keeps row order): one sort and a slice per lexeme instead of a list per lexeme grown
        # one occurrence at a time (10,000 facts of ten lexemes: 26 ms instead of 40).
        flat = list(chain.from_iterable(t.lexemes for t in rows))
        vocabulary = {lexeme: code for code, lexeme in enumerate(dict.fromkeys(flat))}
        codes = np.fromiter(map(vocabulary.__getitem__, flat), dtype=np.int64, count=total)
        counts = np.fromiter(
            chain.from_iterable(t.counts for t in rows), dtype=np.float64, count=total
        )
        order = np.argsort(codes, kind="stable")
        found = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)[order]
        counts = counts[order]
        bounds = np.searchsorted(codes[order], np.arange(len(vocabulary) + 1)).tolist()
        self._postings = {
            lexeme: (
                found[bounds[code] : bounds[code + 1]],
                counts[bounds[code] : bounds[code + 1]],
            )
            for lexeme, code in vocabulary.items()
        }
        self.nbytes = _POSTING_BYTES * total + 8 * len(rows)

    def __len__(self) -> int:
        return int(self._lengths.size)

    def search(
        self, lexemes: Sequence[str], visible: npt.NDArray[np.bool_], limit: int
    ) -> list[int]:
        """Rows of the best `limit` facts among `visible` sharing a lexeme with the query,
        best BM25 score first, equal scores in row (fact id) order."""
        n = int(np.count_nonzero(visible))
        if limit <= 0 or n == 0:
            return []
        avgdl = max(float(self._lengths[visible].mean()), 1.0)
        scores = np.zeros(self._lengths.size, dtype=np.float64)
        matched = np.zeros(self._lengths.size, dtype=np.bool_)
        for lexeme in sorted(set(lexemes)):
            posting = self._postings.get(lexeme)
            if posting is None:
                continue
            rows, tf = posting
            keep = visible[rows]
            rows, tf = rows[keep], tf[keep]
            df = rows.size
            if df == 0:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            norm = BM25_K1 * (1 - BM25_B + BM25_B * self._lengths[rows] / avgdl)
            scores[rows] += idf * tf * (BM25_K1 + 1) / (tf + norm)
            matched[rows] = True
        candidates = np.flatnonzero(matched)
        order = top_n(scores[candidates], limit)
        return [int(candidates[k]) for k in order]


class QueryLexemes:
    """A query text's lexemes as Postgres's `to_tsvector('english', ...)` makes them, per text
    for a bounded time (`domain.timed_cache`: the texts are users' questions); `source` is the
    round trip."""

    def __init__(self, source: Callable[[str], list[str]], max_texts: int = 10_000) -> None:
        self._source = source
        self._known: TimedCache[str, tuple[str, ...]] = TimedCache(max_texts)

    def __call__(self, text: str) -> tuple[str, ...]:
        found = self._known.get(text)
        if found is None:
            found = tuple(self._source(text))
            self._known.put(text, found)
        return found
