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
from consumers.kafka_client import ConsumerSettings, commit, from_kafka, make_consumer
from memoryd import wiring
from memoryd.settings import Settings
from producers.contract import ContextEvent

REDRIVABLE = ("consolidate", "budget")
REDRIVE_GROUP = "memoryd-redrive"


def redrive(settings: Settings, stages: Sequence[str] | None = None, idle_s: float = 3.0) -> int:
    wanted = set(stages or REDRIVABLE)
    k = settings.kafka
    consumer = make_consumer(
        ConsumerSettings(k.bootstrap_servers, k.dead_letter_topic, REDRIVE_GROUP, "memoryd-redrive")
    )
    pub = wiring.publisher(settings)
    moved = 0
    try:
        consumer.subscribe([k.dead_letter_topic])
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < idle_s or not consumer.assignment():
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
