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
    """An inverted index over one memory's facts, rows in the order of the dense matrix.

    Immutable: a memory's next version gets a new index (`with_rows_inserted`) sharing what
    did not change, while turns may still search this one."""

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
        self._found = np.repeat(np.arange(len(rows), dtype=np.int64), lengths)[order]
        self._tf = counts[order]
        bounds = np.searchsorted(codes[order], np.arange(len(vocabulary) + 1)).tolist()
        # A lexeme's posting is a span of the flat arrays: a new version shifts the rows of
        # every posting in one operation and shares the spans.
        self._spans = {
            lexeme: (bounds[code], bounds[code + 1]) for lexeme, code in vocabulary.items()
        }
        # Postings of the rows inserted since the build, laid flat in the order they came
        # (shifted in one operation too), and where each lexeme's are in them.
        self._added_rows = np.zeros(0, dtype=np.int64)
        self._added_tf = np.zeros(0, dtype=np.float64)
        self._added_at: dict[str, npt.NDArray[np.int64]] = {}

    @property
    def nbytes(self) -> int:
        return _POSTING_BYTES * (self._found.size + self.added_postings) + 8 * len(self)

    @property
    def added_postings(self) -> int:
        """Postings of the rows inserted since the build, held beside the spans."""
        return int(self._added_rows.size)

    @property
    def added_share(self) -> float:
        """The inserted rows' postings over the build's: past some share a search
        concatenates more than it slices, and a rebuild is due."""
        return self.added_postings / max(int(self._found.size), 1)

    def with_rows_inserted(self, positions: Sequence[int], rows: Sequence[Terms]) -> KeywordIndex:
        """A new index with `rows` inserted before this index's rows at `positions`
        (ascending; rows at equal positions keep their order), as the dense matrix inserts a
        version's new facts in fact-id order. Costs the flat arrays' size, not a rebuild."""
        at = np.asarray(positions, dtype=np.int64)
        grown = KeywordIndex.__new__(KeywordIndex)
        grown._spans = self._spans
        grown._tf = self._tf
        grown._found = self._found + np.searchsorted(at, self._found, side="right")
        grown._lengths = np.insert(self._lengths, at, [float(t.length) for t in rows])
        new_rows: list[int] = []
        new_tf: list[float] = []
        where: dict[str, list[int]] = {}
        start = self.added_postings
        for row, terms in zip((at + np.arange(at.size)).tolist(), rows, strict=True):
            for lexeme, count in zip(terms.lexemes, terms.counts, strict=True):
                where.setdefault(lexeme, []).append(start + len(new_rows))
                new_rows.append(row)
                new_tf.append(float(count))
        held = self._added_rows + np.searchsorted(at, self._added_rows, side="right")
        grown._added_rows = np.concatenate((held, np.array(new_rows, dtype=np.int64)))
        grown._added_tf = np.concatenate((self._added_tf, np.array(new_tf, dtype=np.float64)))
        grown._added_at = dict(self._added_at)
        for lexeme, found in where.items():
            fresh = np.array(found, dtype=np.int64)
            before = grown._added_at.get(lexeme)
            grown._added_at[lexeme] = fresh if before is None else np.concatenate((before, fresh))
        return grown

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
            posting = self._posting(lexeme)
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

    def _posting(self, lexeme: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
        """The rows holding the lexeme and its count in each (rows in no particular order:
        a row's score does not depend on it)."""
        span = self._spans.get(lexeme)
        added = self._added_at.get(lexeme)
        if span is None:
            return None if added is None else (self._added_rows[added], self._added_tf[added])
        start, end = span
        rows, tf = self._found[start:end], self._tf[start:end]
        if added is None:
            return rows, tf
        rows = np.concatenate((rows, self._added_rows[added]))
        return rows, np.concatenate((tf, self._added_tf[added]))


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
