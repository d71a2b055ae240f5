"""The ids a consumer's log line carries as fields (logs are JSON; see memoryd.ops.logs).

Ids go in `extra=`, never into the message, so a log pipeline can select one user's, one
event's or one partition's lines without parsing prose.
"""

from __future__ import annotations

from consumers.batching import Batch
from consumers.dead_letter import DeadLetter
from domain.ids import MemoryKey

PROCESSOR = "processor"


def key_fields(key: MemoryKey) -> dict[str, object]:
    return {"organization_id": key.organization_id, "user_id": key.user_id, "consumer": PROCESSOR}


def batch_fields(batch: Batch) -> dict[str, object]:
    """The memory, and the batch's first event (none when all were forgotten meanwhile)."""
    first = str(batch.items[0].event.event_id) if batch.items else None
    return {**key_fields(batch.key), "event_id": first}


def letter_fields(letter: DeadLetter, consumer: str = PROCESSOR) -> dict[str, object]:
    return {
        "consumer": consumer,
        "stage": letter.stage,
        "partition": letter.partition,
        "offset": letter.offset,
    }
