"""Embedding the queries of concurrent chat turns together.

A worker under load has several turns in flight. The float graph of the model costs less per
text in a call of several (one thread: 3.6 ms for one query, 2.4 ms each in fours, 2.1 ms in
eights); the integer graph, the default, runs a call's texts one by one (1.3 ms each), and
batching still pays there: one hand-off to the model thread for several turns (BENCHMARKS.md,
"The model's integer products"). Each turn's query is queued on the event loop; one model thread
embeds whatever is queued, in one call, while the next turns queue behind it. A turn alone
waits for no one: with nothing running, its query goes to the model at once.

The vectors land in the process's caching embedder, where the turn's dense search looks its
query up: the read path keeps its one `Embedder` and learns nothing of batches.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from domain.ports import Embedder


class QueryBatches:
    def __init__(self, embedder: Embedder, max_batch: int = 16) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._embedder = embedder
        self._max_batch = max_batch
        self._queued: list[tuple[str, asyncio.Future[None]]] = []
        self._drain: asyncio.Task[None] | None = None
        self._model = ThreadPoolExecutor(1, thread_name_prefix="query-embedding")

    async def embed(self, text: str) -> None:
        """Returns once `text`'s vector is in the embedder's cache; raises what the model
        raised for its batch."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queued.append((text, done))
        if self._drain is None:
            self._drain = loop.create_task(self._embed_queued())
        await done

    async def _embed_queued(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[tuple[str, asyncio.Future[None]]] = []
        try:
            while self._queued:
                batch = self._queued[: self._max_batch]
                del self._queued[: self._max_batch]
                texts = list(dict.fromkeys(text for text, _ in batch))
                try:
                    await loop.run_in_executor(self._model, self._embedder.embed, texts)
                except Exception as e:  # noqa: BLE001 - handed to every turn of the batch
                    _settle(batch, e)
                else:
                    _settle(batch, None)
        finally:
            # Cancelled (the server stopping): no turn is left waiting on a batch never run.
            for _, done in batch + self._queued:
                done.cancel()
            self._queued.clear()
            self._drain = None

    def close(self) -> None:
        self._model.shutdown(wait=True)


def _settle(batch: list[tuple[str, asyncio.Future[None]]], error: Exception | None) -> None:
    for _, done in batch:
        if done.done():  # its turn was cancelled: the client went away
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)
