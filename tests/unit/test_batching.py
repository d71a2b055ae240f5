"""Per-memory buffers and per-partition offsets: what is ready, what may be committed."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from consumers.batching import BufferedEvent, OffsetTracker, TopicPartition, UserBuffers
from domain.ids import MemoryKey
from producers.contract import ContextEvent, EventType, Source, SourceMetadata

P0 = TopicPartition("events", 0)
P1 = TopicPartition("events", 1)


def item(user: str, offset: int, tp: TopicPartition = P0, org: str = "org-a") -> BufferedEvent:
    event = ContextEvent(
        event_id=uuid.uuid4(),
        user_id=user,
        organization_id=org,
        event_type=EventType.FACT,
        content=f"observation {offset}",
        source_metadata=SourceMetadata(source=Source.INTERACTIVE),
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
    )
    return BufferedEvent(tp, offset, event)


# --- OffsetTracker ----------------------------------------------------------------------


def tracker(*offsets: int, tp: TopicPartition = P0) -> OffsetTracker:
    t = OffsetTracker()
    for offset in offsets:
        t.received(tp, offset)
    return t


@pytest.mark.parametrize(
    ("done", "expected"),
    [
        ([], 0),  # nothing done: the first record is still open
        ([1, 2], 0),  # later records done do not move past an open one
        ([0], 1),
        ([0, 1, 3], 2),
        ([0, 1, 2, 3], 4),
        ([4, 3, 2, 1, 0], 5),  # order of completion does not matter; all done: next offset
    ],
)
def test_commit_position_is_the_earliest_open_offset(done: list[int], expected: int) -> None:
    t = tracker(0, 1, 2, 3, 4)
    for offset in done:
        t.done(P0, offset)
    committable = t.committable()
    assert committable.get(P0, 0) == expected
    assert t.open_count() == 5 - expected  # what is done below the position is dropped


@pytest.mark.parametrize(
    ("done", "letters", "leading"),
    [
        ([], {0, 1}, [0, 1]),
        ([], {1, 2}, []),  # 0 is open and no letter: nothing passes it
        ([0], {1, 3}, [1]),  # 2 is open
        ([0, 2], {1, 3}, [1, 3]),  # done records between letters do not stop the run
        ([0, 1, 2, 3, 4], {4}, []),  # a record already done is no letter to send
    ],
)
def test_letters_lead_when_only_letters_and_done_records_are_before_them(
    done: list[int], letters: set[int], leading: list[int]
) -> None:
    t = tracker(0, 1, 2, 3, 4)
    for offset in done:
        t.done(P0, offset)
    assert t.leading_open(P0, letters) == leading
    assert t.leading_open(P1, letters) == []  # nothing received there


def test_a_position_is_committed_once_and_never_backwards() -> None:
    t = tracker(10, 11, 12)
    t.done(P0, 10)
    assert t.committable() == {P0: 11}
    t.committed({P0: 11})
    assert t.committable() == {}
    t.done(P0, 12)
    assert t.committable() == {}  # 11 is still open
    t.done(P0, 11)
    assert t.committable() == {P0: 13}


def test_partitions_are_independent() -> None:
    t = tracker(0, 1)
    t.received(P1, 7)
    t.done(P1, 7)
    assert t.committable() == {P0: 0, P1: 8}
    t.committed({P0: 0, P1: 8})
    t.done(P0, 0)
    assert t.committable() == {P0: 1}


def test_an_offset_received_twice_is_one_open_offset() -> None:
    t = tracker(0, 0, 1)
    t.done(P0, 0)
    t.done(P0, 1)
    assert t.committable() == {P0: 2}
    assert t.open_count() == 0


def test_done_for_an_offset_never_received_changes_nothing() -> None:
    t = tracker(3)
    t.done(P0, 2)
    t.done(P1, 0)
    assert t.committable() == {P0: 3}


def test_forget_drops_a_revoked_partition() -> None:
    t = tracker(0, 1)
    t.committed({P0: 0})
    t.forget([P0])
    assert t.committable() == {}
    assert t.open_count() == 0
    # Reassigned later: tracking starts over from what is read then.
    t.received(P0, 1)
    t.done(P0, 1)
    assert t.committable() == {P0: 2}


# --- UserBuffers -------------------------------------------------------------------------


def key(user: str, org: str = "org-a") -> MemoryKey:
    return MemoryKey(org, user)


def test_a_memory_is_ready_when_the_batch_is_full_or_old_enough() -> None:
    buffers = UserBuffers(max_batch=3, max_wait_s=2.0)
    for offset in range(3):
        buffers.add(item("full", offset), now=10.0)
    buffers.add(item("young", 3), now=10.0)
    buffers.add(item("old", 4), now=7.0)
    full, old, young = key("full"), key("old"), key("young")
    assert buffers.ready(now=10.0) == [old, full]  # oldest first
    assert buffers.ready(now=12.0) == [old, full, young]
    assert buffers.ready(now=10.0, exclude=[old]) == [full]
    assert buffers.ready(now=10.0, force=True) == [old, full, young]
    assert len(buffers) == 5
    assert sorted(buffers.memories()) == [full, old, young]


def test_the_same_user_id_in_two_organizations_is_two_buffers() -> None:
    buffers = UserBuffers(max_batch=2, max_wait_s=60.0)
    buffers.add(item("ada", 0, org="org-a"), now=1.0)
    buffers.add(item("ada", 1, org="org-b"), now=1.0)
    buffers.add(item("ada", 2, org="org-a"), now=1.0)
    assert buffers.ready(now=2.0) == [key("ada", "org-a")]  # only org-a's is full
    taken = buffers.take(key("ada", "org-a"))
    assert [i.offset for i in taken.items] == [0, 2]
    assert {i.event.organization_id for i in taken.items} == {"org-a"}
    assert buffers.memories() == [key("ada", "org-b")]


def test_drop_memory_forgets_that_memory_only() -> None:
    buffers = UserBuffers(max_batch=10, max_wait_s=1.0)
    buffers.add(item("ada", 0, org="org-a"), now=0.0)
    buffers.add(item("ada", 1, org="org-b"), now=0.0)
    buffers.add(item("ada", 2, org="org-a"), now=0.0)
    dropped = buffers.drop_memory(key("ada", "org-a"))
    assert [i.offset for i in dropped] == [0, 2]
    assert [e.organization_id for e in buffers.events()] == ["org-b"]
    assert buffers.drop_memory(key("nobody")) == []


@pytest.mark.parametrize(("max_batch", "events", "taken"), [(3, 2, 2), (3, 3, 3), (3, 7, 3)])
def test_take_returns_at_most_a_batch_and_the_rest_keeps_its_age(
    max_batch: int, events: int, taken: int
) -> None:
    buffers = UserBuffers(max_batch=max_batch, max_wait_s=60.0)
    for offset in range(events):
        buffers.add(item("ada", offset), now=1.0 + offset)
    batch = buffers.take(key("ada"))
    assert [i.offset for i in batch.items] == list(range(taken))
    assert len(buffers) == events - taken
    if events > taken:
        # The rest has waited since the first event: ready as soon as the memory is free.
        assert buffers.ready(now=61.0) == [key("ada")]
        assert buffers.take(key("ada")).items[0].offset == taken
    else:
        assert buffers.memories() == []


def test_drop_partitions_forgets_their_events_only() -> None:
    buffers = UserBuffers(max_batch=10, max_wait_s=1.0)
    buffers.add(item("ada", 0, P0), now=0.0)
    buffers.add(item("bo", 0, P1), now=0.0)
    buffers.add(item("bo", 1, P1), now=0.0)
    assert buffers.drop_partitions([P1]) == 2
    assert buffers.memories() == [key("ada")]
    assert len(buffers) == 1
