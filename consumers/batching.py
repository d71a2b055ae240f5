"""Per-memory buffers and per-partition offset tracking, as plain data structures.

A buffer belongs to one memory, (organization, user): two organizations' users of the same id
never share a buffer, so a batch never mixes organizations.

The processor commits, per partition, the offset just below the earliest record that is not
yet done (consolidated, skipped as a duplicate, or dead-lettered). A crash therefore replays
at most the records that were in flight, and `consolidated_events` makes that replay harmless.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from domain.ids import MemoryKey
from domain.model import TokenUsage
from processors.errors import BackendError
from producers.contract import ContextEvent

if TYPE_CHECKING:  # only for the annotation: flush_result imports this module
    from consumers.flush_result import FlushResult


FAILED_RUN_NAMESPACE = uuid.UUID("7d3f1c52-8e0a-4b6d-9f21-3c5e8a7b1d04")


def first_by_id(events: Iterable[ContextEvent]) -> list[ContextEvent]:
    """One event per id, the first read: the one the event log keeps (`ON CONFLICT DO
    NOTHING`), so a later duplicate with other content never makes memory differ from it."""
    first: dict[uuid.UUID, ContextEvent] = {}
    for e in events:
        first.setdefault(e.event_id, e)
    return list(first.values())


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True)
class BufferedEvent:
    tp: TopicPartition
    offset: int
    event: ContextEvent

    @property
    def key(self) -> MemoryKey:
        return MemoryKey(self.event.organization_id, self.event.user_id)


@dataclass
class UserBuffer:
    key: MemoryKey
    first_at: float
    items: list[BufferedEvent] = field(default_factory=list)


@dataclass
class Rejection:
    """Why a batch is given up; once set, only its delivery to the dead-letter topic is left."""

    stage: str  # "consolidate" or "budget"
    reason: str
    cause: str  # for the metrics: one of the stage's `consumers.dead_letter.CAUSES`
    raw_response: str | None = None
    recorded: bool = False  # the failed run record is written (or not needed)
    # What the failed call used (frozen, so one shared default is safe): booked with the run.
    usage: TokenUsage = TokenUsage()  # noqa: RUF009
    # The failed run's id, fixed once, so a retried record of it is written (and booked) once.
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)
    # Per event, when the events failed for different reasons (a bisected batch).
    reasons: dict[uuid.UUID, str] = field(default_factory=dict)

    @classmethod
    def of_backend(cls, reason: str, error: BackendError) -> Rejection:
        """A batch given up on the backend's error: its answer and its tokens go with it."""
        return cls("consolidate", reason, error.failure, error.raw_response, usage=error.usage)


@dataclass
class Batch:
    """A memory's events taken for one flush: in flight, waiting for a retry, or given up and
    waiting for its dead letter."""

    key: MemoryKey
    items: list[BufferedEvent]
    attempt: int = 0
    not_before: float = 0.0
    future: Future[FlushResult] | None = field(default=None, repr=False)
    rejection: Rejection | None = None

    @property
    def events(self) -> list[ContextEvent]:
        return [i.event for i in self.items]

    def given_up(self, rejection: Rejection) -> Rejection:
        """The rejection, its failed run named for this occurrence of these records (their
        offsets): read again after a rebalance, the batch records the same run; a redriven
        copy (new offsets) records one of its own."""
        where = ",".join(sorted(f"{i.tp.topic}:{i.tp.partition}:{i.offset}" for i in self.items))
        name = f"{self.key.joined}\x1f{self.attempt}\x1f{where}"
        rejection.run_id = uuid.uuid5(FAILED_RUN_NAMESPACE, name)
        return rejection

    def without(self, event_ids: Iterable[uuid.UUID]) -> list[BufferedEvent]:
        """Take these events out of the batch; returns the items taken out."""
        gone = set(event_ids)
        return self.keep_only(i.event.event_id for i in self.items if i.event.event_id not in gone)

    def keep_only(self, event_ids: Iterable[uuid.UUID]) -> list[BufferedEvent]:
        """Narrow the batch to these events; returns the items taken out."""
        kept = set(event_ids)
        out = [i for i in self.items if i.event.event_id not in kept]
        self.items = [i for i in self.items if i.event.event_id in kept]
        return out


