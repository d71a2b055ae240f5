"""`memoryd redrive`: dead-lettered events back onto the event topic, once each.

Only records that were valid events are redriven (stages `consolidate` and `budget`); records
that never decoded stay on the dead-letter topic for a human. An event of a memory erased
since it was dead-lettered is not redriven: its source offset (in the letter's headers) lies
before the erasure's cut-off, and republished it would land after the tombstone, as if new.
Offsets on the dead-letter topic are committed after the republish is acknowledged, and the
events keep their ids, so a redrive that is interrupted and run again cannot double anything
downstream.

Each stage has its own consumer group on the dead-letter topic: a redrive of one stage reads
past the other stages' letters and commits past them, which in a shared group would hide them
from every later redrive of their own stage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from consumers.dead_letter import HEADER_OFFSET, HEADER_PARTITION, HEADER_STAGE, HEADER_TOPIC
from consumers.kafka_client import (
    ConsumerSettings,
    commit,
    from_kafka,
    make_consumer,
    subscribe,
)
from domain.ids import MemoryKey, SubjectHasher
from memoryd import wiring
from memoryd.settings import Settings
from producers.contract import ContextEvent
from store.write.memory_store import PostgresMemoryStore

REDRIVABLE = ("consolidate", "budget")
log = logging.getLogger(__name__)


class RedriveError(RuntimeError):
    """The dead-letter topic could not be read (no partitions assigned in time)."""


def redrive_group(settings: Settings, stage: str) -> str:
    """The redrive's consumer group for one stage, derived from the processor's: one per
    deployment and stage, so deployments sharing a cluster never share (or rebalance) each
    other's redrive progress, and one stage's progress never passes another's letters."""
    return f"{settings.kafka.processor_group}-redrive-{stage}"


class ForgottenLetters:
    """Whether a dead-lettered event was recorded before its memory's erasure cut-off."""

    def __init__(self, memory: PostgresMemoryStore, subjects: SubjectHasher) -> None:
        self._memory = memory
        self._subjects = subjects
        self._cutoffs: dict[MemoryKey, dict[tuple[str, int], int]] = {}

    def forgotten(self, event: ContextEvent, headers: dict[str, bytes]) -> bool:
        key = MemoryKey(event.organization_id, event.user_id)
        if key not in self._cutoffs:
            self._cutoffs[key] = self._memory.forgotten_before(self._subjects(key))
        cutoffs = self._cutoffs[key]
        if not cutoffs:
            return False
        source = (headers[HEADER_TOPIC].decode(), int(headers[HEADER_PARTITION]))
        return int(headers[HEADER_OFFSET]) < cutoffs.get(source, -1)


def redrive(
    settings: Settings,
    stages: Sequence[str] | None = None,
    idle_s: float = 3.0,
    join_timeout_s: float = 60.0,
) -> int:
    """Republish the redrivable dead letters not redriven yet; returns how many."""
    with wiring.core(settings) as c:
        letters = ForgottenLetters(c.memory, c.subjects)
        return _redrive(settings, letters, stages, idle_s, join_timeout_s)


def _redrive(
    settings: Settings,
    letters: ForgottenLetters,
    stages: Sequence[str] | None,
    idle_s: float,
    join_timeout_s: float,
) -> int:
    unknown = set(stages or ()) - set(REDRIVABLE)
    if unknown:
        raise RedriveError(f"not a redrivable stage: {', '.join(sorted(unknown))}")
    wanted = [s for s in REDRIVABLE if stages is None or s in stages]
    return sum(_redrive_stage(settings, letters, s, idle_s, join_timeout_s) for s in wanted)


def _redrive_stage(
    settings: Settings,
    letters: ForgottenLetters,
    stage: str,
    idle_s: float,
    join_timeout_s: float,
) -> int:
    k = settings.kafka
    consumer = make_consumer(
        ConsumerSettings(
            k.bootstrap_servers,
            k.dead_letter_topic,
            redrive_group(settings, stage),
            f"memoryd-redrive-{stage}",
            read_committed=True,
        )
    )
    pub = wiring.publisher(settings)
    moved = 0
    try:
        subscribe(consumer, k.dead_letter_topic)
        started = time.monotonic()
        quiet_since: float | None = None  # idle time counts from the assignment on
        while quiet_since is None or time.monotonic() - quiet_since < idle_s:
            if not consumer.assignment():
                if time.monotonic() - started > join_timeout_s:
                    raise RedriveError(f"no partition of {k.dead_letter_topic} assigned")
                quiet_since = None
            batches = consumer.poll(timeout_ms=500)
            if quiet_since is None and consumer.assignment():
                quiet_since = time.monotonic()
            if not batches:
                continue
            quiet_since = time.monotonic()
            events: list[ContextEvent] = []
            positions = {}
            for ktp, records in batches.items():
                for record in records:
                    headers = dict(record.headers or [])
                    if headers.get(HEADER_STAGE, b"").decode() == stage and record.value:
                        event = ContextEvent.from_bytes(record.value)
                        if letters.forgotten(event, headers):
                            log.info("not redriven: an erasure forgot the event's memory")
                        else:
                            events.append(event)
                positions[from_kafka(ktp)] = records[-1].offset + 1
            pub.publish(events)
            commit(consumer, positions)
            moved += len(events)
    finally:
        pub.close()
        consumer.close()
    return moved
