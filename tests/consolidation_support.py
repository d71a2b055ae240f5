"""Helpers of the consolidation tests: recording backends, processors in threads, polling.

Kept apart from tests/support.py so the consolidation suite can grow without touching the
pipeline's shared helpers.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2
from prometheus_client import CollectorRegistry

from consumers.processor import MemoryProcessor
from memoryd import wiring
from memoryd.settings import Settings
from processors.offline import OfflineBackend
from processors.schema import BackendResponse, ConsolidationBackend, ConsolidationRequest
from producers.contract import memory_kafka_key
from tests.support import Deployment

with warnings.catch_warnings():
    # google-genai 3.3.0 has an invalid escape in a docstring; see tests/unit/test_gemini_backend.
    warnings.filterwarnings("ignore", "invalid escape sequence", DeprecationWarning)
    warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)
    from processors.llm.gemini import GeminiBackend, make_gemini_client


@contextmanager
def gemini_backend(url: str, timeout_ms: int = 10_000) -> Iterator[GeminiBackend]:
    """The real google-genai SDK pointed at a (fake) server; its HTTP client closed after."""
    with make_gemini_client("test-key", url, timeout_ms) as client:
        yield GeminiBackend(client)


def topic_size(bootstrap: str, topic: str) -> int:
    """How many records a topic holds (sum of its partitions' end offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


def headers_of(record: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers}


def tuned(deployment: Deployment, **tuning: Any) -> Deployment:
    """The same deployment (database, topics) with other processor tuning."""
    processor = deployment.settings.processor.model_copy(update=tuning)
    settings = deployment.settings.model_copy(update={"processor": processor})
    return Deployment(settings, deployment.dsn)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


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


class ProcessorThread:
    """A processor with its own core (like a separate process) running in a thread."""

    def __init__(self, settings: Settings, backend: ConsolidationBackend) -> None:
        self._settings = settings
        self._backend = backend
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.processor: MemoryProcessor | None = None
        self.registry: CollectorRegistry | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ProcessorThread:
        self._thread.start()
        if not self._ready.wait(timeout=60) or self.processor is None:
            raise AssertionError(f"processor did not start: {self.error!r}")
        return self

    def assignment(self) -> set[int]:
        """Partitions this processor owns now."""
        assert self.processor is not None
        return {tp.partition for tp in self.processor.assignment()}

    def buffered(self) -> int:
        """Events buffered, not yet in a flush (the processor's gauge)."""
        assert self.registry is not None
        value = self.registry.get_sample_value("memoryd_buffered_events")
        return int(value or 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
        assert not self._thread.is_alive(), "processor did not stop"
        if self.error is not None:
            raise AssertionError(f"processor failed: {self.error!r}") from self.error

    def _run(self) -> None:
        try:
            with wiring.core(self._settings) as c:
                self.processor = wiring.processor(c, self._backend)
                self.registry = c.registry
                self._ready.set()
                self.processor.run(self._stop)
        except BaseException as e:
            self.error = e
            raise
        finally:
            self._ready.set()


def partition_of(user_id: str, partitions: int, org: str = "org-a") -> int:
    """The partition kafka-python's default partitioner sends a memory's events to (the key
    is the organization and the user)."""
    return (murmur2(memory_kafka_key(org, user_id)) & 0x7FFFFFFF) % partitions


def users_per_partition(prefix: str, partitions: int, per_partition: int) -> list[str]:
    """User ids (of org-a) chosen so every partition holds `per_partition` of them."""
    chosen: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(v) < per_partition for v in chosen.values()):
        user = f"{prefix}{n}"
        bucket = chosen[partition_of(user, partitions)]
        if len(bucket) < per_partition:
            bucket.append(user)
        n += 1
    return [u for p in range(partitions) for u in chosen[p]]
