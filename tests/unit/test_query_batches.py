"""Chat turns' queries embedded together: batching, errors and cancelled turns."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from domain.ports import Vector
from memoryd.api.query_batches import QueryBatches
from store.errors import EmbeddingModelError


class GatedEmbedder:
    """Records each call's texts; the first call waits until the test opens the gate."""

    model_name = "gated"
    dimension = 2

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.fail = fail

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.gate.wait(timeout=10)
        if self.fail:
            raise EmbeddingModelError("model gone")
        return [np.zeros(2, dtype=np.float32) for _ in texts]


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def calls_for_turns_behind_a_running_one(queued: Sequence[str], max_batch: int) -> list[list[str]]:
    """The model's calls when turn "a" is being embedded and `queued` arrive meanwhile."""
    embedder = GatedEmbedder()
    batches = QueryBatches(embedder, max_batch=max_batch)

    async def turns() -> None:
        first = asyncio.create_task(batches.embed("a"))
        await _until(lambda: len(embedder.calls) == 1)
        rest = [asyncio.create_task(batches.embed(t)) for t in queued]
        await asyncio.sleep(0.01)
        embedder.gate.set()
        await asyncio.gather(first, *rest)

    asyncio.run(turns())
    batches.close()
    return embedder.calls


def test_queries_that_arrive_while_the_model_runs_go_in_one_call() -> None:
    # The same text asked twice is embedded once.
    assert calls_for_turns_behind_a_running_one(["b", "c", "b", "d"], 16) == [
        ["a"],
        ["b", "c", "d"],
    ]


def test_a_batch_holds_at_most_max_batch_queries() -> None:
    assert calls_for_turns_behind_a_running_one(["b", "c", "d"], 2) == [["a"], ["b", "c"], ["d"]]


def test_the_models_error_reaches_every_turn_of_its_batch() -> None:
    embedder = GatedEmbedder(fail=True)
    embedder.gate.set()
    batches = QueryBatches(embedder)

    async def turns() -> list[BaseException | None]:
        results = await asyncio.gather(
            batches.embed("a"), batches.embed("b"), return_exceptions=True
        )
        return list(results)

    results = asyncio.run(turns())
    batches.close()
    assert [type(r) for r in results] == [EmbeddingModelError, EmbeddingModelError]


def test_a_cancelled_turn_leaves_the_others_of_its_batch_served() -> None:
    embedder = GatedEmbedder()
    batches = QueryBatches(embedder)

    async def turns() -> None:
        first = asyncio.create_task(batches.embed("a"))
        await _until(lambda: len(embedder.calls) == 1)
        gone = asyncio.create_task(batches.embed("b"))
        kept = asyncio.create_task(batches.embed("c"))
        await asyncio.sleep(0.01)
        gone.cancel()
        embedder.gate.set()
        await asyncio.gather(first, kept)
        assert gone.cancelled()

    asyncio.run(turns())
    batches.close()
    assert embedder.calls == [["a"], ["b", "c"]]


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        QueryBatches(GatedEmbedder(), max_batch=0)