class UserBuffers:
    """Events waiting for their memory's next flush, in arrival order."""

    def __init__(self, max_batch: int, max_wait_s: float) -> None:
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._buffers: dict[MemoryKey, UserBuffer] = {}

    def add(self, item: BufferedEvent, now: float) -> None:
        key = item.key
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = UserBuffer(key, now)
            self._buffers[key] = buffer
        buffer.items.append(item)

    def ready(
        self, now: float, *, force: bool = False, exclude: Iterable[MemoryKey] = ()
    ) -> list[MemoryKey]:
        """Memories whose buffer is full or old enough, oldest first."""
        skip = set(exclude)
        ready = [
            b
            for b in self._buffers.values()
            if b.key not in skip
            and (force or len(b.items) >= self.max_batch or now - b.first_at >= self.max_wait_s)
        ]
        return [b.key for b in sorted(ready, key=lambda b: b.first_at)]

    def take(self, key: MemoryKey) -> UserBuffer:
        """Remove and return up to `max_batch` events; the rest stay and keep their age (they
        have waited that long already), so they flush as soon as the memory is free again."""
        buffer = self._buffers.pop(key)
        if len(buffer.items) > self.max_batch:
            rest = buffer.items[self.max_batch :]
            buffer.items = buffer.items[: self.max_batch]
            self._buffers[key] = UserBuffer(key, buffer.first_at, rest)
        return buffer

    def drop_memory(self, key: MemoryKey) -> list[BufferedEvent]:
        """Forget every buffered event of a memory (it was erased); returns them."""
        buffer = self._buffers.pop(key, None)
        return [] if buffer is None else buffer.items

    def drop_partitions(self, tps: Iterable[TopicPartition]) -> int:
        """Forget events of revoked partitions; their new owner re-reads them."""
        gone = set(tps)
        dropped = 0
        for key in list(self._buffers):
            buffer = self._buffers[key]
            kept = [i for i in buffer.items if i.tp not in gone]
            dropped += len(buffer.items) - len(kept)
            if kept:
                buffer.items = kept
            else:
                del self._buffers[key]
        return dropped

    def __len__(self) -> int:
        return sum(len(b.items) for b in self._buffers.values())

    def memories(self) -> list[MemoryKey]:
        return list(self._buffers)

    def events(self) -> list[ContextEvent]:
        """Every buffered event (what an erasure must not leave behind in this process)."""
        return [i.event for b in self._buffers.values() for i in b.items]


class OffsetTracker:
    """Which offsets of each partition are still open, and what may be committed."""

    def __init__(self) -> None:
        self._open: dict[TopicPartition, list[int]] = {}  # a heap per partition
        self._members: dict[TopicPartition, set[int]] = {}  # what the heap holds
        self._closed: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def received(self, tp: TopicPartition, offset: int) -> None:
        members = self._members.setdefault(tp, set())
        # A record read twice (a fetch repeated after an error) is still one open offset; a
        # second heap entry would never be closed and would hold the partition back forever.
        if offset not in members and offset >= self._committed.get(tp, 0):
            members.add(offset)
            heapq.heappush(self._open.setdefault(tp, []), offset)
        self._next[tp] = max(self._next.get(tp, 0), offset + 1)

    def done(self, tp: TopicPartition, offset: int) -> None:
        if offset in self._members.get(tp, ()):
            self._closed.setdefault(tp, set()).add(offset)

    def committable(self) -> dict[TopicPartition, int]:
        """Partition → offset to commit, for partitions that moved since the last commit."""
        out: dict[TopicPartition, int] = {}
        for tp, heap in self._open.items():
            closed = self._closed.get(tp, set())
            while heap and heap[0] in closed:
                offset = heapq.heappop(heap)
                closed.discard(offset)
                self._members[tp].discard(offset)
            position = heap[0] if heap else self._next[tp]
            if position > self._committed.get(tp, -1):
                out[tp] = position
        return out

    def position(self, tp: TopicPartition) -> int | None:
        """Where reading must resume so that nothing not done is skipped: the earliest open
        offset, else the next one; None if nothing was received from the partition."""
        if tp not in self._next:
            return None
        self.committable()  # drops what is done below the earliest open offset
        heap = self._open.get(tp)
        return heap[0] if heap else self._next[tp]

    def leading_open(self, tp: TopicPartition, offsets: Collection[int]) -> list[int]:
        """Those of `offsets` that are the partition's earliest open offsets, in order: once
        they are done, the partition's position is past all of them."""
        self.committable()  # drops what is done below the earliest open offset
        closed = self._closed.get(tp, set())
        leading: list[int] = []
        for offset in sorted(self._open.get(tp, ())):
            if offset in closed:
                continue
            if offset not in offsets:
                break
            leading.append(offset)
        return leading

    def committed(self, positions: Mapping[TopicPartition, int]) -> None:
        self._committed.update(positions)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._open.pop(tp, None)
            self._members.pop(tp, None)
            self._closed.pop(tp, None)
            self._next.pop(tp, None)
            self._committed.pop(tp, None)

    def open_count(self) -> int:
        return sum(len(h) for h in self._open.values())
