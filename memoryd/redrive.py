"""`memoryd redrive`: dead-lettered events back onto the event topic, once each.

Only records that were valid events are redriven (stages `consolidate` and `budget`); records
that never decoded stay on the dead-letter topic for a human. Offsets on the dead-letter topic
are committed after the republish is acknowledged, and the events keep their ids, so a
redrive that is interrupted and run again cannot double anything downstream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from consumers.dead_letter import HEADER_STAGE
from consumers.kafka_client import (
    ConsumerSettings,
    commit,
    from_kafka,
    make_consumer,
    subscribe,
)
from memoryd import wiring
from memoryd.settings import Settings
from producers.contract import ContextEvent

REDRIVABLE = ("consolidate", "budget")


class RedriveError(RuntimeError):
    """The dead-letter topic could not be read (no partitions assigned in time)."""


def redrive_group(settings: Settings) -> str:
    """The redrive's consumer group, derived from the processor's: one per deployment, so
    deployments sharing a cluster never share (or rebalance) each other's redrive progress."""
    return f"{settings.kafka.processor_group}-redrive"


def redrive(
    settings: Settings,
    stages: Sequence[str] | None = None,
    idle_s: float = 3.0,
    join_timeout_s: float = 60.0,
) -> int:
    """Republish the redrivable dead letters not redriven yet; returns how many."""
    wanted = set(stages or REDRIVABLE)
    k = settings.kafka
    consumer = make_consumer(
        ConsumerSettings(
            k.bootstrap_servers, k.dead_letter_topic, redrive_group(settings), "memoryd-redrive"
        )
    )
    pub = wiring.publisher(settings)
    moved = 0
    try:
        subscribe(consumer, k.dead_letter_topic)
        started = quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < idle_s or not consumer.assignment():
            if not consumer.assignment() and time.monotonic() - started > join_timeout_s:
                raise RedriveError(f"no partition of {k.dead_letter_topic} assigned")
            batches = consumer.poll(timeout_ms=500)
            if not batches:
                continue
            quiet_since = time.monotonic()
            events: list[ContextEvent] = []
            positions = {}
            for ktp, records in batches.items():
                for record in records:
                    stage = dict(record.headers or []).get(HEADER_STAGE, b"").decode()
                    if stage in wanted and record.value is not None:
                        events.append(ContextEvent.from_bytes(record.value))
                positions[from_kafka(ktp)] = records[-1].offset + 1
            pub.publish(events)
            commit(consumer, positions)
            moved += len(events)
    finally:
        pub.close()
        consumer.close()
    return moved
