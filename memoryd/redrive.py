"""`memoryd redrive`: dead-lettered events back onto the event topic, once each.

Only records that were valid events are redriven (stages `consolidate` and `budget`); records
that never decoded stay on the dead-letter topic for a human, as do letters that no longer
validate (a stricter contract since), each logged. An event of a memory erased since it was
dead-lettered is not redriven: its source offset (in the letter's headers) lies before the
erasure's cut-off, and republished it would land after the tombstone, as if new. Nor is an
event a fact erasure has redacted in the log since: the flush would drop it on arrival (it
reads the same redaction), and the letter's copy still says what was erased. Both are settled
by their erasure: committed past, and counted apart from the redriven ones. The cut-offs
are read and the memory's events republished under the memory's lock, which an erasure holds
from its tombstone to its cut-offs: an erasure either finished before (its cut-offs are seen)
or starts after the republished events are acknowledged (they lie before its tombstone).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


Letter = tuple[ContextEvent, dict[str, bytes]]  # a letter's event and its headers


@dataclass(frozen=True)
class RedriveSummary:
    redriven: int = 0  # republished on the event topic
    # Left out and committed past: of a memory forgotten, or redacted by a fact erasure, since.
    settled_by_erasure: int = 0

    def __add__(self, other: RedriveSummary) -> RedriveSummary:
        return RedriveSummary(
            self.redriven + other.redriven, self.settled_by_erasure + other.settled_by_erasure
        )


class ForgottenLetters:
    """Republishes dead-lettered events, less those an erasure settled (recorded before their
    memory's cut-off, or redacted in the log by a fact erasure), one memory at a time under
    its lock."""

    def __init__(self, memory: PostgresMemoryStore, subjects: SubjectHasher) -> None:
        self._memory = memory
        self._subjects = subjects

    def republish(
        self, letters: Sequence[Letter], publish: Callable[[list[ContextEvent]], None]
    ) -> RedriveSummary:
        by_memory: dict[MemoryKey, list[Letter]] = {}
        for letter in letters:
            event = letter[0]
            by_memory.setdefault(MemoryKey(event.organization_id, event.user_id), []).append(letter)
        summary = RedriveSummary()
        for key, mine in by_memory.items():
            with self._memory.memory_lock(key) as held:
                cutoffs = self._memory.forgotten_before(self._subjects(key))
                kept = [event for event, headers in mine if not _before(headers, cutoffs)]
                if len(kept) < len(mine):
                    log.info("not redriven: %d event(s) of an erased memory", len(mine) - len(kept))
                # Read under the lock, as the cut-offs: a fact erasure holds it too.
                redacted = self._memory.erased_events(key, [e.event_id for e in kept])
                if redacted:
                    log.info("not redriven: %d event(s) a fact erasure redacted", len(redacted))
                    kept = [event for event in kept if event.event_id not in redacted]
                if kept:
                    # Its session dropped since the reads, the lock is another's: an erasure's
                    # cut-offs may have moved past where these would land.
                    held.check()
                    publish(kept)
            summary += RedriveSummary(len(kept), len(mine) - len(kept))
        return summary


def _before(headers: dict[str, bytes], cutoffs: dict[tuple[str, int], int]) -> bool:
    source = (headers[HEADER_TOPIC].decode(), int(headers[HEADER_PARTITION]))
    return int(headers[HEADER_OFFSET]) < cutoffs.get(source, -1)


def _event(value: bytes, headers: dict[str, bytes]) -> ContextEvent | None:
    try:
        return ContextEvent.from_bytes(value)
    except ValueError as e:  # pydantic's ValidationError is one
        where = "/".join(
            headers.get(h, b"?").decode() for h in (HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET)
        )
        log.warning(
            "not redriven, left on the dead-letter topic: the letter of %s no longer validates: %s",
            where,
            str(e)[:500],
        )
        return None


def redrive(
    settings: Settings,
    stages: Sequence[str] | None = None,
    idle_s: float = 3.0,
    join_timeout_s: float = 60.0,
) -> RedriveSummary:
    """Republish the redrivable dead letters not redriven yet; says how many, and how many
    an erasure settled instead."""
    with wiring.core(settings) as c:
        letters = ForgottenLetters(c.memory, c.subjects)
        return _redrive(settings, letters, stages, idle_s, join_timeout_s)


def _redrive(
    settings: Settings,
    letters: ForgottenLetters,
    stages: Sequence[str] | None,
    idle_s: float,
    join_timeout_s: float,
) -> RedriveSummary:
    unknown = set(stages or ()) - set(REDRIVABLE)
    if unknown:
        raise RedriveError(f"not a redrivable stage: {', '.join(sorted(unknown))}")
    wanted = [s for s in REDRIVABLE if stages is None or s in stages]
    summary = RedriveSummary()
    for stage in wanted:
        summary += _redrive_stage(settings, letters, stage, idle_s, join_timeout_s)
    return summary


def _redrive_stage(
    settings: Settings,
    letters: ForgottenLetters,
    stage: str,
    idle_s: float,
    join_timeout_s: float,
) -> RedriveSummary:
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
    summary = RedriveSummary()
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
            found: list[Letter] = []
            positions = {}
            for ktp, records in batches.items():
                for record in records:
                    headers = dict(record.headers or [])
                    if headers.get(HEADER_STAGE, b"").decode() == stage and record.value:
                        event = _event(record.value, headers)
                        if event is not None:
                            found.append((event, headers))
                positions[from_kafka(ktp)] = records[-1].offset + 1
            summary += letters.republish(found, pub.publish)
            commit(consumer, positions)
    finally:
        pub.close()
        consumer.close()
    return summary
