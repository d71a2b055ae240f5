"""The ids a consumer's log line carries as fields (logs are JSON; see memoryd.ops.logs).

Ids go in `extra=`, never into the message, so a log pipeline can select one user's, one
event's or one partition's lines without parsing prose.
"""

from __future__ import annotations

from consumers.batching import Batch
from consumers.dead_letter import DeadLetter

PROCESSOR = "processor"


def batch_fields(batch: Batch) -> dict[str, object]:
    first = batch.items[0].event
    return {
        "user_id": batch.user_id,
        "organization_id": first.organization_id,
        "event_id": str(first.event_id),
        "consumer": PROCESSOR,
    }


def letter_fields(letter: DeadLetter, consumer: str = PROCESSOR) -> dict[str, object]:
    return {
        "consumer": consumer,
        "stage": letter.stage,
        "partition": letter.partition,
        "offset": letter.offset,
    }
