"""A tombstone read while a memory's batch is still in flight: the letters that batch hands
over later, when it is given up, are not sent (they would copy the forgotten events to the
dead-letter topic after the erasure)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from consumers.batching import OffsetTracker, TopicPartition
from consumers.dead_letter import CAUSES, DeadLetter
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage
from consumers.record_letters import HeldLetters
from tests.support.fakes import ListDeadLetters

TP = TopicPartition("events", 0)
ADA, BOB = b"org-a\x1fada", b"org-a\x1fbob"


def letter(key: bytes, offset: int, stage: str = "consolidate") -> DeadLetter:
    cause = CAUSES[stage][0]
    return DeadLetter(key, b"{}", stage, "backend error", TP.topic, TP.partition, offset, cause)


def held_letters(sink: ListDeadLetters) -> HeldLetters:
    metrics = PipelineMetrics(CollectorRegistry())
    return HeldLetters(
        sink, "processor", metrics, Outage("processor", metrics), time.monotonic, lambda: None
    )


def test_letters_handed_over_after_their_memorys_tombstone_are_not_sent() -> None:
    sink = ListDeadLetters()
    held = held_letters(sink)
    offsets = OffsetTracker()
    # ada 0-1 (in flight), a record under ada's key that did not decode 2, bob 3, ada's
    # tombstone 4, ada 5
    for offset in range(6):
        offsets.received(TP, offset)
    assert held.forget(ADA, TP, before=4) == []  # nothing of ada's waiting yet
    offsets.done(TP, 4)
    held.send_due(offsets)  # a step while ada's batch is still in flight

    undecodable = letter(ADA, 2, stage="decode")  # no memory's event: not the erasure's
    forgotten = held.wait(
        [letter(ADA, 0), letter(ADA, 1), undecodable, letter(BOB, 3), letter(ADA, 5)]
    )

    assert forgotten == [letter(ADA, 0), letter(ADA, 1)]
    assert len(held) == 3  # bob's, ada's after the tombstone, the undecodable record's
    for x in forgotten:
        offsets.done(TP, x.offset)
    sent = held.send_due(offsets)
    assert [(x.key, x.offset, x.stage) for x in sent] == [
        (ADA, 2, "decode"),
        (BOB, 3, "consolidate"),
        (ADA, 5, "consolidate"),
    ]
    assert sink.letters == sent


def test_a_revoked_partition_forgets_its_tombstones() -> None:
    held = held_letters(ListDeadLetters())
    held.forget(ADA, TP, before=4)
    held.drop({TP})  # read again by the next owner, tombstone included
    assert held.wait([letter(ADA, 0)]) == []
    assert len(held) == 1
