"""Deterministic stand-ins for what the in-memory adapters do not cover: embedders, backends,
a Kafka consumer, a dead-letter sink, and observers that remember what they were told."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import TopicPartition
from consumers.dead_letter import DeadLetter
from consumers.errors import DeadLetterError
from domain.model import RunRecord
from domain.ports import Vector
from processors.offline import OfflineBackend
from processors.schema import BackendResponse, ConsolidationBackend, ConsolidationRequest

# -- embedders --------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset({"a", "an", "the", "i", "my", "me", "is", "am", "to", "of", "in", "and"})


class MonotonicClock:
    """A `time.monotonic` stand-in that moves only when a test sets `now`."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class BagOfWordsEmbedder:
    """An `Embedder` that hashes words into a few dimensions: shared words, similar vectors.

    crc32 rather than `hash()` because string hashing is salted per process, and the tests
    need the same vector in every run.
    """

    model_name = "fake-bag-of-words"

    def __init__(self, dimension: int = 64) -> None:
        self.dimension = dimension
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        self.calls.append(list(texts))
        return [self._vector(t) for t in texts]

    def _vector(self, text: str) -> Vector:
        vector = np.zeros(self.dimension, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            if word not in _STOPWORDS:
                vector[zlib.crc32(word.encode()) % self.dimension] += 1.0
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm else vector


class LetterCountEmbedder:
    """A tiny deterministic embedder: 26 dimensions, one per letter."""

    model_name = "letter-count"
    dimension = 26

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        vectors = []
        for text in texts:
            v = np.zeros(26, dtype=np.float32)
            for ch in text.lower():
                if "a" <= ch <= "z":
                    v[ord(ch) - ord("a")] += 1
            vectors.append(v / max(float(np.linalg.norm(v)), 1e-12))
        return vectors


# -- backends ---------------------------------------------------------------------------------


class FlakyBackend:
    """The offline backend, failing the way it is told to, call by call.

    Subclasses change `before`, which runs ahead of every call (and may raise), to fail or
    act otherwise; `requests` keeps what each call was asked.
    """

    def __init__(self, failures: Sequence[BaseException | None] = ()) -> None:
        self._failures = list(failures)
        self._inner = OfflineBackend()
        self.name, self.model = self._inner.name, self._inner.model
        self.prompt_version = self._inner.prompt_version
        self.requests: list[ConsolidationRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        self.requests.append(request)
        self.before(request)
        return self._inner.consolidate(request)

    def before(self, request: ConsolidationRequest) -> None:
        failure = self._failures.pop(0) if self._failures else None
        if failure is not None:
            raise failure


@dataclass(frozen=True)
class Call:
    user_id: str
    started: float
    ended: float
    events: int


@dataclass
class RecordingBackend:
    """A `ConsolidationBackend` that takes `latency_s` and records when each call ran.

    The intervals show what ran at the same time: overall (concurrency) and per user (which
    must never overlap). Wraps the offline backend, so memory comes out as usual.
    """

    latency_s: float = 0.0
    inner: ConsolidationBackend = field(default_factory=OfflineBackend)
    calls: list[Call] = field(default_factory=list)
    started: int = 0  # calls begun, finished or not
    # The first `rendezvous` calls wait (up to 30 s) until that many are in flight together,
    # so a loaded machine starting threads late cannot hide the concurrency the test is
    # about; a processor that cannot run that many at once leaves them waiting alone.
    rendezvous: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _barrier: threading.Barrier | None = None

    def __post_init__(self) -> None:
        if self.rendezvous > 1:
            self._barrier = threading.Barrier(self.rendezvous, timeout=30)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def prompt_version(self) -> str:
        return self.inner.prompt_version

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        with self._lock:
            self.started += 1
            meet = self._barrier is not None and self.started <= self.rendezvous
        if meet:
            assert self._barrier is not None
            with contextlib.suppress(threading.BrokenBarrierError):
                self._barrier.wait()
        started = time.monotonic()
        time.sleep(self.latency_s)
        response = self.inner.consolidate(request)
        ended = time.monotonic()
        with self._lock:
            self.calls.append(Call(request.user_id, started, ended, len(request.observations)))
        return response

    def max_overlap(self) -> int:
        """The largest number of calls that were running at one instant."""
        edges = sorted(
            [(c.started, 1) for c in self.calls] + [(c.ended, -1) for c in self.calls],
            key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
        )
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        return peak

    def same_user_overlaps(self) -> list[tuple[Call, Call]]:
        by_user: dict[str, list[Call]] = {}
        for call in self.calls:
            by_user.setdefault(call.user_id, []).append(call)
        overlaps = []
        for calls in by_user.values():
            ordered = sorted(calls, key=lambda c: c.started)
            overlaps += [(a, b) for a, b in pairwise(ordered) if b.started < a.ended]
        return overlaps


# -- Kafka ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[Any, Any]] | None = None


class FakeConsumer:
    """An `EventConsumer` over in-memory partitions of one topic.

    Like kafka-python, it calls the rebalance listener from inside `poll`: the first poll
    assigns every partition, and `rebalance` schedules a revocation (or loss) and an
    assignment for the next one. A partition assigned again keeps its fetch position.
    """

    def __init__(self, topic: str, partitions: int = 1, max_records: int = 500) -> None:
        self.topic = topic
        self.max_records = max_records
        self.log: dict[int, list[FakeRecord]] = {p: [] for p in range(partitions)}
        self.fetched: dict[int, int] = dict.fromkeys(self.log, 0)
        self.committed: dict[int, int] = {}
        self.commits: list[dict[int, int]] = []
        self.seeks: list[tuple[int, int]] = []
        self.closed = False
        self.poll_errors: list[Exception] = []  # raised by the next polls, one each
        self._assigned: set[int] = set()
        self._paused: set[int] = set()
        self._highwater: dict[int, int] = {}  # each partition's end as its last fetch saw it
        self._listener: Any = None
        self._rebalances: list[tuple[set[int], set[int], bool]] = [(set(), set(self.log), False)]

    # -- what the test does ---------------------------------------------------------------

    def produce(
        self,
        partition: int,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[tuple[Any, Any]] | None = None,
    ) -> int:
        offset = len(self.log[partition])
        self.log[partition].append(FakeRecord(offset, key, value, headers))
        return offset

    def rebalance(self, revoke: set[int], assign: set[int], *, lost: bool = False) -> None:
        self._rebalances.append((revoke, assign, lost))

    def tp(self, partition: int) -> KafkaTopicPartition:
        return KafkaTopicPartition(self.topic, partition)

    # -- the EventConsumer protocol -------------------------------------------------------

    def subscribe(self, topics: Sequence[str], listener: Any = None) -> None:
        assert list(topics) == [self.topic]
        self._listener = listener

    def topics(self) -> set[str]:
        return {self.topic}

    def poll(self, timeout_ms: int) -> Mapping[Any, Sequence[FakeRecord]]:
        if self.poll_errors:
            raise self.poll_errors.pop(0)
        self._run_rebalances()
        out: dict[Any, list[FakeRecord]] = {}
        for p in sorted(self._assigned - self._paused):
            records = self.log[p][self.fetched[p] : self.fetched[p] + self.max_records]
            self._highwater[p] = len(self.log[p])
            if records:
                out[self.tp(p)] = records
                self.fetched[p] += len(records)
        return out

    def assignment(self) -> set[Any]:
        return {self.tp(p) for p in self._assigned}

    def paused(self) -> set[Any]:
        return {self.tp(p) for p in self._paused}

    def pause(self, *partitions: Any) -> None:
        self._paused |= {tp.partition for tp in partitions}

    def resume(self, *partitions: Any) -> None:
        self._paused -= {tp.partition for tp in partitions}

    def seek(self, partition: Any, offset: int) -> None:
        self.seeks.append((partition.partition, offset))
        self.fetched[partition.partition] = offset

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        moved = {tp.partition: meta.offset for tp, meta in offsets.items()}
        self.committed.update(moved)
        self.commits.append(moved)

    def commit_async(self, offsets: Mapping[Any, Any], callback: Callable[..., None]) -> Any:
        self.commit(offsets)
        callback(offsets, None)

    def group_metadata(self) -> FakeGroup:
        return FakeGroup(self)

    def position(self, partition: Any, timeout_ms: int | None = None) -> int | None:
        return self.fetched[partition.partition]

    def highwater(self, partition: Any) -> int | None:
        """As kafka-python: known once a poll fetched from the partition."""
        return self._highwater.get(partition.partition)

    def close(self) -> None:
        self.closed = True

    def _run_rebalances(self) -> None:
        while self._rebalances:
            revoke, assign, lost = self._rebalances.pop(0)
            gone = revoke & self._assigned
            if gone and self._listener is not None:
                tps = [self.tp(p) for p in sorted(gone)]
                if lost:
                    self._listener.on_partitions_lost(tps)
                else:
                    self._listener.on_partitions_revoked(tps)
            self._assigned -= gone
            # Assigned straight back, kafka-python keeps its fetch position and its paused
            # flag; otherwise the partition's next owner starts from the committed offset.
            self._paused -= gone - assign
            for p in gone - assign:
                self.fetched[p] = self.committed.get(p, 0)
            self._assigned |= assign
            if assign and self._listener is not None:
                self._listener.on_partitions_assigned([self.tp(p) for p in sorted(assign)])


@dataclass(frozen=True)
class FakeGroup:
    """`FakeConsumer.group_metadata()`: what a transaction commits the offsets of."""

    consumer: FakeConsumer


class ListDeadLetters:
    """A `DeadLetterSink` that keeps the letters and commits their offsets on the
    `FakeConsumer` whose group they come with; `refuse` makes the next sends fail (then
    neither happens, as with an aborted transaction)."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []
        self.consumed: list[dict[TopicPartition, int]] = []
        self.refuse = 0
        self.closed = False

    def send(
        self, letters: Sequence[DeadLetter], consumed: Mapping[TopicPartition, int], group: Any
    ) -> None:
        if not letters:
            return
        if self.refuse:
            self.refuse -= 1
            raise DeadLetterError("the dead-letter topic is unavailable")
        self.letters.extend(letters)
        self.consumed.append(dict(consumed))
        if isinstance(group, FakeGroup):
            c = group.consumer
            c.commit({c.tp(t.partition): OffsetAndMetadata(o, "", -1) for t, o in consumed.items()})

    def close(self) -> None:
        self.closed = True


# -- observers --------------------------------------------------------------------------------


@dataclass
class RecordingObserver:
    """A `FlushObserver` and `IndexObserver` that keeps what it was told."""

    flushes: list[tuple[str, float]] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    budget: list[str] = field(default_factory=list)
    charged_runs: list[RunRecord] = field(default_factory=list)
    probes: list[bool] = field(default_factory=list)
    indexed_facts: int = 0
    index_failures: int = 0
    index_holds: list[str] = field(default_factory=list)
    pending_facts: int | None = None
    pending_oldest_s: float | None = None

    def flushed(self, backend: str, seconds: float) -> None:
        self.flushes.append((backend, seconds))

    def consolidated(self, run: RunRecord) -> None:
        self.runs.append(run)

    def budget_applied(self, policy: str) -> None:
        self.budget.append(policy)

    def charged(self, run: RunRecord) -> None:
        self.charged_runs.append(run)

    def probed(self, *, usable: bool) -> None:
        self.probes.append(usable)

    def indexed(self, embedded: int, cost_micro_usd: int) -> None:
        self.indexed_facts += embedded

    def index_failed(self, facts: int) -> None:
        self.index_failures += 1

    def index_write_held(self, released_by: str) -> None:
        self.index_holds.append(released_by)

    def pending(self, facts: int, oldest_s: float) -> None:
        self.pending_facts = facts
        self.pending_oldest_s = oldest_s
