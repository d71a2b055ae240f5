"""The read path's plumbing without services: background writer, injection cache, rewrite."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

import pytest
from psycopg_pool import PoolClosed

from domain.errors import QueryRewriteFailed
from domain.ids import MemoryKey
from domain.model import MemoryState
from domain.reads import Injection, MemoryStamp
from store.errors import DatabaseUnavailable
from store.read.background import BatchWriter, WriterSettings
from store.read.injection import InjectionCache
from store.read.query_rewrite import RewriteOutcome, TimeBoundRewriter

FAST = WriterSettings(
    max_queue=4, max_batch=3, max_delay_s=0.01, idle_exit_s=0.1, backoff_s=0.01, backoff_max_s=0.05
)


def worker_of(writer: BatchWriter[int]) -> threading.Thread:
    """The writer's worker thread, named after the writer (a name no other test's uses)."""
    (worker,) = [t for t in threading.enumerate() if t.name == f"writer-{writer.name}"]
    return worker


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


def test_close_wakes_an_idle_worker_instead_of_waiting_out_its_idle_time() -> None:
    sink = Sink()
    writer = BatchWriter("wake", sink.write, FAST.model_copy(update={"idle_exit_s": 60.0}))
    assert writer.submit(1)
    assert writer.flush()
    time.sleep(0.05)  # the worker is now blocked waiting for the next item
    worker = worker_of(writer)
    writer.close()
    # Without the wake-up the worker would sleep out its 60 s wait: close returns at its
    # own 10 s join limit with the worker still alive.
    assert not worker.is_alive()
    assert sink.batches == [[1]]


def test_a_batch_gathers_for_its_delay_and_close_cuts_the_delay_short() -> None:
    sink = Sink()
    writer = BatchWriter(
        "t",
        sink.write,
        FAST.model_copy(update={"max_queue": 100, "max_batch": 100, "max_delay_s": 0.3}),
    )
    for i in range(10):
        assert writer.submit(i)
    assert writer.flush()
    assert sink.batches == [list(range(10))]  # one batch: the delay gathered them all
    slow = BatchWriter("cut", sink.write, FAST.model_copy(update={"max_delay_s": 60.0}))
    assert slow.submit(11)
    time.sleep(0.05)  # the worker has the item and is waiting out the batch delay
    worker = worker_of(slow)
    slow.close()
    # Cut short, not waited out: the item is written and the worker gone when close returns.
    assert not worker.is_alive()
    assert sink.batches[-1] == [11]


def test_a_full_queue_holds_back_the_submitter_and_drops_nothing() -> None:
    gate = threading.Event()
    sink = Sink(gate=gate)
    dropped: list[tuple[str, str, int]] = []
    pending: list[int] = []
    writer = BatchWriter(
        "t",
        sink.write,
        FAST,
        on_dropped=lambda *a: dropped.append(a),
        on_pending=lambda _n, n: pending.append(n),
    )
    submitter = threading.Thread(target=lambda: [writer.submit(i) for i in range(20)])
    submitter.start()
    submitter.join(0.3)
    # The writer is stuck on its first batch: the submitter waits for room (back-pressure).
    assert submitter.is_alive()
    assert max(pending) <= FAST.max_queue + FAST.max_batch
    gate.set()
    submitter.join(5)
    writer.close()
    assert sorted(x for b in sink.batches for x in b) == list(range(20))
    assert dropped == []
    assert pending[-1] == 0


def test_the_pending_count_reported_last_is_the_count_left() -> None:
    # The submitter's report of 1 is slow (a thread switch at the wrong moment); meanwhile
    # the worker writes the item and reports 0. The gauge must end at 0, not at 1.
    reported: list[int] = []
    worker_reported = threading.Event()

    def on_pending(_name: str, n: int) -> None:
        if n:
            worker_reported.wait(0.5)
        else:
            worker_reported.set()
        reported.append(n)

    writer = BatchWriter("t", Sink().write, FAST, on_pending=on_pending)
    writer.submit(1)
    assert writer.flush(5)
    writer.close()
    assert reported[-1] == 0, reported


def test_failed_writes_are_retried_until_they_pass() -> None:
    # Four attempts used to be the limit: the fifth write, and the rows, were dropped.
    sink = Sink(failures=12)
    dropped: list[tuple[str, str, int]] = []
    writer = BatchWriter("t", sink.write, FAST, on_dropped=lambda *a: dropped.append(a))
    writer.submit(1)
    assert writer.flush(10)
    assert sink.batches == [[1]]
    assert sink.failures == 0
    assert dropped == []


def test_what_cannot_be_written_at_shutdown_is_given_up_and_counted() -> None:
    dropped: list[tuple[str, str, int]] = []
    hopeless = BatchWriter(
        "hopeless", Sink(failures=10**9).write, FAST, on_dropped=lambda *a: dropped.append(a)
    )
    hopeless.submit(1)
    worker = worker_of(hopeless)
    hopeless.close(timeout_s=0.3)
    # Given up, the worker stops retrying and exits: it would otherwise retry for good.
    worker.join(10)
    assert not worker.is_alive()
    assert dropped == [("hopeless", "shutdown", 1)]
    assert not hopeless.submit(2)  # closed


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


GEN_1, GEN_2 = uuid.UUID(int=1), uuid.UUID(int=2)


class Reads:
    """Memories by key: (generation, version) and W; a missing key is an unknown memory."""

    def __init__(self) -> None:
        self.memories: dict[MemoryKey, tuple[uuid.UUID, int]] = {}
        self.loads = 0

    def set(self, key: MemoryKey, version: int, generation: uuid.UUID = GEN_1) -> None:
        self.memories[key] = (generation, version)

    def memory_stamp(self, key: MemoryKey) -> MemoryStamp | None:
        found = self.memories.get(key)
        return None if found is None else MemoryStamp(*found)

    def memory_stamps(self, keys: Sequence[MemoryKey]) -> dict[MemoryKey, MemoryStamp]:
        return {k: MemoryStamp(*self.memories[k]) for k in keys if k in self.memories}

    def injection(self, key: MemoryKey) -> Injection | None:
        self.loads += 1
        found = self.memories.get(key)
        if found is None:
            return None
        generation, version = found
        state = MemoryState(key.user_id, key.organization_id, f"{key} W{version}", version=version)
        return Injection(state, generation=generation)


ADA_A, ADA_B, BOB = MemoryKey("org-a", "ada"), MemoryKey("org-b", "ada"), MemoryKey("org-a", "bob")


def test_injection_cache_reloads_only_when_the_version_moves() -> None:
    reads = Reads()
    cache = InjectionCache(reads, max_users=1)
    assert cache.get(ADA_A) == (Injection(MemoryState.empty(ADA_A)), False)
    reads.set(ADA_A, 1)
    assert cache.get(ADA_A)[0].state.working_memory == "org-a/ada W1"
    assert cache.get(ADA_A)[1] is True
    reads.set(ADA_A, 2)
    fresh, hit = cache.get(ADA_A)
    assert (fresh.state.working_memory, hit) == ("org-a/ada W2", False)
    assert reads.loads == 2
    reads.set(BOB, 1)
    cache.get(BOB)  # evicts ada (max_users=1)
    cache.get(ADA_A)
    assert reads.loads == 4


def test_the_same_user_id_in_two_organizations_is_two_entries() -> None:
    reads = Reads()
    cache = InjectionCache(reads)
    reads.set(ADA_A, 1)
    reads.set(ADA_B, 1)
    assert cache.get(ADA_A)[0].state.working_memory == "org-a/ada W1"
    b, hit = cache.get(ADA_B)
    assert (b.state.working_memory, b.state.organization_id, hit) == (
        "org-b/ada W1",
        "org-b",
        False,
    )
    assert cache.get(ADA_A)[0].state.organization_id == "org-a"
    assert sorted(cache.memories()) == [ADA_A, ADA_B]


def test_an_erased_memory_leaves_the_cache() -> None:
    reads = Reads()
    cache = InjectionCache(reads)
    reads.set(ADA_A, 3)
    cache.get(ADA_A)
    # Erased, then memory starts afresh and reaches the same version: the cached injection
    # of the old generation must not be served for it.
    reads.set(ADA_A, 3, generation=GEN_2)
    fresh, hit = cache.get(ADA_A)
    assert (hit, fresh.generation) == (False, GEN_2)
    del reads.memories[ADA_A]  # erased, not recreated: the next read drops the entry
    assert cache.get(ADA_A) == (Injection(MemoryState.empty(ADA_A)), False)
    assert cache.memories() == []


def test_the_sweep_drops_what_changed_or_went_elsewhere() -> None:
    reads = Reads()
    cache = InjectionCache(reads)
    for key in (ADA_A, ADA_B, BOB):
        reads.set(key, 1)
        cache.get(key)
    del reads.memories[ADA_B]  # erased by another process
    reads.set(BOB, 1, generation=GEN_2)  # one of its facts erased elsewhere
    assert cache.sweep() == 2
    assert cache.memories() == [ADA_A]
    assert [e.state.working_memory for e in cache.entries()] == ["org-a/ada W1"]


class Hung:
    """A rewrite that does not answer until released; `answered` is set once it does."""

    def __init__(self) -> None:
        self.released, self.answered = threading.Event(), threading.Event()

    def __call__(self, query: str) -> str:
        self.released.wait(10)
        self.answered.set()
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
        (None, "raw", "raw", RewriteOutcome.TIMEOUT),  # a Hung rewrite
        (failing, "raw", "raw", RewriteOutcome.FAILED),
    ],
)
def test_rewrite_falls_back_to_the_raw_query(
    rewrite: object, query: str, expected: str, outcome: RewriteOutcome
) -> None:
    hung = Hung()
    rewriter = TimeBoundRewriter(rewrite or hung, timeout_s=0.05)  # type: ignore[arg-type]
    result = rewriter(query)
    # A hung rewrite is not waited for: the turn has its answer while the call still runs.
    assert not hung.answered.is_set()
    assert (result.query, result.outcome) == (expected, outcome)
    hung.released.set()
    rewriter.close()


def test_a_closed_pool_is_no_outage_to_wait_out() -> None:
    def write(items: Sequence[int]) -> None:
        try:
            raise PoolClosed("the pool 'memoryd' is already closed")
        except PoolClosed as e:
            raise DatabaseUnavailable(str(e)) from e

    dropped: list[tuple[str, str, int]] = []
    idle = FAST.model_copy(update={"idle_exit_s": 60.0})  # the worker outlives the drop
    writer = BatchWriter("closed", write, idle, on_dropped=lambda *a: dropped.append(a))
    writer.submit(1)
    # A closed pool never opens again: retrying would spin for the rest of the process (a
    # service whose pool was closed before the service was), so the rows are given up at once.
    assert writer.flush(timeout_s=5)
    assert dropped == [("closed", "shutdown", 1)]
    worker = worker_of(writer)
    writer.close(timeout_s=5)
    assert not worker.is_alive()
