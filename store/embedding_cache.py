"""The vectors of recently embedded texts, for a bounded time (`domain.timed_cache`).

One process embeds the same texts several times: the write gate compares proposals with the
active facts, the offline backend looks for duplicates among them, the indexer embeds what was
stored, and an API worker's query batch hands its vectors to the turns' dense searches. The
model is deterministic, so a remembered vector is the vector. The texts are users' content:
each leaves the cache `CONTENT_MAX_AGE_S` after its vector was computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from domain.ports import Embedder, Vector
from domain.timed_cache import CONTENT_MAX_AGE_S, TimedCache

DEFAULT_MAX_ENTRIES = 20_000


class CachingEmbedder:
    """An `Embedder` that remembers the vectors of recent texts (thread-safe); a text asked
    for once its entry is gone is embedded again."""

    def __init__(
        self,
        inner: Embedder,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_age_s: float = CONTENT_MAX_AGE_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        expire_in_background: bool = True,
    ) -> None:
        self._inner = inner
        self.model_name = inner.model_name
        self.dimension = inner.dimension
        self._vectors: TimedCache[str, Vector] = TimedCache(
            max_entries, max_age_s, clock=clock, expire_in_background=expire_in_background
        )

    def __len__(self) -> int:
        return len(self._vectors)

    def warm(self) -> None:
        """Load the model and run it once now, past the cache: the first consolidation would
        otherwise wait seconds for it (bench.processor, "Processor overhead")."""
        self._inner.embed(["warm-up"])

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        known = self._vectors.get_many(list(texts))
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            fresh = dict(zip(missing, self._inner.embed(missing), strict=True))
            known.update(fresh)
            self._vectors.put_many(fresh)
        return [known[t] for t in texts]

    def known(self, texts: Sequence[str]) -> dict[str, Vector]:
        """The vectors held of these texts, without running the model for the others."""
        return self._vectors.get_many(list(texts))

    def remember(self, vectors: Mapping[str, Vector]) -> None:
        """Keep vectors computed elsewhere by this model (stored ones, fetched from the index)
        as if embedded here now; a text held already keeps its entry."""
        self._vectors.put_many(dict(vectors))

    def expire(self) -> int:
        """Drop the vectors computed more than `max_age_s` ago now; returns how many went."""
        return self._vectors.expire()
