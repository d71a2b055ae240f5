"""The read path's plumbing without services: background writer, injection cache, rewrite."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from domain.errors import QueryRewriteFailed
from domain.model import MemoryState
from store.errors import DatabaseUnavailable
from store.read.background import BatchWriter, WriterSettings
from store.read.fact_queries import Injection
from store.read.injection import InjectionCache
from store.read.query_rewrite import RewriteOutcome, TimeBoundRewriter

FAST = WriterSettings(max_queue=4, max_batch=3, max_delay_s=0.01, idle_exit_s=0.1, backoff_s=0.01)


class Sink:
    def __init__(self, failures: int = 0, gate: threading.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.failures = failures
        self.gate = gate

    def write(self, items: Sequence[int]) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        if self.failures:
            self.failures -= 1
            raise DatabaseUnavailable("down")
        self.batches.append(list(items))


def test_writer_batches_and_flushes_on_close() -> None:
    sink = Sink()
    writer = BatchWriter("t", sink.write, FAST)
    for i in range(4):
        assert writer.submit(i)
    writer.close()
    assert sorted(x for b in sink.batches for x in b) == [0, 1, 2, 3]
    assert all(len(b) <= 3 for b in sink.batches)
    assert not writer.submit(5)  # closed


def test_submit_never_blocks_and_counts_what_it_drops() -> None:
    gate = threading.Event()
    sink = Sink(gate=gate)
    dropped: list[tuple[str, str, int]] = []
    writer = BatchWriter("t", sink.write, FAST, on_dropped=lambda *a: dropped.append(a))
    started = time.perf_counter()
    accepted = [writer.submit(i) for i in range(20)]
    assert time.perf_counter() - started < 0.5
    assert not all(accepted)
    assert sum(n for _, reason, n in dropped if reason == "queue full") == accepted.count(False)
    gate.set()
    writer.close()
    assert len([x for b in sink.batches for x in b]) == accepted.count(True)


def test_failed_writes_are_retried_then_dropped() -> None:
    sink = Sink(failures=2)
    writer = BatchWriter("t", sink.write, FAST)
    writer.submit(1)
    assert writer.flush(5)
    assert sink.batches == [[1]]
    dropped: list[tuple[str, str, int]] = []
    hopeless = BatchWriter(
        "t", Sink(failures=99).write, FAST, on_dropped=lambda *a: dropped.append(a)
    )
    hopeless.submit(1)
    hopeless.close()
    assert dropped == [("t", "write failed", 1)]


def test_the_worker_exits_when_idle_and_comes_back() -> None:
    sink = Sink()
    writer = BatchWriter("t", sink.write, FAST)
    writer.submit(1)
    writer.flush(5)
    time.sleep(0.4)
    assert not [t for t in threading.enumerate() if t.name == "writer-t"]
    writer.submit(2)
    writer.close()
    assert [x for b in sink.batches for x in b] == [1, 2]


class Reads:
    def __init__(self) -> None:
        self.version: int | None = None
        self.loads = 0

    def memory_version(self, user_id: str) -> int | None:
        return self.version

    def injection(self, user_id: str) -> Injection | None:
        self.loads += 1
        if self.version is None:
            return None
        return Injection(MemoryState(user_id, "org", f"W{self.version}", version=self.version))


def test_injection_cache_reloads_only_when_the_version_moves() -> None:
    reads = Reads()
    cache = InjectionCache(reads, max_users=1)
    assert cache.get("ada") == (Injection(MemoryState("ada", "")), False)
    reads.version = 1
    assert cache.get("ada")[0].state.working_memory == "W1"
    assert cache.get("ada")[1] is True
    reads.version = 2
    fresh, hit = cache.get("ada")
    assert (fresh.state.working_memory, hit) == ("W2", False)
    assert reads.loads == 2
    cache.get("bob")  # evicts ada (max_users=1)
    cache.get("ada")
    assert reads.loads == 4


def slow(query: str) -> str:
    time.sleep(1)
    return "never used"


def failing(query: str) -> str:
    raise QueryRewriteFailed("no")


@pytest.mark.parametrize(
    ("rewrite", "query", "expected", "outcome"),
    [
        (
            lambda q: "  Ada's  employer ",
            "where does she work",
            "Ada's employer",
            RewriteOutcome.REWRITTEN,
        ),
        (lambda q: q, "same", "same", RewriteOutcome.UNCHANGED),
        (lambda q: "", "raw", "raw", RewriteOutcome.UNCHANGED),
        (slow, "raw", "raw", RewriteOutcome.TIMEOUT),
        (failing, "raw", "raw", RewriteOutcome.FAILED),
    ],
)
def test_rewrite_falls_back_to_the_raw_query(
    rewrite: object, query: str, expected: str, outcome: RewriteOutcome
) -> None:
    rewriter = TimeBoundRewriter(rewrite, timeout_s=0.05)  # type: ignore[arg-type]
    started = time.perf_counter()
    result = rewriter(query)
    assert time.perf_counter() - started < 0.5
    assert (result.query, result.outcome) == (expected, outcome)
    rewriter.close()
