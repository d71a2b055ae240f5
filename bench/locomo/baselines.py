"""Two baselines that search the raw turns of one conversation, with no memory in between.

- BM25 (Okapi, rank-bm25's defaults k1=1.5, b=0.75) over lower-cased word tokens;
- dense: the embedder memoryd indexes facts with (MiniLM), cosine, top-k turns.

Both see exactly the text memoryd ingests for a turn (`Turn.content`), one document per turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from rank_bm25 import BM25Okapi  # type: ignore[import-untyped]

from bench.locomo.dataset import Turn
from domain.ports import Embedder

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _top(scores: npt.NDArray[np.float64], turns: Sequence[Turn], k: int) -> list[str]:
    # Stable: equal scores keep conversation order, so a run is reproducible.
    order = np.argsort(-scores, kind="stable")[:k]
    return [turns[int(i)].dia_id for i in order]


class Bm25Turns:
    name = "BM25 over turns"

    def __init__(self, turns: Sequence[Turn]) -> None:
        self._turns = list(turns)
        documents = [tokenize(t.content) for t in self._turns]
        # rank-bm25 divides by the mean document length: none without a word (text in a
        # script the tokenizer does not read) would be a division by zero.
        self._bm25 = BM25Okapi(documents) if any(documents) else None

    def search(self, query: str, k: int) -> list[str]:
        if self._bm25 is None:
            return _top(np.zeros(len(self._turns)), self._turns, k)
        scores = np.asarray(self._bm25.get_scores(tokenize(query)), dtype=np.float64)
        return _top(scores, self._turns, k)


class DenseTurns:
    name = "dense over turns"

    def __init__(self, turns: Sequence[Turn], embedder: Embedder) -> None:
        self._turns = list(turns)
        self._embedder = embedder
        # The embedder returns unit vectors, so a dot product is the cosine.
        self._matrix = np.stack(embedder.embed([t.content for t in self._turns]))

    def search(self, query: str, k: int) -> list[str]:
        (vector,) = self._embedder.embed([query])
        scores = (self._matrix @ vector).astype(np.float64)
        return _top(scores, self._turns, k)
